package microvm

import (
	"context"
	"errors"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/warrenhq/warren/guest"
	"github.com/warrenhq/warren/noded/driver"
)

// Close ends a claim under way and waits for it, so no QEMU of the driver
// runs once Close has returned. Before, Close returned at once and the
// claim's cold boot went on, its QEMU destroyed (or left behind, if the
// node process exited first) only when the claim finished.
func TestCloseEndsAClaimUnderWay(t *testing.T) {
	d := newDriverWith(t, "", func(c *Config) { c.StandbyQEMUs = -1 })
	defer d.Close()
	done := make(chan error, 1)
	go func() {
		sb, err := d.Claim(context.Background(), driver.ClaimRequest{ID: "sb-closing", Force: driver.StartBoot})
		if err == nil {
			sb.Destroy()
		}
		done <- err
	}()
	// Wait until the boot's QEMU runs: the claim is well under way.
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(10 * time.Millisecond) {
		if ours(d) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no QEMU started within a minute of the claim")
		}
	}
	start := time.Now()
	d.Close()
	took := time.Since(start)
	if n := ours(d); n > 0 {
		t.Fatalf("%d QEMU processes of the driver still run after Close returned (it took %v)", n, took)
	}
	select {
	case err := <-done:
		if !errors.Is(err, driver.ErrUnavailable) {
			t.Fatalf("claim ended by Close: err %v, want ErrUnavailable", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("claim had not returned 10 s after Close")
	}
	assertNothingLeft(t, d)
}

// A claim whose context has ended fails at once and leaves the warm pool
// as it was. Before, the pool member's resume failed on the ended
// context, so it was destroyed, and a restore and a cold boot were tried
// (and failed the same way) before the claim gave up.
func TestAClaimWithAnEndedContextTakesNoPoolMember(t *testing.T) {
	d := newDriverWith(t, "", func(c *Config) { c.StandbyQEMUs = -1 })
	defer d.Close()
	snapshotted(t, d, 5*time.Minute)
	d.SetPoolTarget("default", 1)
	waitPool(t, d, 1)
	before := poolIDs(d)

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := d.Claim(ctx, driver.ClaimRequest{ID: "sb-late"})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("claim with an ended context: err %v, want context.Canceled", err)
	}
	if after := poolIDs(d); strings.Join(after, ",") != strings.Join(before, ",") {
		t.Fatalf("pool members %v after the claim, want %v unchanged", after, before)
	}
	if _, ok := d.Get("sb-late"); ok {
		t.Fatal("the refused claim's sandbox exists")
	}
	d.SetPoolTarget("default", 0)
	assertNothingLeft(t, d)
}

// ours counts the running QEMU processes of d.
func ours(d *Driver) int {
	n := 0
	for id := range ourQEMUs() {
		if strings.HasPrefix(id, d.scope+"-") {
			n++
		}
	}
	return n
}

// poolIDs lists the default template's warm pool members.
func poolIDs(d *Driver) []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	var ids []string
	if ts := d.templates["default"]; ts != nil {
		for _, vm := range ts.pool {
			ids = append(ids, vm.id)
		}
	}
	return ids
}

// A claimed sandbox whose QEMU ends on its own (a guest that powers off
// or panics, the OOM killer) is destroyed: it leaves the list and calls
// to it get not_found. Before, it stayed "running" until its TTL, every
// call failing as an internal error.
func TestASandboxWhoseQEMUExitsIsDestroyed(t *testing.T) {
	d := newDriverWith(t, "", func(c *Config) { c.StandbyQEMUs = -1 })
	defer d.Close()
	ctx := snapshotted(t, d, 5*time.Minute)
	sb, err := d.Claim(ctx, driver.ClaimRequest{ID: "sb-qemu-exits"})
	if err != nil {
		t.Fatal(err)
	}
	if _, code := run(t, sb, "true"); code != 0 { // the claim's bind is done
		t.Fatalf("true: exit %d", code)
	}
	vm := sb.(*VM)
	vm.mu.Lock()
	pid := vm.p.pid
	vm.mu.Unlock()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if _, ok := d.Get("sb-qemu-exits"); !ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the sandbox is still listed 30 s after its QEMU died: %+v", vm.Info())
		}
	}
	_, err = sb.(driver.Interactive).Run(ctx, guest.ExecRequest{Argv: []string{"true"}}, nil, nil)
	if !errors.Is(err, driver.ErrNotFound) {
		t.Fatalf("a call to the sandbox whose QEMU died: %v, want not found", err)
	}
	assertNothingLeft(t, d)
}
