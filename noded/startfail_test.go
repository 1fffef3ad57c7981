package noded_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"connectrpc.com/connect"

	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
	"github.com/warrenhq/warren/noded/driver"
	"github.com/warrenhq/warren/noded/driver/sim"
)

// failClaimDriver is the sim driver whose claims always fail (an image
// that will not boot, a driver out of resources).
type failClaimDriver struct{ *sim.Driver }

func (failClaimDriver) Claim(context.Context, driver.ClaimRequest) (driver.Sandbox, error) {
	return nil, errors.New("test: the sandbox cannot be claimed")
}

// A task whose sandbox claim keeps failing is still cancelled: the actor
// looked at the cancel only between steps, which a start that keeps
// failing never reaches, so the task stayed placed on a live node.
func TestCancelWhileStartKeepsFailing(t *testing.T) {
	c := startCluster(t, 1, 0)
	c.startNodeWith("a", failClaimDriver{sim.New(sim.Config{})})
	ids := c.submit(1, &warrenv1.Script{Steps: 1, StepMillis: 10})
	waitFor(t, "task placed", 10*time.Second, func() bool {
		return c.task(ids[0]).GetState() == warrenv1.TaskState_TASK_STATE_PLACED
	})
	if _, err := c.cl.Tasks().CancelTask(context.Background(), connect.NewRequest(&warrenv1.CancelTaskRequest{TaskId: ids[0], Reason: "test"})); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(8 * time.Second)
	for time.Now().Before(deadline) {
		if c.task(ids[0]).GetState() == warrenv1.TaskState_TASK_STATE_CANCELLED {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	tk := c.task(ids[0])
	t.Errorf("8 s after CancelTask the task is still %s (cancel_requested=%v, node %s)",
		tk.GetState(), tk.GetCancelRequested(), tk.GetLease().GetNode())
}
