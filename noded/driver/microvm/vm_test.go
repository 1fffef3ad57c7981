package microvm

import (
	"slices"
	"testing"
)

// QEMU gets the node's PATH, home, temporary directory and locale, and
// none of its credentials.
func TestQEMUEnvLeavesOutCredentials(t *testing.T) {
	got := qemuEnv([]string{"PATH=/usr/bin", "HOME=/root", "WARREN_FORGE_TOKEN=s3cret", "ANTHROPIC_API_KEY=sk-x",
		"LC_ALL=C", "TMPDIR=/tmp", "OPENAI_API_KEY=sk-y", "PATHX=1"})
	want := []string{"PATH=/usr/bin", "HOME=/root", "LC_ALL=C", "TMPDIR=/tmp"}
	if !slices.Equal(got, want) {
		t.Errorf("qemuEnv: %q, want %q", got, want)
	}
}
