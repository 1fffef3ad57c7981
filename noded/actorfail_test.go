package noded_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
	"github.com/warrenhq/warren/noded"
	"github.com/warrenhq/warren/noded/driver"
	"github.com/warrenhq/warren/noded/driver/sim"
)

// panicDriver wraps the sim driver (simulated sandboxes): its sandboxes'
// Exec panics on the calls panicOn picks, and every Exec is counted.
type panicDriver struct {
	*sim.Driver
	mu      sync.Mutex
	calls   int
	panicOn func(call int) bool
}

func (d *panicDriver) Claim(ctx context.Context, req driver.ClaimRequest) (driver.Sandbox, error) {
	sb, err := d.Driver.Claim(ctx, req)
	if err != nil {
		return nil, err
	}
	return &panicSandbox{Sandbox: sb, d: d}, nil
}

func (d *panicDriver) execCalls() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.calls
}

type panicSandbox struct {
	driver.Sandbox
	d *panicDriver
}

func (s *panicSandbox) Exec(ctx context.Context, req driver.ExecRequest) (driver.ExecResult, error) {
	s.d.mu.Lock()
	s.d.calls++
	n := s.d.calls
	s.d.mu.Unlock()
	if s.d.panicOn(n) {
		panic("test: a panic in Exec")
	}
	return s.Sandbox.Exec(ctx, req)
}

// A task actor that panics once is restarted by its supervisor and goes
// on after the last step done. (The restarted actor was built from the
// StartTask's snapshot of the task, placed and not resumed, and ran every
// step again from 1.)
func TestActorRestartedAfterAPanicResumes(t *testing.T) {
	c := startCluster(t, 1, 0)
	drv := &panicDriver{Driver: sim.New(sim.Config{}), panicOn: func(n int) bool { return n == 3 }}
	c.startNodeWith("a", drv)
	ids := c.submit(1, &warrenv1.Script{Steps: 5, StepMillis: 10})
	waitFor(t, "task to succeed", 30*time.Second, c.allEnded(ids))
	checkLog(t, ids[0], c.events(ids[0]), 5)
	// 5 steps and the call that panicked (step 3, run again).
	if got := drv.execCalls(); got != 6 {
		t.Fatalf("Exec called %d times for 5 steps and one panic at step 3, want 6", got)
	}
}

// An actor that keeps panicking stops when its restart policy gives up;
// its task then fails, saying why, and leaves the node. (It stayed leased
// to the node, which went on reporting it running, with nothing running
// it.)
func TestActorThatKeepsFailingFailsItsTask(t *testing.T) {
	c := startCluster(t, 1, 0)
	drv := &panicDriver{Driver: sim.New(sim.Config{}), panicOn: func(int) bool { return true }}
	a := c.startNodeWith("a", drv)
	ids := c.submit(1, &warrenv1.Script{Steps: 3, StepMillis: 10})
	waitFor(t, "the task to fail", 30*time.Second, func() bool {
		return c.task(ids[0]).GetState() == warrenv1.TaskState_TASK_STATE_FAILED
	})
	evs := c.events(ids[0])
	if last := evs[len(evs)-1]; !strings.Contains(string(last.GetPayload()), "task actor kept failing") || !strings.Contains(string(last.GetPayload()), "a panic in Exec") {
		t.Fatalf("the last event does not say why: %s %s", last.GetKind(), last.GetPayload())
	}
	waitFor(t, "the node to let go", 10*time.Second, func() bool { return a.Running() == 0 && drv.Live() == 0 })
}

// crashDriver stands for a driver whose sandboxes outlive the node's
// process, as microVMs do: the sim driver (simulated sandboxes), with
// Destroy and Close doing nothing, so the next run finds them, as the
// microvm driver re-adopts its VMs under their sandbox ids.
type crashDriver struct{ *sim.Driver }

type survivingSandbox struct{ driver.Sandbox }

func (survivingSandbox) Destroy() error { return nil }

func (d crashDriver) Claim(ctx context.Context, req driver.ClaimRequest) (driver.Sandbox, error) {
	sb, err := d.Driver.Claim(ctx, req)
	if err != nil {
		return nil, err
	}
	return survivingSandbox{sb}, nil
}

func (crashDriver) Close() error { return nil }

// A node restarted within its TTL keeps its leases, and its task actors
// claim their sandboxes under the same ids; one its last run left is
// destroyed and the task goes on in a fresh one. (The claim was refused,
// "sandbox exists", and retried for good: the task never moved, and the
// node, still heartbeating, was never declared down.)
func TestRestartedNodeGoesOnWithItsTask(t *testing.T) {
	c := startCluster(t, 1, 0)
	sd := sim.New(sim.Config{})
	noGossip := func(cfg *noded.Config) { cfg.GossipAddr, cfg.JoinGossip = "", nil } // a crash sends no leave
	a1 := c.startNodeWith("a", crashDriver{sd}, noGossip)
	ids := c.submit(1, &warrenv1.Script{Steps: 20, StepMillis: 20})
	waitFor(t, "a few steps", 20*time.Second, func() bool {
		tk := c.task(ids[0])
		return tk.GetState() == warrenv1.TaskState_TASK_STATE_RUNNING && tk.GetNextSeq() > 6
	})
	a1.Close() // its sandbox lives on
	c.startNodeWith("a", sd, noGossip)
	waitFor(t, "the task to succeed on the restarted node", 30*time.Second, c.allEnded(ids))
	checkLog(t, ids[0], c.events(ids[0]), 20)
	if tk := c.task(ids[0]); tk.GetLease().GetNode() != "a" || tk.GetLease().GetEpoch() != 1 {
		t.Fatalf("the task moved: node %q epoch %d", tk.GetLease().GetNode(), tk.GetLease().GetEpoch())
	}
	if n := sd.Live(); n != 0 {
		t.Fatalf("%d sandboxes left", n)
	}
}
