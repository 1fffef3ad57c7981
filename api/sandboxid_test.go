package api

import (
	"strings"
	"testing"
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
}
