package microvm

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/warrenhq/warren/guest"
	"github.com/warrenhq/warren/noded/driver"
)

// coldSandbox claims a sandbox that boots (not the snapshot's shape, so
// no snapshot is made) and is destroyed at the test's end.
func coldSandbox(t *testing.T, id string) (*Driver, *VM, context.Context) {
	t.Helper()
	d := newDriverWith(t, "", func(c *Config) { c.StandbyQEMUs = -1 })
	t.Cleanup(func() { d.Close() })
	ctx := ctxT(t, 10*time.Minute)
	sb, err := d.Claim(ctx, driver.ClaimRequest{ID: id, TTL: time.Hour, Limits: driver.Limits{MemMB: 320}})
	if err != nil {
		t.Fatal(err)
	}
	vm := sb.(*VM)
	t.Cleanup(func() {
		vm.Destroy()
		for _, pid := range qemusNamed(vm.id) {
			t.Errorf("QEMU %d of the destroyed sandbox still runs", pid)
			adopt(pid).kill()
		}
	})
	return d, vm, ctx
}

func runTrue(t *testing.T, vm *VM, ctx context.Context, when string) {
	t.Helper()
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if res, err := vm.Run(rctx, guest.ExecRequest{Argv: []string{"true"}}, nil, nil); err != nil || res.ExitCode != 0 {
		t.Fatalf("%s: true: %v (exit %d)", when, err, res.ExitCode)
	}
}

// A resume that fails before the guest runs (here its context is already
// cancelled) leaves the sandbox paused with no QEMU; the next resume
// brings it back with one. It used to leave that QEMU running, and the
// next resume started a second on the same disk.
func TestFailedResumeLeavesItPaused(t *testing.T) {
	_, vm, ctx := coldSandbox(t, "sb-resumefail")
	if err := vm.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := vm.Resume(cctx); err == nil {
		t.Fatal("a resume with a cancelled context succeeded")
	}
	if st := vm.Info().State; st != "paused" {
		t.Errorf("after the failed resume: %q, want paused", st)
	}
	if pids := qemusNamed(vm.id); len(pids) != 0 {
		t.Errorf("after the failed resume QEMU %v still runs", pids)
	}
	if err := vm.Resume(ctx); err != nil {
		t.Fatalf("second resume: %v", err)
	}
	if pids := qemusNamed(vm.id); len(pids) != 1 {
		t.Errorf("after the second resume: QEMUs %v, want one", pids)
	}
	runTrue(t, vm, ctx, "after the second resume")
}

// A pause whose caller gives up while the state is saved still ends
// consistently: paused with no QEMU (and it resumes), or running and
// answering. It used to leave the guest stopped while it said running.
func TestPauseCancelledMidSave(t *testing.T) {
	_, vm, ctx := coldSandbox(t, "sb-pausecancel")
	// Dirty memory, so the save takes a moment.
	if _, err := vm.Run(ctx, guest.ExecRequest{Argv: []string{"/bin/sh", "-c", "head -c 150000000 /dev/urandom > /dev/shm/x"}}, nil, nil); err != nil {
		t.Fatal(err)
	}
	pctx, cancel := context.WithCancel(ctx)
	state := filepath.Join(vm.spec.Dir, "paused.state")
	go func() {
		for pctx.Err() == nil {
			if _, err := os.Stat(state); err == nil {
				cancel() // the save has begun
				return
			}
			time.Sleep(200 * time.Microsecond)
		}
	}()
	err := vm.Pause(pctx)
	cancel()
	st := vm.Info().State
	t.Logf("pause: %v; now %s", err, st)
	switch {
	case err == nil && st == "paused":
		if pids := qemusNamed(vm.id); len(pids) != 0 {
			t.Errorf("paused, yet QEMU %v runs", pids)
		}
		if err := vm.Resume(ctx); err != nil {
			t.Fatalf("resume: %v", err)
		}
		runTrue(t, vm, ctx, "after the resume")
	case err != nil && st == "running":
		runTrue(t, vm, ctx, "after the failed pause")
	default:
		t.Fatalf("pause: %v, and the sandbox is %q", err, st)
	}
}

