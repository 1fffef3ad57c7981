package microvm

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/warrenhq/warren/internal/testenv"
)

// TestBlankOverlays: a copied blank is what qemu-img makes for the same
// backing file, a blank is made once per backing file, and a backing file
// replaced at the same path gets a new blank.
func TestBlankOverlays(t *testing.T) {
	if _, err := exec.LookPath("qemu-img"); err != nil {
		testenv.Missing(t, "needs qemu-img (apt-get install qemu-utils)")
	}
	ctx := context.Background()
	dir := t.TempDir()
	backing := filepath.Join(dir, "root.img")
	if err := os.WriteFile(backing, make([]byte, 8<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	b := &blanks{dir: filepath.Join(dir, "blanks")}
	if err := b.overlay(ctx, backing, "raw", filepath.Join(dir, "a.qcow2")); err != nil {
		t.Fatal(err)
	}
	if err := b.overlay(ctx, backing, "raw", filepath.Join(dir, "b.qcow2")); err != nil {
		t.Fatal(err)
	}
	if err := createOverlay(ctx, backing, "raw", filepath.Join(dir, "direct.qcow2")); err != nil {
		t.Fatal(err)
	}
	direct, _ := os.ReadFile(filepath.Join(dir, "direct.qcow2"))
	for _, f := range []string{"a.qcow2", "b.qcow2"} {
		got, _ := os.ReadFile(filepath.Join(dir, f))
		if !bytes.Equal(got, direct) {
			t.Errorf("%s differs from qemu-img's overlay (%d vs %d bytes)", f, len(got), len(direct))
		}
	}
	out, err := exec.Command("qemu-img", "info", "--output=json", filepath.Join(dir, "a.qcow2")).CombinedOutput()
	if err != nil || !bytes.Contains(out, []byte(backing)) {
		t.Fatalf("qemu-img info: %v %s", err, out)
	}
	ents, _ := os.ReadDir(b.dir)
	if len(ents) != 1 {
		t.Fatalf("%d blanks for one backing file", len(ents))
	}
	if err := b.overlay(ctx, backing, "raw", filepath.Join(dir, "a.qcow2")); err == nil {
		t.Error("an overlay was written over an existing file")
	}
	// The backing file made again (a new snapshot at the same path).
	later := time.Now().Add(time.Minute)
	if err := os.Chtimes(backing, later, later); err != nil {
		t.Fatal(err)
	}
	if err := b.overlay(ctx, backing, "raw", filepath.Join(dir, "c.qcow2")); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(b.dir); len(ents) != 2 {
		t.Fatalf("%d blanks after the backing file changed, want 2", len(ents))
	}
}
