package main

import (
	"flag"
	"io"
	"testing"
)

// Guests stop their tick while idle unless --tcg-tickless-idle=false (the
// field is the inverse, so warren dev, whose flag set lacks the flag, gets
// the same default from the zero value).
func TestTicklessIdleFlag(t *testing.T) {
	for _, c := range []struct {
		args     []string
		periodic bool
	}{{nil, false}, {[]string{"--tcg-tickless-idle"}, false}, {[]string{"--tcg-tickless-idle=true"}, false}, {[]string{"--tcg-tickless-idle=false"}, true}} {
		var f nodeFlags
		fs := flag.NewFlagSet("node", flag.ContinueOnError)
		f.register(fs)
		if err := fs.Parse(c.args); err != nil {
			t.Fatalf("%v: %v", c.args, err)
		}
		if f.tcgPeriodicTick != c.periodic {
			t.Errorf("%v: periodic tick %v, want %v", c.args, f.tcgPeriodicTick, c.periodic)
		}
	}
	fs := flag.NewFlagSet("node", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	new(nodeFlags).register(fs)
	if err := fs.Parse([]string{"--tcg-tickless-idle=sometimes"}); err == nil {
		t.Error("--tcg-tickless-idle=sometimes was accepted")
	}
}
