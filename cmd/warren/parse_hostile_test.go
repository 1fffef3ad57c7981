package main

import (
	"bytes"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A price that is not a number is refused, as a negative one is: a NaN
// price makes every call's cost int64(NaN) (math.MinInt64 on amd64), and
// the task's spend negative.
func TestParsePricesRefusesNaN(t *testing.T) {
	p, err := parsePrices("m=NaN/0/0/0")
	if err == nil {
		t.Errorf("model-prices m=NaN/0/0/0 accepted: %+v (input price NaN: %v)", p["m"], math.IsNaN(p["m"].Input))
	}
}

func FuzzCLIParsers(f *testing.F) {
	f.Add("a=1,b=2")
	f.Add("m=1/2/3/4")
	f.Add("512MiB")
	f.Fuzz(func(t *testing.T, s string) {
		_, _ = parseKV("x", s)
		_, _ = parseEnv(s)
		_, _ = parseLabels(s)
		_, _ = parseTPM(s)
		if n, err := parseSize(s); err == nil && (n < 1 || n > 1<<60) {
			t.Fatalf("parseSize(%q) = %d", s, n)
		}
		if ps, err := parsePrices(s); err == nil {
			for name, p := range ps {
				for _, x := range []float64{p.Input, p.CacheWrite, p.CacheRead, p.Output} {
					if !(x >= 0 && x <= 1e6) {
						t.Fatalf("parsePrices(%q): %s has price %v", s, name, x)
					}
				}
			}
		}
		_, _ = parseNodeAddrs(s)
	})
}

// A --body-file that is not UTF-8 (a Latin-1 text) is refused naming the
// flag; it was sent as is before, and the request failed to marshal with
// protobuf's "invalid UTF-8", which names neither the flag nor the file.
func TestBodyFileNotUTF8Refused(t *testing.T) {
	f := filepath.Join(t.TempDir(), "body.txt")
	if err := os.WriteFile(f, []byte("caf\xe9 au lait\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	err := run([]string{"task", "create", "--repo", "https://git.example.com/a/b.git", "--base", "main", "--title", "t",
		"--body-file", f, "--server", "http://127.0.0.1:1"}, &out, &errb)
	if err == nil || !strings.Contains(err.Error(), "body-file") {
		t.Errorf("a non-UTF-8 --body-file: %v", err)
	}
}
