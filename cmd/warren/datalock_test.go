package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"
)

// A second node on a data directory in use is refused before it makes its
// driver (a microvm or container driver destroys what an earlier run left
// there, which was the first node's live sandboxes), naming the holder;
// once the first lets go, the directory is the next node's.
func TestNodeRefusesADataDirectoryInUse(t *testing.T) {
	data := t.TempDir()
	flags := func(id string) *nodeFlags {
		var f nodeFlags
		fs := flag.NewFlagSet("node", flag.ContinueOnError)
		f.register(fs)
		if err := fs.Parse([]string{"--id", id, "--data", data, "--servers", "http://127.0.0.1:7480", "--gossip", "127.0.0.1:0", "--driver", "sim"}); err != nil {
			t.Fatal(err)
		}
		return &f
	}
	first := flags("n1")
	cfg, err := first.config()
	if err != nil {
		t.Fatal(err)
	}
	defer cfg.Driver.Close()
	defer first.unlock()
	second := flags("n2")
	cfg2, err := second.config()
	want := fmt.Sprintf("data: %s is in use by another warren node (process %d)", data, os.Getpid())
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("a second node on the directory: %v, want %q", err, want)
	}
	cfg2.Driver.Close() // what the callers do on an error
	second.unlock()
	first.unlock()
	third := flags("n3")
	cfg3, err := third.config()
	if err != nil {
		t.Fatalf("after the first let go: %v", err)
	}
	cfg3.Driver.Close()
	third.unlock()

	// The command says it too, before any driver is made.
	lock, err := lockData(data)
	if err != nil {
		t.Fatal(err)
	}
	defer lock()
	var out, errb bytes.Buffer
	err = run([]string{"node", "--id", "n4", "--data", data, "--servers", "http://127.0.0.1:1", "--gossip", "127.0.0.1:0", "--driver", "sim"}, &out, &errb)
	if err == nil || !strings.Contains(err.Error(), "is in use by another warren node") {
		t.Fatalf("warren node on a directory in use: %v", err)
	}
}
