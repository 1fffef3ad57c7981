package microvm

import (
	"testing"
	"time"

	"github.com/warrenhq/warren/noded/driver"
)

// A warm-claimed sandbox's record (written at the end of its claim) lets
// a node that restarts later re-adopt it, with its id, start, expiry and
// environment, as a restored one is (TestRestartReadoptsAndReaps).
func TestAWarmClaimIsReadoptedAfterARestart(t *testing.T) {
	state := t.TempDir()
	d1 := newDriver(t, state)
	ctx := snapshotted(t, d1, 5*time.Minute)
	d1.SetPoolTarget("default", 1)
	waitPool(t, d1, 1)
	sb, err := d1.Claim(ctx, driver.ClaimRequest{ID: "sb-warm-keep", TTL: time.Hour, Env: map[string]string{"MARK": "kept"}})
	if err != nil {
		d1.Close()
		t.Fatal(err)
	}
	before := sb.(driver.Interactive).Info()
	if before.Start != driver.StartWarm {
		d1.Close()
		t.Fatalf("start %q, want warm", before.Start)
	}
	if _, code := run(t, sb, "echo $MARK > /root/mark"); code != 0 {
		d1.Close()
		t.Fatal("write")
	}
	d1.Detach()

	d2 := newDriver(t, state)
	defer d2.Close()
	got, ok := d2.Get("sb-warm-keep")
	if !ok {
		t.Fatal("the warm-claimed sandbox was not re-adopted")
	}
	after := got.(driver.Interactive).Info()
	if after.Start != driver.StartWarm || !after.Expires.Equal(before.Expires) {
		t.Errorf("re-adopted with start %q, expiry %v; want warm, %v", after.Start, after.Expires, before.Expires)
	}
	if out, code := run(t, got, "cat /root/mark; echo $MARK"); code != 0 || out != "kept\nkept\n" {
		t.Fatalf("after re-adoption: exit %d %q", code, out)
	}
	got.Destroy()
	assertNothingLeft(t, d2)
}
