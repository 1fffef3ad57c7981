package atomicfile

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

func TestConcurrentWritersLeaveOneWholeFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "meta.json")
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := WriteFile(path, []byte(strings.Repeat(string(rune('a'+i)), 64<<10)), 0o640); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) != 64<<10 || strings.Count(string(b), string(b[0])) != len(b) {
		t.Fatalf("torn file: %d bytes, starting %q", len(b), b[:8])
	}
	if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o640 {
		t.Errorf("mode %v", fi.Mode())
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("temporary files left: %d entries", len(ents))
	}
	if err := WriteFile(filepath.Join(dir, "no", "such", "dir"), nil, 0o644); err == nil {
		t.Error("write into a missing directory succeeded")
	}
}

// syncRecorder replaces syncFile for a test and records each sync: the
// name synced and what path held at that moment.
type syncRecorder struct {
	path string
	mu   sync.Mutex
	log  []string
}

func recordSyncs(t *testing.T, path string) *syncRecorder {
	r := &syncRecorder{path: path}
	was := syncFile
	syncFile = func(f *os.File) error {
		b, err := os.ReadFile(r.path)
		held := string(b)
		if err != nil {
			held = "(none)"
		}
		r.mu.Lock()
		r.log = append(r.log, f.Name()+" with path holding "+held)
		r.mu.Unlock()
		return was(f)
	}
	t.Cleanup(func() { syncFile = was })
	return r
}

// WriteFile syncs the temporary file before the rename (so the name
// never points at data that is not on disk) and the directory after it
// (so the rename itself is on disk when WriteFile returns).
func TestWriteFileSyncsFileThenDirectory(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "meta.json")
	if err := os.WriteFile(path, []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := recordSyncs(t, path)
	if err := WriteFile(path, []byte("new"), 0o600); err != nil {
		t.Fatal(err)
	}
	if len(r.log) != 2 {
		t.Fatalf("syncs: %q, want the temporary file's, then the directory's", r.log)
	}
	if !strings.HasPrefix(r.log[0], filepath.Join(dir, ".meta.json.tmp-")) || !strings.HasSuffix(r.log[0], " with path holding old") {
		t.Errorf("first sync: %q, want the temporary file, before the rename", r.log[0])
	}
	if r.log[1] != dir+" with path holding new" {
		t.Errorf("second sync: %q, want the directory, after the rename", r.log[1])
	}
}

// Sync syncs a file another process wrote, then its directory; a failed
// sync is returned.
func TestSyncSyncsFileThenDirectory(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "paused.state")
	if err := os.WriteFile(path, []byte("state"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := recordSyncs(t, path)
	if err := Sync(path); err != nil {
		t.Fatal(err)
	}
	want := []string{path + " with path holding state", dir + " with path holding state"}
	if strings.Join(r.log, "\n") != strings.Join(want, "\n") {
		t.Errorf("syncs: %q, want %q", r.log, want)
	}
	if err := Sync(filepath.Join(dir, "missing")); err == nil {
		t.Error("Sync of a missing file succeeded")
	}
	was := syncFile
	syncFile = func(*os.File) error { return os.ErrInvalid }
	defer func() { syncFile = was }()
	if err := Sync(path); err == nil {
		t.Error("Sync hid a failed sync")
	}
	if err := WriteFile(path, nil, 0o600); err == nil {
		t.Error("WriteFile hid a failed sync")
	}
}

// Replace syncs nothing: it is for records a power loss may drop.
func TestReplaceSyncsNothing(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "meta.json")
	r := recordSyncs(t, path)
	if err := Replace(path, []byte("running"), 0o600); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(path); err != nil || string(b) != "running" {
		t.Fatalf("read back %q, %v", b, err)
	}
	if len(r.log) != 0 {
		t.Errorf("syncs: %q, want none", r.log)
	}
}
