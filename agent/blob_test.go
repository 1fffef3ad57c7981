package agent

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// blobPath is where DirBlobs keeps the blob ref names.
func blobPath(t *testing.T, d DirBlobs, ref string) string {
	t.Helper()
	h, ok := strings.CutPrefix(ref, "sha256:")
	if !ok || len(h) != 64 {
		t.Fatalf("bad ref %q", ref)
	}
	return filepath.Join(d.Dir, h[:2], h[2:])
}

func age(t *testing.T, p string, d time.Duration) {
	t.Helper()
	when := time.Now().Add(-d)
	if err := os.Chtimes(p, when, when); err != nil {
		t.Fatal(err)
	}
}

func mustPut(t *testing.T, d DirBlobs, data string) string {
	t.Helper()
	ref, err := d.Put([]byte(data))
	if err != nil {
		t.Fatal(err)
	}
	return ref
}

// A blob Put finds there already (a retried step, the same output again)
// gets a fresh mtime: Sweep keeps what a live task still writes.
func TestPutRefreshesAReusedBlob(t *testing.T) {
	d := DirBlobs{Dir: t.TempDir()}
	ref := mustPut(t, d, "output")
	p := blobPath(t, d, ref)
	age(t, p, 30*24*time.Hour)
	if again := mustPut(t, d, "output"); again != ref {
		t.Fatalf("%s, then %s", ref, again)
	}
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	if since := time.Since(fi.ModTime()); since > time.Hour {
		t.Errorf("the reused blob's mtime is %v old", since.Round(time.Second))
	}
}

// Sweep removes the blobs unused for longer than it is asked to keep them
// and the temporary files a crashed Put left, and keeps fresh blobs,
// reused ones, a Put's temporary file in progress and files it does not
// know.
func TestSweepRemovesOldBlobs(t *testing.T) {
	d := DirBlobs{Dir: t.TempDir()}
	const week = 7 * 24 * time.Hour
	old := mustPut(t, d, "old output")
	reused := mustPut(t, d, "reused output")
	fresh := mustPut(t, d, "fresh output")
	age(t, blobPath(t, d, old), week+time.Hour)
	age(t, blobPath(t, d, reused), week+time.Hour)
	mustPut(t, d, "reused output") // a task wrote it again
	age(t, blobPath(t, d, fresh), week-time.Hour)

	dir := filepath.Dir(blobPath(t, d, old))
	write := func(name, data string, d time.Duration) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
		age(t, p, d)
		return p
	}
	staleTmp := write(".tmp-123", "half a blob", 2*time.Hour)
	liveTmp := write(".tmp-456", "a blob being written", time.Minute)
	other := write("README", "not a blob", 30*24*time.Hour)

	removed, freed, err := d.Sweep(week, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if removed != 2 || freed != int64(len("old output")+len("half a blob")) {
		t.Errorf("removed %d files, %d bytes; want 2, %d", removed, freed, len("old output")+len("half a blob"))
	}
	if _, err := d.Get(old); err == nil {
		t.Error("the old blob is still there")
	}
	for _, ref := range []string{reused, fresh} {
		if _, err := d.Get(ref); err != nil {
			t.Errorf("a blob in use was swept: %v", err)
		}
	}
	for p, want := range map[string]bool{staleTmp: false, liveTmp: true, other: true} {
		if _, err := os.Stat(p); (err == nil) != want {
			t.Errorf("%s: there %v, want %v", filepath.Base(p), err == nil, want)
		}
	}
	// Once more: nothing left to remove.
	if removed, freed, err := d.Sweep(week, time.Now()); removed != 0 || freed != 0 || err != nil {
		t.Errorf("second sweep: %d, %d, %v", removed, freed, err)
	}
	// A node that never wrote a blob has nothing to sweep.
	if removed, _, err := (DirBlobs{Dir: filepath.Join(t.TempDir(), "none")}).Sweep(week, time.Now()); removed != 0 || err != nil {
		t.Errorf("no directory: %d, %v", removed, err)
	}
}
