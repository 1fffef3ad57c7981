package microvm

import (
	"testing"
	"time"

	"github.com/warrenhq/warren/noded/driver"
)

// strayQEMU starts a QEMU named for vm, as a resume's is, whose pid file
// is elsewhere: the QEMU of a resume whose node died before it wrote the
// VM's pid file.
func strayQEMU(t *testing.T, d *Driver, vm *VM) *proc {
	t.Helper()
	ts, err := d.template("")
	if err != nil {
		t.Fatal(err)
	}
	s := vmSpec{ID: vm.id, Dir: t.TempDir(), Kernel: ts.t.Path(ts.t.Kernel), Initramfs: ts.t.Path(ts.t.Initramfs),
		MemMB: 128, VCPUs: 1, Accel: d.accel, Cmdline: kernelCmdline("")}
	p, err := start(d.cfg.QEMU, s, nil, nil, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.kill)
	// Up, as a stray a crash left is: QEMU answers on its QMP socket.
	// Until then the process may still be the shell that execs QEMU, and
	// while the exec runs its command line reads empty: a destroy right
	// after start could miss it (red once in CI).
	q, err := DialQMP(ctxT(t, time.Minute), s.qmpPath())
	if err != nil {
		t.Fatal(err)
	}
	q.Close()
	return p
}

// assertEnded fails the test unless p has exited (within a bound: the
// end's kill waits for it, but its reaping is start's goroutine's).
func assertEnded(t *testing.T, p *proc, what string) {
	t.Helper()
	select {
	case <-p.exited:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: the stray QEMU still runs", what)
	}
}

// A node that dies during a resume, after QEMU started and before its pid
// was written, leaves a QEMU that the pid file does not name. The next
// start ends it, as it ends one the pid file names; it used to spare it
// (and so did the reaper, the sandbox being the driver's), and the next
// resume started a second QEMU on the sandbox's disk.
func TestRestartEndsAPausedSandboxsStrayQEMU(t *testing.T) {
	state := t.TempDir()
	d1 := newDriverWith(t, state, func(c *Config) { c.StandbyQEMUs = -1 })
	ctx := ctxT(t, 10*time.Minute)
	sb, err := d1.Claim(ctx, driver.ClaimRequest{ID: "sb-stray", TTL: time.Hour, Limits: driver.Limits{MemMB: 320}})
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
	if err := vm.Pause(ctx); err != nil {
		d1.Close()
		t.Fatal(err)
	}
	d1.Detach()
	p := strayQEMU(t, d1, vm)

	d2 := newDriverWith(t, state, func(c *Config) { c.StandbyQEMUs = -1 })
	defer d2.Close()
	assertEnded(t, p, "after the restart")
	got, ok := d2.Get("sb-stray")
	if !ok {
		t.Fatal("the paused sandbox was not re-adopted")
	}
	if err := got.(*VM).Resume(ctx); err != nil {
		t.Fatal(err)
	}
	if pids := qemusNamed(vm.id); len(pids) != 1 {
		t.Errorf("after the resume: QEMUs %v, want one", pids)
	}
	if _, code := run(t, got, "true"); code != 0 {
		t.Fatalf("true: exit %d", code)
	}
}

// Destroying a paused sandbox ends a QEMU named for it that its pid file
// does not name (see TestRestartEndsAPausedSandboxsStrayQEMU).
func TestDestroyEndsAPausedSandboxsStrayQEMU(t *testing.T) {
	d, vm, ctx := coldSandbox(t, "sb-straydestroy")
	if err := vm.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	p := strayQEMU(t, d, vm)
	vm.Destroy()
	assertEnded(t, p, "after the destroy")
}
