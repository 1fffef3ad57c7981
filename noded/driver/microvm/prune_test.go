package microvm

import (
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/warrenhq/warren/guest"
	"github.com/warrenhq/warren/internal/testenv"
)

// A snapshot replaced by one for other settings stays while a clone's
// overlay names its disk, and goes after; the blank overlays of a
// snapshot that is gone go too. The current snapshot always stays.
func TestPruneReplacedSnapshots(t *testing.T) {
	if _, err := exec.LookPath("qemu-img"); err != nil {
		testenv.Missing(t, "needs qemu-img (apt-get install qemu-utils)")
	}
	ctx := context.Background()
	state := t.TempDir()
	d := &Driver{cfg: Config{StateDir: state, SnapshotMemMB: 256}, accel: "tcg", log: slog.New(slog.DiscardHandler),
		templates: map[string]*tplState{}, blanks: blanks{dir: filepath.Join(state, "blanks")}}
	raw := filepath.Join(state, "rootfs.raw")
	if err := os.WriteFile(raw, make([]byte, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	snap := func(dirName, name, version string) string {
		dir := filepath.Join(state, "snapshots", dirName)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := createOverlay(ctx, raw, "raw", filepath.Join(dir, "disk.qcow2")); err != nil {
			t.Fatal(err)
		}
		b, _ := json.Marshal(snapMeta{Template: name, TemplateVersion: version, MemMB: 256, Accel: "tcg"})
		if err := os.WriteFile(filepath.Join(dir, "meta.json"), b, 0o644); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	old := snap("web-1-2-256m-tcg", "web", "1-2") // a name from before the settings' hash
	replaced := snap("web-1-2-256m-tcg-aaaaaaaaaaaa", "web", "1-2")
	current := snap("web-1-2-256m-tcg-bbbbbbbbbbbb", "web", "1-2")
	other := snap("other-v1-256m-tcg-cccccccccccc", "other", "v1") // another template's: not loaded, left alone
	// Another template whose directory shares the name's prefix (web-1@2
	// and web@1-2): not loaded, so left alone.
	lookalike := snap("web-1-2-256m-tcg-dddddddddddd", "web-1", "2")
	// The template's older version's snapshot, from before a rebuild: no
	// VM uses it, so it goes (nothing removed these before); and one a
	// paused clone still uses, which stays until the clone goes.
	older := snap("web-0-256m-tcg-eeeeeeeeeeee", "web", "0")
	olderUsed := snap("web-00-256m-tcg-ffffffffffff", "web", "00")
	d.templates["web"] = &tplState{t: &guest.Template{Manifest: guest.Manifest{Name: "web", Version: "1-2"}},
		snap: &snapshot{Dir: current}}
	// A paused clone of the old snapshot, and a blank of the replaced one.
	vmDisk := filepath.Join(state, "vms", "vm1", "disk.qcow2")
	if err := os.MkdirAll(filepath.Dir(vmDisk), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := createOverlay(ctx, filepath.Join(old, "disk.qcow2"), "qcow2", vmDisk); err != nil {
		t.Fatal(err)
	}
	vmDisk2 := filepath.Join(state, "vms", "vm2", "disk.qcow2")
	if err := os.MkdirAll(filepath.Dir(vmDisk2), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := createOverlay(ctx, filepath.Join(olderUsed, "disk.qcow2"), "qcow2", vmDisk2); err != nil {
		t.Fatal(err)
	}
	if b, err := backingFile(vmDisk); err != nil || b != filepath.Join(old, "disk.qcow2") {
		t.Fatalf("backingFile: %q, %v", b, err)
	}
	blank, err := d.blanks.blank(ctx, filepath.Join(replaced, "disk.qcow2"), "qcow2")
	if err != nil {
		t.Fatal(err)
	}
	exists := func(p string) bool { _, err := os.Stat(p); return err == nil }

	d.pruneSnapshots()
	if !exists(old) || !exists(current) || !exists(other) || !exists(lookalike) {
		t.Fatalf("removed a snapshot in use, the current one or another template's: old %v current %v other %v lookalike %v",
			exists(old), exists(current), exists(other), exists(lookalike))
	}
	if exists(replaced) || exists(blank) {
		t.Fatalf("kept the replaced snapshot no VM uses (%v) or its blank (%v)", exists(replaced), exists(blank))
	}
	if exists(older) || !exists(olderUsed) {
		t.Fatalf("an older version's snapshot: unused kept %v (want gone), used by a clone kept %v (want kept)", exists(older), exists(olderUsed))
	}
	if err := os.RemoveAll(filepath.Dir(vmDisk)); err != nil { // the clone destroyed
		t.Fatal(err)
	}
	d.pruneSnapshots()
	if exists(old) || !exists(current) {
		t.Fatalf("after the clone went: old %v, current %v", exists(old), exists(current))
	}
}

// A snapshot for other settings (here another QEMU version) goes into a
// directory of its own, never over the files of the one before.
func TestSnapshotDirPerSettings(t *testing.T) {
	d := &Driver{cfg: Config{StateDir: t.TempDir(), SnapshotMemMB: 256}, accel: "tcg", log: slog.New(slog.DiscardHandler)}
	tpl := &guest.Template{Manifest: guest.Manifest{Name: "default", Version: "v1"}}
	d.qver = "7.2.0"
	a := d.snapshotDir(tpl)
	if d.snapshotDir(tpl) != a {
		t.Fatal("snapshotDir is not stable")
	}
	d.qver = "8.0.0"
	b := d.snapshotDir(tpl)
	base := filepath.Join(d.cfg.StateDir, "snapshots", "default-v1-256m-tcg-")
	if a == b || !strings.HasPrefix(a, base) || !strings.HasPrefix(b, base) {
		t.Fatalf("snapshot dirs %s and %s", a, b)
	}
}

// An unfinished snapshot a node left when it stopped while making one
// (its memory file up to the snapshot's size) is removed; one being made
// now stays. Nothing removed them before.
func TestPruneRemovesUnfinishedSnapshots(t *testing.T) {
	state := t.TempDir()
	d := &Driver{cfg: Config{StateDir: state, SnapshotMemMB: 256}, accel: "tcg", log: slog.New(slog.DiscardHandler),
		templates: map[string]*tplState{}, blanks: blanks{dir: filepath.Join(state, "blanks")}}
	current := filepath.Join(state, "snapshots", "web-1-256m-tcg-aaaaaaaaaaaa")
	left := current + ".tmp-0123456789ab"
	making := filepath.Join(state, "snapshots", "web-1-256m-tcg-bbbbbbbbbbbb.tmp-ba9876543210")
	for _, dir := range []string{current, left, making} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "mem"), []byte("guest memory"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	d.templates["web"] = &tplState{t: &guest.Template{Manifest: guest.Manifest{Name: "web", Version: "1"}}, snap: &snapshot{Dir: current}}
	d.making = map[string]bool{making: true}
	d.pruneSnapshots()
	exists := func(p string) bool { _, err := os.Stat(p); return err == nil }
	if exists(left) || !exists(making) || !exists(current) {
		t.Errorf("left behind: %v (want gone), being made: %v, current: %v (want both kept)", exists(left), exists(making), exists(current))
	}
}
