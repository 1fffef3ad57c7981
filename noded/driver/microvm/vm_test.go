package microvm

import (
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
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

// An error's tail of the console reads only the file's end: the guest
// writes the console as much as it likes (tail read it whole, 64 MiB here,
// into the node's memory for 600 bytes).
func TestTailReadsOnlyTheEndOfTheConsole(t *testing.T) {
	f := filepath.Join(t.TempDir(), "console.log")
	if err := os.WriteFile(f, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(f, 64<<20); err != nil { // sparse
		t.Fatal(err)
	}
	fh, _ := os.OpenFile(f, os.O_WRONLY|os.O_APPEND, 0)
	fh.WriteString("\nthe last line\n")
	fh.Close()
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	got := tail(f)
	runtime.ReadMemStats(&m1)
	if a := m1.TotalAlloc - m0.TotalAlloc; a > 1<<20 {
		t.Errorf("tail of a 64 MiB console.log allocated %d KiB", a>>10)
	}
	if !strings.HasSuffix(got, "the last line") {
		t.Errorf("tail: %q", got)
	}
}

// The reaper empties a console log past maxConsoleBytes, and leaves a
// smaller one alone.
func TestTrimConsole(t *testing.T) {
	dir := t.TempDir()
	big, small := filepath.Join(dir, "big.log"), filepath.Join(dir, "small.log")
	os.WriteFile(big, nil, 0o644)
	os.Truncate(big, maxConsoleBytes+1)
	os.WriteFile(small, []byte("boot\n"), 0o644)
	trimConsole(big)
	trimConsole(small)
	if st, _ := os.Stat(big); st.Size() != 0 {
		t.Errorf("big console: %d bytes left", st.Size())
	}
	if b, _ := os.ReadFile(small); string(b) != "boot\n" {
		t.Errorf("small console: %q", b)
	}
}
