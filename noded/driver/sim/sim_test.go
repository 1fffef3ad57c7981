package sim

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/warrenhq/warren/noded/driver"
)

func TestSimulatedSandbox(t *testing.T) {
	d := New(Config{ExecLatency: time.Millisecond})
	ctx := context.Background()
	sb, err := d.Claim(ctx, driver.ClaimRequest{ID: "a"})
	if err != nil {
		t.Fatal(err)
	}
	if sb.Warm() {
		t.Fatal("claim without a pool target came back warm")
	}
	if _, err := d.Claim(ctx, driver.ClaimRequest{ID: "a"}); !errors.Is(err, driver.ErrExists) {
		t.Fatalf("duplicate sandbox id: %v, want ErrExists", err)
	}
	start := time.Now()
	res, err := sb.Exec(ctx, driver.ExecRequest{Command: "sleep 0.05"})
	if err != nil || res.ExitCode != 0 || !strings.HasPrefix(string(res.Output), "simulated: ") {
		t.Fatalf("exec: %+v %v", res, err)
	}
	if el := time.Since(start); el < 50*time.Millisecond {
		t.Fatalf("simulated sleep 0.05 took %v", el)
	}
	res, err = sb.Exec(ctx, driver.ExecRequest{Command: "sleep 10", Timeout: 10 * time.Millisecond})
	if err != nil || res.ExitCode != 124 {
		t.Fatalf("timeout: %+v %v", res, err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := sb.Exec(cctx, driver.ExecRequest{Command: "sleep 1"}); err == nil {
		t.Fatal("exec ignored a cancelled context")
	}
	d.SetPoolTarget("py", 2)
	w, err := d.Claim(ctx, driver.ClaimRequest{ID: "b", Template: "py"})
	if err != nil || !w.Warm() {
		t.Fatalf("claim with a pool target: warm=%v err=%v", w != nil && w.Warm(), err)
	}
	if d.Live() != 2 {
		t.Fatalf("%d live, want 2", d.Live())
	}
	_ = sb.Destroy()
	if _, err := sb.Exec(ctx, driver.ExecRequest{Command: "true"}); err == nil {
		t.Fatal("exec in a destroyed sandbox succeeded")
	}
	if d.Live() != 1 {
		t.Fatalf("%d live after destroy, want 1", d.Live())
	}
}
