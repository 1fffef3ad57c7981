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
