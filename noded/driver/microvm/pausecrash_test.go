package microvm

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/warrenhq/warren/guest"
	"github.com/warrenhq/warren/noded/driver"
)

// restartMidPause claims a sandbox, stops its guest as a pause does, runs
// cut (under vm.mu, as the pause would) to take the pause as far as the
// node got before it died, leaves the VM (Detach, as a node that dies
// does) and starts a driver on the same state directory, which re-adopts
// what it finds. It returns that driver and the sandbox's VM id.
func restartMidPause(t *testing.T, id string, before func(ctx context.Context, vm *VM), cut func(ctx context.Context, vm *VM)) (*Driver, string, context.Context) {
	t.Helper()
	state := t.TempDir()
	d1 := newDriverWith(t, state, func(c *Config) { c.StandbyQEMUs = -1 })
	ctx := ctxT(t, 10*time.Minute)
	sb, err := d1.Claim(ctx, driver.ClaimRequest{ID: id, TTL: time.Hour, Limits: driver.Limits{MemMB: 320}})
	if err != nil {
		d1.Close()
		t.Fatal(err)
	}
	vm := sb.(*VM)
	t.Cleanup(func() {
		for _, pid := range qemusNamed(vm.id) {
			adopt(pid).kill()
		}
	})
	if before != nil {
		before(ctx, vm)
	}
	vm.awaitBind() // as Pause does
	func() {
		vm.mu.Lock()
		defer vm.mu.Unlock()
		if _, err := vm.qmp.Run(ctx, "stop", nil); err != nil {
			t.Fatal(err)
		}
		cut(ctx, vm)
	}()
	d1.Detach()
	d2 := newDriverWith(t, state, func(c *Config) { c.StandbyQEMUs = -1 })
	t.Cleanup(func() { d2.Close() })
	return d2, vm.id, ctx
}

// migrationOf returns the status of vm's outgoing migration.
func migrationOf(t *testing.T, ctx context.Context, vm *VM) string {
	t.Helper()
	st, _, err := vm.qmp.Migration(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// A node that dies after a pause saved the guest, before it recorded the
// pause, leaves QEMU in "postmigrate" and a record saying running. The
// next start lets the guest run again. It used to send cont only from
// "paused", so the agent did not answer and the sandbox was destroyed.
func TestRestartAfterAPauseSavedButNotRecorded(t *testing.T) {
	d, vmID, ctx := restartMidPause(t, "sb-pausesaved", nil, func(ctx context.Context, vm *VM) {
		if err := saveState(ctx, vm.qmp, filepath.Join(vm.spec.Dir, "paused.state"), 0o600, false); err != nil {
			t.Fatal(err)
		}
	})
	sb, ok := d.Get("sb-pausesaved")
	if !ok {
		t.Fatal("the sandbox was not re-adopted")
	}
	vm := sb.(*VM)
	if st := vm.Info().State; st != "running" {
		t.Errorf("re-adopted as %q, want running", st)
	}
	if st, err := vm.qmp.Status(ctx); err != nil || st != "running" {
		t.Errorf("QEMU: %q (%v), want running", st, err)
	}
	if _, err := os.Stat(filepath.Join(d.vmDir(vmID), "paused.state")); !os.IsNotExist(err) {
		t.Errorf("the unrecorded pause's paused.state is left: %v", err)
	}
	if _, code := run(t, sb, "true"); code != 0 {
		t.Fatalf("true: exit %d", code)
	}
}

// A node that dies while a pause saves the guest leaves the migration
// under way and a record saying running. The next start cancels the
// migration and lets the guest run. It used to cont the guest with the
// migration still under way, whose end stopped it again
// ("postmigrate"), for good: the sandbox said running, and no call
// was answered.
func TestRestartWhileAPauseSaves(t *testing.T) {
	slow := func(ctx context.Context, vm *VM) {
		// 64 MiB of memory to save at 1 MiB/s: about a minute.
		if _, err := vm.Run(ctx, guest.ExecRequest{Argv: []string{"/bin/sh", "-c", "head -c 64M /dev/urandom > /dev/shm/x"}}, nil, nil); err != nil {
			t.Fatal(err)
		}
		if _, err := vm.qmp.Run(ctx, "migrate-set-parameters", map[string]any{"max-bandwidth": 1 << 20}); err != nil {
			t.Fatal(err)
		}
	}
	d, _, ctx := restartMidPause(t, "sb-pausesaving", slow, func(ctx context.Context, vm *VM) {
		// saveState's start, without its wait for the end.
		f, err := os.OpenFile(filepath.Join(vm.spec.Dir, "paused.state"), os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		err = vm.qmp.SendFD(ctx, "state", f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := vm.qmp.Run(ctx, "migrate", map[string]any{"uri": "fd:state"}); err != nil {
			t.Fatal(err)
		}
		if st := migrationOf(t, ctx, vm); !migrating(st) {
			t.Fatalf("the save is %q already", st)
		}
	})
	sb, ok := d.Get("sb-pausesaving")
	if !ok {
		t.Fatal("the sandbox was not re-adopted")
	}
	vm := sb.(*VM)
	// Let a migration still under way end at once.
	if _, err := vm.qmp.Run(ctx, "migrate-set-parameters", map[string]any{"max-bandwidth": 1 << 40}); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	mig := migrationOf(t, wctx, vm)
	for migrating(mig) {
		select {
		case <-wctx.Done():
			t.Fatalf("the migration is still %s", mig)
		case <-time.After(10 * time.Millisecond):
		}
		mig = migrationOf(t, wctx, vm)
	}
	if st, err := vm.qmp.Status(ctx); err != nil || st != "running" {
		t.Fatalf("after the migration's end (%s), QEMU is %q (%v), want running", mig, st, err)
	}
	if _, code := run(t, sb, "true"); code != 0 {
		t.Fatalf("true: exit %d", code)
	}
}

// A node that dies after a pause recorded "paused", before QEMU ended,
// leaves a QEMU with the saved guest. The next start ends it and keeps
// the sandbox paused, and it resumes.
func TestRestartAfterAPauseRecordedBeforeQEMUEnded(t *testing.T) {
	d, vmID, ctx := restartMidPause(t, "sb-pauserecorded", nil, func(ctx context.Context, vm *VM) {
		state := filepath.Join(vm.spec.Dir, "paused.state")
		if err := saveState(ctx, vm.qmp, state, 0o600, false); err != nil {
			t.Fatal(err)
		}
		fi, err := os.Stat(state)
		if err != nil {
			t.Fatal(err)
		}
		vm.pausedSize = fi.Size()
		vm.state = "paused"
		vm.saveLocked()
	})
	sb, ok := d.Get("sb-pauserecorded")
	if !ok {
		t.Fatal("the sandbox was not re-adopted")
	}
	if st := sb.(*VM).Info().State; st != "paused" {
		t.Errorf("re-adopted as %q, want paused", st)
	}
	if pids := qemusNamed(vmID); len(pids) != 0 {
		t.Errorf("the pause's QEMU %v still runs", pids)
	}
	if err := sb.(*VM).Resume(ctx); err != nil {
		t.Fatal(err)
	}
	if _, code := run(t, sb, "true"); code != 0 {
		t.Fatalf("true: exit %d", code)
	}
}
