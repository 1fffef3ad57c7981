package noded_test

import (
	"context"
	"sync"
	"testing"
	"time"

	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
	"github.com/warrenhq/warren/noded"
	"github.com/warrenhq/warren/noded/driver"
	"github.com/warrenhq/warren/noded/driver/sim"
)

// listingSim is the simulated driver with a list of what it claimed, as
// the microVM driver lists the sandboxes it re-adopted after a restart.
type listingSim struct {
	*sim.Driver
	mu  *sync.Mutex
	ids *[]string
}

func (l listingSim) Claim(ctx context.Context, req driver.ClaimRequest) (driver.Sandbox, error) {
	sb, err := l.Driver.Claim(ctx, req)
	if err == nil {
		l.mu.Lock()
		*l.ids = append(*l.ids, req.ID)
		l.mu.Unlock()
	}
	return sb, err
}

func (l listingSim) Sandboxes() []driver.Sandbox {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []driver.Sandbox
	for _, id := range *l.ids {
		if sb, ok := l.Driver.Get(id); ok {
			out = append(out, sb)
		}
	}
	return out
}

// A task's sandbox that a node's restart left (the driver re-adopts it),
// whose task moved to another node meanwhile (the restart outlasted the
// node's TTL), is destroyed by the restarted node: no actor there would
// ever ask for it, and it lived until its TTL, a day for a scripted task.
func TestASandboxLeftForATaskThatMovedIsDestroyed(t *testing.T) {
	c := startCluster(t, 1, 2*time.Second)
	sd := sim.New(sim.Config{})
	var mu sync.Mutex
	var ids []string
	noGossip := func(cfg *noded.Config) { cfg.GossipAddr, cfg.JoinGossip = "", nil } // a crash sends no leave
	a1 := c.startNodeWith("a", crashDriver{sd}, noGossip)
	task := c.submit(1, &warrenv1.Script{Steps: 400, StepMillis: 100})[0]
	waitFor(t, "the task running on a", 20*time.Second, func() bool {
		tk := c.task(task)
		return tk.GetState() == warrenv1.TaskState_TASK_STATE_RUNNING && tk.GetLease().GetNode() == "a"
	})
	left := task + "-e1"
	mu.Lock()
	ids = append(ids, left)
	mu.Unlock()
	c.startNode("b", 0)
	a1.Close() // its sandbox lives on
	waitFor(t, "the task moved to b", 30*time.Second, func() bool {
		tk := c.task(task)
		return tk.GetLease().GetNode() == "b" && tk.GetLease().GetEpoch() > 1
	})
	if _, ok := sd.Get(left); !ok {
		t.Fatal("the crashed node's sandbox is gone before the restart: the test proves nothing")
	}
	c.startNodeWith("a", listingSim{sd, &mu, &ids}, noGossip, func(cfg *noded.Config) { cfg.OrphanSweep = 200 * time.Millisecond })
	waitFor(t, "the sandbox the task left on a destroyed", 15*time.Second, func() bool {
		_, ok := sd.Get(left)
		return !ok
	})
}
