package noded_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
	"github.com/warrenhq/warren/noded"
)

// A cancel that lands while the finish step pushes and opens the pull
// request still leaves the pull request on the log: it exists on the
// forge either way. Before, the step saw the cancel first and ended the
// task cancelled with no pull_request event.
func TestACancelDuringPublishKeepsThePullRequestRecord(t *testing.T) {
	imageDir := needContainers(t)
	repo := buggyRepo(t)
	script := strings.Join([]string{
		`{"content":[{"type":"tool_use","name":"edit_file","input":{"path":"calc/calc.go","old_string":"return a - b","new_string":"return a + b"}}]}`,
		`{"content":[{"type":"tool_use","name":"finish","input":{"summary":"Add adds now."}}]}`,
	}, "\n")
	published := make(chan struct{})
	c, _ := startAgentNodeWith(t, imageDir, nil, nil, func(cfg *noded.Config) {
		cfg.AfterPublish = func(ctx context.Context) {
			// The cancel arrives now, and the step sees it before it
			// records what it published.
			close(published)
			select {
			case <-ctx.Done():
			case <-time.After(time.Minute):
			}
		}
	})
	id := createScripted(t, c, "cancel-publish", repo, "", script)
	select {
	case <-published:
	case <-time.After(4 * time.Minute):
		t.Fatal("the task did not publish within 4 minutes")
	}
	if _, err := c.cl.Tasks().CancelTask(context.Background(), connect.NewRequest(&warrenv1.CancelTaskRequest{TaskId: id, Reason: "test cancel"})); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the task to end", time.Minute, func() bool {
		st := c.task(id).GetState()
		return st == warrenv1.TaskState_TASK_STATE_CANCELLED || st == warrenv1.TaskState_TASK_STATE_SUCCEEDED || st == warrenv1.TaskState_TASK_STATE_FAILED
	})
	var kinds []string
	pr := false
	for _, e := range c.events(id) {
		kinds = append(kinds, e.GetKind())
		pr = pr || e.GetKind() == "pull_request"
	}
	if st := c.task(id).GetState(); st != warrenv1.TaskState_TASK_STATE_CANCELLED {
		t.Fatalf("task ended %v, want cancelled: %v", st, kinds)
	}
	if !pr {
		t.Fatalf("the task was cancelled after its push with no pull_request event: %v", kinds)
	}
}