// Info does not wait for a pause or resume under way (a save or load
// takes seconds, and listing sandboxes must not hang behind it).
func TestInfoDuringPause(t *testing.T) {
	vm := &VM{d: &Driver{log: slog.New(slog.DiscardHandler)}, sandboxID: "sb-x", state: "running"}
	vm.mu.Lock() // as Pause holds it
	vm.setBusy("pausing")
	got := make(chan string, 1)
	go func() { got <- vm.Info().State }()
	select {
	case st := <-got:
		if st != "pausing" {
			t.Errorf("Info during a pause: %q", st)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Info waited for the pause")
	}
	vm.setBusy("")
	vm.mu.Unlock()
	if st := vm.Info().State; st != "running" {
		t.Errorf("Info after: %q", st)
	}
}

// A command that a pause or a destroy cuts off says so: the sandbox was
// paused (unavailable: resume it) or destroyed (not found) while it ran,
// not the channel's "guest: EOF".
func TestCallsCutOffByAPauseOrADestroySaySo(t *testing.T) {
	d := newDriver(t, "")
	defer d.Close()
	ctx := ctxT(t, 5*time.Minute)
	sb, err := d.Claim(ctx, driver.ClaimRequest{ID: "sb-cutoff"})
	if err != nil {
		t.Fatal(err)
	}
	ia := sb.(driver.Interactive)
	cutOff := func(what string, cut func() error, want error, says string) {
		t.Helper()
		done := make(chan error, 1)
		started := make(chan struct{}, 1)
		go func() {
			_, err := ia.Run(ctx, guest.ExecRequest{Argv: []string{"/bin/sh", "-c", "echo started; sleep 600"}}, signalWriter(started), io.Discard)
			done <- err
		}()
		select {
		case <-started:
		case err := <-done:
			t.Fatalf("%s: the command ended: %v", what, err)
		}
		if err := cut(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if err := <-done; !errors.Is(err, want) || !strings.Contains(err.Error(), says) {
			t.Fatalf("%s: the cut-off call: %v", what, err)
		}
	}
	cutOff("pause", func() error { return ia.Pause(ctx) }, driver.ErrUnavailable, "paused while the call ran")
	if err := ia.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	cutOff("destroy", sb.Destroy, driver.ErrNotFound, "destroyed while the call ran")
}

// signalWriter signals c (without blocking) at each write.
type signalWriter chan struct{}

func (w signalWriter) Write(p []byte) (int, error) {
	select {
	case w <- struct{}{}:
	default:
	}
	return len(p), nil
}

// A pause whose save outlasts its time (lifecycleWait) fails, and the
// guest runs again. The undo used to run under the pause's expired
// context, so neither migrate_cancel nor cont reached QEMU: the guest
// stayed frozen while the sandbox said running.
func TestPauseOutlastingItsTimeIsUndone(t *testing.T) {
	_, vm, ctx := coldSandbox(t, "sb-pauselong")
	was := lifecycleWait
	lifecycleWait = 3 * time.Second
	t.Cleanup(func() { lifecycleWait = was })
	// 64 MiB of memory to save at 1 MiB/s: about a minute.
	if _, err := vm.Run(ctx, guest.ExecRequest{Argv: []string{"/bin/sh", "-c", "head -c 64M /dev/urandom > /dev/shm/x"}}, nil, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := vm.qmp.Run(ctx, "migrate-set-parameters", map[string]any{"max-bandwidth": 1 << 20}); err != nil {
		t.Fatal(err)
	}
	err := vm.Pause(ctx)
	if err == nil {
		t.Fatal("a pause slower than its time succeeded")
	}
	t.Logf("pause: %v", err)
	if st := vm.Info().State; st != "running" {
		t.Fatalf("after the failed pause: %q, want running", st)
	}
	if _, err := os.Stat(filepath.Join(vm.spec.Dir, "paused.state")); !os.IsNotExist(err) {
		t.Errorf("paused.state left behind: %v", err)
	}
	runTrue(t, vm, ctx, "after the failed pause")
}

// A pause whose "paused" record cannot be written fails, and the guest
// runs on: recorded as running with no QEMU, the sandbox would have been
// destroyed by the start after a crash. Before, the failure was only
// logged and the pause went through.
func TestAPauseThatCannotBeRecordedFails(t *testing.T) {
	_, vm, ctx := coldSandbox(t, "sb-unrecorded")
	runTrue(t, vm, ctx, "before")
	// meta.json made a directory with an entry: replacing it fails.
	meta := filepath.Join(vm.spec.Dir, "meta.json")
	if err := os.Remove(meta); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(meta, "in-the-way"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := vm.Pause(ctx); err == nil {
		t.Fatal("a pause that could not be recorded succeeded")
	}
	if got := vm.Info().State; got != "running" {
		t.Fatalf("after the failed pause: state %q, want running", got)
	}
	if _, err := os.Stat(filepath.Join(vm.spec.Dir, "paused.state")); !os.IsNotExist(err) {
		t.Errorf("the failed pause's state file is left: %v", err)
	}
	runTrue(t, vm, ctx, "after the failed pause")
}
