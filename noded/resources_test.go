package noded_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
	"github.com/warrenhq/warren/noded/driver"
	"github.com/warrenhq/warren/noded/driver/sim"
)

// limitsSim is the simulated driver noting the limits each claim asked for.
type limitsSim struct {
	*sim.Driver
	mu     sync.Mutex
	limits map[string]driver.Limits
}

func (d *limitsSim) Claim(ctx context.Context, req driver.ClaimRequest) (driver.Sandbox, error) {
	d.mu.Lock()
	d.limits[req.ID] = req.Limits
	d.mu.Unlock()
	return d.Driver.Claim(ctx, req)
}

func (d *limitsSim) claimed() map[string]driver.Limits {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := map[string]driver.Limits{}
	for k, v := range d.limits {
		out[k] = v
	}
	return out
}

// A task's spec.resources are its sandbox's limits, not only what
// placement reserves for it: 1.5 cores become 2 vCPUs and 300 MiB
// (plus a byte) 301 MiB. A task that names none leaves the driver's
// defaults, which a warm claim gives. (Simulated driver: this is what the
// actor asks of it; the drivers' own tests hold them to the limits.)
func TestTaskResourcesAreItsSandboxLimits(t *testing.T) {
	c := startCluster(t, 1, 5*time.Second)
	drv := &limitsSim{Driver: sim.New(sim.Config{}), limits: map[string]driver.Limits{}}
	c.startNodeWith("a", drv)
	script := &warrenv1.Script{Steps: 1, StepMillis: 10}
	resp, err := c.cl.Tasks().CreateTask(context.Background(), connect.NewRequest(&warrenv1.CreateTaskRequest{
		RequestId: "req-sized", Spec: &warrenv1.TaskSpec{Repo: "https://example.com/r.git", Base: "main",
			IssueTitle: "sized", Driver: "sim", Script: script,
			Resources: &warrenv1.Resources{MilliCpu: 1500, MemoryBytes: 300<<20 + 1}}}))
	if err != nil {
		t.Fatal(err)
	}
	sized := resp.Msg.GetTask().GetId()
	plain := c.submit(1, script)[0]
	for _, id := range []string{sized, plain} {
		waitEnded(t, c, id)
	}
	got := drv.claimed()
	if len(got) != 2 {
		t.Fatalf("claims: %v, want one per task", got)
	}
	for id, l := range got {
		want := driver.Limits{}
		if strings.HasPrefix(id, sized+"-") {
			want = driver.Limits{VCPUs: 2, MemMB: 301}
		}
		if l != want {
			t.Errorf("sandbox %s claimed with %+v, want %+v", id, l, want)
		}
	}
}
