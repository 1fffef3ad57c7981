package microvm

import (
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// The reaper spares a VM being made while it scans: a VM tracked after
// the reaper took its owned set, but before it listed VM directories,
// had its directory removed (and its QEMU killed) mid-claim. No QEMU or
// root needed.
func TestReapSparesVMsMadeDuringItsScan(t *testing.T) {
	d := &Driver{cfg: Config{StateDir: t.TempDir()}, log: slog.New(slog.DiscardHandler), scope: "reaptest",
		live: map[string]*VM{}, known: map[string]bool{}, templates: map[string]*tplState{}}
	if err := os.MkdirAll(filepath.Join(d.cfg.StateDir, "vms"), 0o755); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			d.reap()
		}
	}()
	lost, n := 0, 0
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline) && lost == 0; n++ {
		id := d.newVMID()
		d.track(id, true) // as launchClone and boot do, before the directory
		dir := d.vmDir(id)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		_ = os.WriteFile(filepath.Join(dir, "disk.qcow2"), nil, 0o644)
		time.Sleep(2 * time.Millisecond) // the VM being made
		if _, err := os.Stat(filepath.Join(dir, "disk.qcow2")); err != nil {
			lost++
			t.Logf("VM %s, tracked as known, had its directory reaped while being made", id)
		}
		_ = os.RemoveAll(dir)
		d.track(id, false)
	}
	close(stop)
	<-done
	if lost > 0 {
		t.Errorf("the reaper removed the directory of %d of %d VMs that were tracked as known", lost, n)
	}
}
