package api

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestSandboxIDNamesItsNode(t *testing.T) {
	for _, node := range []string{"dev", "n-1", "a.b_c-d"} {
		id := NewSandboxID(node)
		got, err := SandboxNode(id)
		if err != nil || got != node {
			t.Fatalf("%s: node %q, %v; want %q", id, got, err, node)
		}
	}
	if a, b := NewSandboxID("n"), NewSandboxID("n"); a == b {
		t.Fatalf("two ids alike: %s", a)
	}
	for _, bad := range []string{"", "sb-", "not-an-id", "sb-0123456789", "sb-0123456789x", "xb-0123456789-n", strings.Repeat("z", 200)} {
		if _, err := SandboxNode(bad); err == nil || !strings.Contains(err.Error(), "not a sandbox id") {
			t.Errorf("%q: %v", bad, err)
		}
	}
	// The id in the error is cut at a character, not inside one (which
	// %q would show as the bytes left of it, "\xe2\x82").
	if _, err := SandboxNode("x" + strings.Repeat("€", 100)); err == nil || !utf8.ValidString(err.Error()) || strings.Contains(err.Error(), `\x`) {
		t.Errorf("a long id's error has a character cut in two: %v", err)
	}
}
