package noded_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
	"github.com/warrenhq/warren/noded/driver/sim"
)

// A task that names a model on a node with no model provider fails,
// saying so. It used to run the placeholder steps of a task without a
// model and succeed, having done nothing. (The sandboxes are the sim
// driver's, SIMULATED: no sandbox is needed to see it.)
func TestATaskNamingAModelFailsOnANodeWithoutAProvider(t *testing.T) {
	c := startCluster(t, 1, 0)
	c.startNodeWith("a", sim.New(sim.Config{}))
	resp, err := c.cl.Tasks().CreateTask(context.Background(), connect.NewRequest(&warrenv1.CreateTaskRequest{
		RequestId: "no-model", Spec: &warrenv1.TaskSpec{Repo: "https://example.invalid/r.git", Base: "main", IssueTitle: "x",
			Driver: "sim", Model: "claude-sonnet-4-5"}}))
	if err != nil {
		t.Fatal(err)
	}
	id := resp.Msg.GetTask().GetId()
	waitFor(t, "the task to end", 30*time.Second, func() bool {
		s := c.task(id).GetState()
		return s == warrenv1.TaskState_TASK_STATE_SUCCEEDED || s == warrenv1.TaskState_TASK_STATE_FAILED
	})
	if s := c.task(id).GetState(); s != warrenv1.TaskState_TASK_STATE_FAILED {
		t.Fatalf("the task ended %v", s)
	}
	evs := c.events(id)
	if last := string(evs[len(evs)-1].GetPayload()); !strings.Contains(last, `model \"claude-sonnet-4-5\": node a has no model provider`) {
		t.Errorf("the task's end: %s", last)
	}
}
