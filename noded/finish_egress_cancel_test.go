package noded_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
	"github.com/warrenhq/warren/noded/driver"
	"github.com/warrenhq/warren/noded/driver/container"
)

// The verification sandbox's egress audit reaches the task's log however
// the test run ends, not only when it returns a result: the test code is
// the model's, and a cancel (or a Run error) once dropped its attempts.
// docs/egress.md: every attempt the task made is on its log before it
// ends. Here the test command connects to an allowed and a denied host,
// then hangs; the task is cancelled.
func TestFinishCancelKeepsTheVerificationSandboxsEgress(t *testing.T) {
	var drv *claimLog
	c, _ := startEgressNodeWith(t, "warren-test-verify-egress-cancel", nil, func(cd *container.Driver) driver.Driver {
		drv = &claimLog{Driver: cd}
		return drv
	})

	repo := buggyRepo(t)
	script := strings.Join([]string{
		`{"content":[{"type":"tool_use","name":"edit_file","input":{"path":"calc/calc.go","old_string":"return a - b","new_string":"return a + b"}}]}`,
		`{"content":[{"type":"tool_use","name":"finish","input":{"summary":"Add adds now."}}]}`,
	}, "\n")
	probe := `python3 -c '
import socket
for target in (("allowed.test", 80), ("198.51.100.20", 80)):
    try:
        socket.create_connection(target, timeout=3).close(); print(target[0], "ok")
    except Exception as e:
        print(target[0], type(e).__name__)
' ; touch /tmp/probed; sleep 600`
	ctx := context.Background()
	resp, err := c.cl.Tasks().CreateTask(ctx, connect.NewRequest(&warrenv1.CreateTaskRequest{
		RequestId: "verify-egress-cancel", Spec: &warrenv1.TaskSpec{Repo: repo, Base: "HEAD", IssueTitle: "Add is wrong",
			TestCommand: probe, Driver: "container", Model: "scripted", ModelScript: script}}))
	if err != nil {
		t.Fatal(err)
	}
	id := resp.Msg.GetTask().GetId()
	waitFor(t, "the test command to have made its connection attempts", 3*time.Minute, func() bool {
		ids := drv.verifyClaims()
		if len(ids) == 0 {
			return false
		}
		sb, ok := drv.Get(ids[0])
		if !ok {
			return false
		}
		var b strings.Builder
		_, err := sb.(driver.Interactive).ReadFile(ctx, "/tmp/probed", 10, &b)
		return err == nil
	})
	if _, err := c.cl.Tasks().CancelTask(ctx, connect.NewRequest(&warrenv1.CancelTaskRequest{TaskId: id, Reason: "test cancel"})); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the task to be cancelled", time.Minute, func() bool {
		return c.task(id).GetState() == warrenv1.TaskState_TASK_STATE_CANCELLED
	})
	var allowed, denied bool
	for _, e := range c.events(id) {
		if e.GetKind() != "egress" {
			continue
		}
		if sb, a, d := webAttempts(t, e); strings.Contains(sb, "-verify-") {
			allowed, denied = allowed || a, denied || d
		}
	}
	if !allowed || !denied {
		t.Fatalf("the task ended cancelled without the verification sandbox's egress attempts on its log (allowed seen %v, denied seen %v): "+
			"the test command's network attempts were audited, then dropped", allowed, denied)
	}
}
