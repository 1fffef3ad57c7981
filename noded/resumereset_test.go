package noded_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
	"github.com/warrenhq/warren/noded"
)

// A task resumed after its last workspace checkpoint was too large to
// record starts from the base tree, and the model is told so (a message
// from the node, on the log and in its next request). Before, it went on
// as if its changes were there.
func TestAResumeWithoutItsChangesTellsTheModel(t *testing.T) {
	imageDir := needContainers(t)
	repo := buggyRepo(t)
	turns := []string{
		`[{"type":"tool_use","id":"toolu_1","name":"run_command","input":{"command":"head -c 2000000 /dev/urandom > blob.bin && echo made"}}]`,
		`[{"type":"text","text":"never sent: the node stops during this call"}]`,
		`[{"type":"tool_use","id":"toolu_3","name":"read_file","input":{"path":"calc/calc.go"}}]`,
	}
	var mu sync.Mutex
	var resumedReq []byte
	stopped := make(chan struct{})
	fake := fakeAnthropic(t, turns, func(fc fakeCall) {
		switch fc.N {
		case 1:
			<-stopped // the node stops while its model call waits
		case 2:
			mu.Lock()
			resumedReq = fc.Body
			mu.Unlock()
		}
	})
	guestBin := buildGuest(t)
	c := startCluster(t, 1, 30*time.Second)
	start := restartableNode(t, c, imageDir, guestBin, "warren-resume-reset", &noded.Models{AnthropicKey: "k", AnthropicURL: fake.URL})
	d1 := start()
	ctx := context.Background()
	resp, err := c.cl.Tasks().CreateTask(ctx, connect.NewRequest(&warrenv1.CreateTaskRequest{
		RequestId: "resume-reset", Spec: &warrenv1.TaskSpec{Repo: repo, Base: "HEAD", IssueTitle: "Add is wrong",
			Driver: "container", Model: "claude-test"}}))
	if err != nil {
		t.Fatal(err)
	}
	id := resp.Msg.GetTask().GetId()
	waitFor(t, "a checkpoint too large to record", 3*time.Minute, func() bool {
		for _, e := range logSoFar(t, c, id) {
			var p struct {
				TooLarge bool `json:"too_large"`
			}
			if e.GetKind() == "checkpoint" && json.Unmarshal(e.GetPayload(), &p) == nil && p.TooLarge {
				return true
			}
		}
		return isEnded(c.task(id).GetState())
	})
	d1.Close()
	close(stopped)
	start()
	waitFor(t, "the resumed model call", 2*time.Minute, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return resumedReq != nil || isEnded(c.task(id).GetState())
	})
	mu.Lock()
	req := string(resumedReq)
	mu.Unlock()
	if !strings.Contains(req, "back at the base commit") {
		t.Fatalf("the resumed model call does not tell the model its changes are gone (task %s): %.2000s", c.task(id).GetState(), req)
	}
	note := false
	for _, e := range logSoFar(t, c, id) {
		note = note || (e.GetKind() == "message" && strings.Contains(string(e.GetPayload()), `"from":"node"`))
	}
	if !note {
		t.Fatal("no message from the node on the log")
	}
	// The model has no fourth turn, so the task may have failed already
	// (the fake answers "no more turns"): a cancel is then refused.
	if _, err := c.cl.Tasks().CancelTask(ctx, connect.NewRequest(&warrenv1.CancelTaskRequest{TaskId: id, Reason: "test done"})); err != nil &&
		connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Fatal(err)
	}
	waitFor(t, "the task to end", time.Minute, func() bool { return isEnded(c.task(id).GetState()) })
}
