package microvm

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/warrenhq/warren/noded/driver"
)

// A sandbox's QEMU runs under its own system call filter: when it tries to
// start a process (what a guest that took QEMU over would do first), the
// kernel kills it instead. Asked over QMP to migrate to `exec:touch FILE`,
// QEMU used to run the shell and make the file; now it dies of SIGSYS,
// the file is never made, and the driver destroys the sandbox. The pause
// and resume tests cover the snapshot's state written through a file the
// node hands over instead of `exec:cat`.
func TestQEMUCannotStartAProcess(t *testing.T) {
	d := newDriver(t, "")
	defer d.Close()
	ctx := ctxT(t, 3*time.Minute)
	sb, err := d.Claim(ctx, driver.ClaimRequest{ID: "sb-spawn", Force: driver.StartBoot})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy()
	vm := sb.(*VM)
	vm.mu.Lock()
	q, pid := vm.qmp, vm.p.pid
	vm.mu.Unlock()
	status, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "status"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(status), "Seccomp:\t2") {
		t.Errorf("QEMU (pid %d) runs without a seccomp filter", pid)
	}
	marker := filepath.Join(t.TempDir(), "spawned")
	_, err = q.Run(ctx, "migrate", map[string]any{"uri": "exec:touch " + driver.ShellQuote(marker)})
	t.Logf("migrate to exec: %v", err)
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if _, err := os.Stat(marker); err == nil {
			t.Fatalf("QEMU started a process: %s exists", marker)
		}
		if sb.(driver.Interactive).Info().State == "destroyed" {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if st := sb.(driver.Interactive).Info().State; st != "destroyed" {
		t.Fatalf("QEMU tried to start a process and its sandbox is %q, want destroyed (QEMU killed)", st)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatalf("QEMU started a process: %s exists", marker)
	}
	sb.Destroy() // waits for the destroy under way
	assertGone(t, d, vm.id)
}
