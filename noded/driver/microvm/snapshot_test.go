package microvm

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warrenhq/warren/guest"
)

// A snapshot made with other settings lives in another directory (its
// name hashes them), so after a QEMU upgrade the node finds no snapshot
// in the new one: the reason it logs for booting cold names what changed,
// read from the last snapshot of the template's version.
func TestSnapshotMismatchSaysWhy(t *testing.T) {
	state := t.TempDir()
	tpl := &guest.Template{Dir: t.TempDir(), Manifest: guest.Manifest{Name: "default", Version: "v1",
		Kernel: guest.Artifact{File: "vmlinux", SHA256: "k"}}}
	d := &Driver{cfg: Config{StateDir: state, SnapshotMemMB: 512}, accel: "tcg", qver: "7.2.0"}
	if _, err := d.loadSnapshot(tpl); err == nil || err.Error() != "no snapshot of default@v1 yet" {
		t.Fatalf("no snapshot at all: %v", err)
	}
	old := d.snapshotDir(tpl)
	os.MkdirAll(old, 0o755)
	m := d.wantMeta(tpl)
	m.Created, m.TookMS = "2025-01-01T00:00:00Z", 1234
	b, _ := json.Marshal(m)
	os.WriteFile(filepath.Join(old, "meta.json"), b, 0o644)
	for _, f := range []string{"mem", "state", "disk.qcow2"} {
		os.WriteFile(filepath.Join(old, f), nil, 0o644)
	}
	// Another template whose directory names share the prefix.
	other := filepath.Join(state, "snapshots", "default-v1-x-512m-tcg-0123456789ab")
	os.MkdirAll(other, 0o755)
	os.WriteFile(filepath.Join(other, "meta.json"), []byte(`{"template":"default-v1-x","template_version":"2","qemu_version":"6.0"}`), 0o644)
	if _, err := d.loadSnapshot(tpl); err != nil {
		t.Fatalf("the snapshot just made: %v", err)
	}
	d.qver = "8.0.0" // QEMU upgraded
	_, err := d.loadSnapshot(tpl)
	want := `no snapshot of default@v1 for this node's settings yet: the last one was made with qemu_version "7.2.0", this node has "8.0.0"`
	if err == nil || err.Error() != want {
		t.Errorf("after a QEMU upgrade: %v\nwant %s", err, want)
	}
}

func TestMetaDiffNamesTheChangedSettings(t *testing.T) {
	has := snapMeta{Template: "default", TemplateVersion: "v1", QEMUVersion: "7.2.0", MemMB: 256, CPU: "max", NIC: true,
		Created: "then", TookMS: 9, AgentWire: true}
	want := has
	if d := metaDiff(has, want); d != "" {
		t.Errorf("the same settings: %q", d)
	}
	want.Created, want.TookMS, want.AgentWire = "now", 1, false
	if d := metaDiff(has, want); d != "" {
		t.Errorf("only what a snapshot records of its making differs: %q", d)
	}
	want.MemMB, want.CPU = 512, ""
	if d, w := metaDiff(has, want), `cpu "max", this node has ""; mem_mb "256", this node has "512"`; d != w {
		t.Errorf("metaDiff = %q, want %q", d, w)
	}
	if strings.Contains(metaDiff(has, want), "created") {
		t.Error("metaDiff names created")
	}
}

// A template's snapshot is durable before it is named: its memory file,
// disk and state are synced while it is still in its temporary directory
// (every clone restores it, so a power loss must not leave a named
// snapshot that lost writes), and its name after the rename.
func TestSnapshotIsSyncedBeforeItIsNamed(t *testing.T) {
	d := newDriver(t, "")
	defer d.Close()
	tpl, err := d.template("")
	if err != nil {
		t.Fatal(err)
	}
	final := d.snapshotDir(tpl.t)
	var mu sync.Mutex
	var syncs []string
	was := durable
	durable = func(path string) error {
		_, err := os.Stat(final)
		mu.Lock()
		syncs = append(syncs, fmt.Sprintf("%s (named: %v)", filepath.Base(path), err == nil))
		mu.Unlock()
		return was(path)
	}
	defer func() { durable = was }()
	snapshotted(t, d, 5*time.Minute)
	want := []string{"state (named: false)", "mem (named: false)", "disk.qcow2 (named: false)", filepath.Base(final) + " (named: true)"}
	if strings.Join(syncs, "\n") != strings.Join(want, "\n") {
		t.Errorf("syncs of the snapshot:\n%s\nwant:\n%s", strings.Join(syncs, "\n"), strings.Join(want, "\n"))
	}
}

// A template whose root file system changed in place since its snapshot
// was made (same size) is not restored onto: the snapshot's memory holds
// the guest's view of the old disk. The reason names the file system.
// Before, only sizes were checked, and the snapshot was used.
func TestARootfsChangedInPlaceVoidsTheSnapshot(t *testing.T) {
	state := t.TempDir()
	tpl := &guest.Template{Dir: t.TempDir(), Manifest: guest.Manifest{Name: "default", Version: "v1",
		Kernel: guest.Artifact{File: "vmlinux", SHA256: "k"}, Rootfs: guest.Artifact{File: "rootfs.ext4", Size: 4096}}}
	rootfs := tpl.Path(tpl.Rootfs)
	if err := os.WriteFile(rootfs, make([]byte, 4096), 0o644); err != nil {
		t.Fatal(err)
	}
	d := &Driver{cfg: Config{StateDir: state, SnapshotMemMB: 512}, accel: "tcg", qver: "7.2.0"}
	dir := d.snapshotDir(tpl)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(d.wantMeta(tpl))
	for f, data := range map[string][]byte{"meta.json": b, "mem": nil, "state": nil, "disk.qcow2": nil} {
		if err := os.WriteFile(filepath.Join(dir, f), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := d.loadSnapshot(tpl); err != nil {
		t.Fatalf("the snapshot just made: %v", err)
	}
	// Changed in place, its size kept.
	f, err := os.OpenFile(rootfs, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("changed"), 1024); err != nil {
		t.Fatal(err)
	}
	f.Close()
	_, err = d.loadSnapshot(tpl)
	if err == nil || !strings.Contains(err.Error(), "rootfs") {
		t.Fatalf("after the root file system changed in place: %v, want a refusal naming the rootfs", err)
	}
}
