package microvm

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/warrenhq/warren/noded/driver"
)

// refillState reads the default template's refill counters.
func refillState(d *Driver) (fails int, retrying bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if ts := d.templates["default"]; ts != nil {
		return ts.refillFails, ts.refillRetrying
	}
	return 0, false
}

func waitRefill(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("timed out waiting for %s", what)
}

// A failed warm-pool refill is tried again, with backoff, while the pool is
// short of its target, and no longer once the target is met or dropped;
// before, a failed restore left an idle node's pool short for good.
func TestFailedPoolRefillIsRetriedWhileShort(t *testing.T) {
	oldRetry, oldMax := refillRetry, refillRetryMax
	refillRetry, refillRetryMax = 50*time.Millisecond, 200*time.Millisecond
	defer func() { refillRetry, refillRetryMax = oldRetry, oldMax }()
	d := newDriverWith(t, "", func(c *Config) { c.StandbyQEMUs = -1 })
	defer d.Close()
	snapshotted(t, d, 5*time.Minute)

	// Break the VMs' directory: every restore fails at its mkdir.
	vms := filepath.Join(d.cfg.StateDir, "vms")
	if err := os.RemoveAll(vms); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(vms, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	d.SetPoolTarget("default", 1)
	// Nothing but the retries starts refills now.
	waitRefill(t, "three failed refills", func() bool { n, _ := refillState(d); return n >= 3 })

	// Target 0: the waiting retry finds the pool full and schedules none.
	d.SetPoolTarget("default", 0)
	waitRefill(t, "no retry waiting", func() bool { _, r := refillState(d); return !r })
	n0, _ := refillState(d)
	time.Sleep(4 * refillRetryMax)
	if n, r := refillState(d); n != n0 || r {
		t.Fatalf("refills went on with target 0: %d failures (was %d), retry waiting %v", n, n0, r)
	}

	// Short again and still failing; then the cause goes away.
	d.SetPoolTarget("default", 1)
	waitRefill(t, "another failed refill", func() bool { n, _ := refillState(d); return n > n0 })
	if err := os.Remove(vms); err != nil {
		t.Fatal(err)
	}
	waitPool(t, d, 1)
	if n, _ := refillState(d); n != 0 {
		t.Fatalf("%d refill failures counted after the pool filled, want 0", n)
	}
	d.SetPoolTarget("default", 0)
	assertNothingLeft(t, d)
}

// A claim that fails after it took the pool's warm sandbox (here: its
// QEMU is gone, so it does not resume and is destroyed, and no restore or
// boot can make another while the VMs' directory is broken) refills the
// pool, as a claim that succeeds does. Only the success path refilled, so
// each such failure left an idle node's pool one short until the next
// claim succeeded.
func TestAFailedClaimRefillsThePool(t *testing.T) {
	d := newDriverWith(t, "", func(c *Config) { c.StandbyQEMUs = -1 })
	defer d.Close()
	ctx := snapshotted(t, d, 5*time.Minute)
	d.SetPoolTarget("default", 1)
	waitPool(t, d, 1)
	d.mu.Lock()
	warm := d.templates["default"].pool[0]
	d.mu.Unlock()
	warm.p.kill()
	vms := filepath.Join(d.cfg.StateDir, "vms")
	aside := vms + ".aside"
	if err := os.Rename(vms, aside); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(vms, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if sb, err := d.Claim(ctx, driver.ClaimRequest{ID: "sb-failed"}); err == nil {
		sb.Destroy()
		t.Fatal("a claim with no QEMU to resume and no VM directory to make succeeded")
	}
	if err := os.Remove(vms); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(aside, vms); err != nil {
		t.Fatal(err)
	}
	// The destroyed VM's directory was aside when its destroy removed it.
	if err := os.RemoveAll(filepath.Join(vms, warm.id)); err != nil {
		t.Fatal(err)
	}
	waitPool(t, d, 1)
	d.SetPoolTarget("default", 0)
	assertNothingLeft(t, d)
}
