package noded_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/warrenhq/warren/api"
	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
	"github.com/warrenhq/warren/noded"
)

// A model turn too large for one event (a write_file of 200 KB, with <, >,
// & and quotes) is recorded as payload_part events and the event, and the
// task goes on: the call waits for an approval past the grace period, so
// the task parks and resumes from its log, where the joined turn is
// replayed (the model is never asked again) and the write runs with the
// whole content. Its checkpoint (a 200 KB patch) is split too: the next
// call parks again, and the task resumes with the file restored from it.
// The model is a FAKE Anthropic server on loopback.
func TestAModelTurnLargerThanAnEventIsRecordedAndReplayed(t *testing.T) {
	imageDir := needContainers(t)
	repo := buggyRepo(t)
	var content strings.Builder
	for i := 0; content.Len() < 200<<10; i++ {
		fmt.Fprintf(&content, "line %06d: if a < b && b > c { s := \"q\" }\n", i)
	}
	input, err := json.Marshal(map[string]string{"path": "big.txt", "content": content.String()})
	if err != nil {
		t.Fatal(err)
	}
	turns := []string{
		`[{"type":"tool_use","id":"toolu_1","name":"write_file","input":` + string(input) + `}]`,
		`[{"type":"tool_use","id":"toolu_2","name":"run_command","input":{"command":"wc -c < big.txt; sha256sum big.txt; head -c 20 big.txt > small.txt; rm big.txt"}}]`,
		`[{"type":"tool_use","id":"toolu_3","name":"finish","input":{"summary":"kept the head."}}]`,
	}
	var mu sync.Mutex
	calls := 0
	fake := fakeAnthropic(t, turns, func(fakeCall) { mu.Lock(); calls++; mu.Unlock() })
	const grace = 3 * time.Second
	c, d := startAgentNodeWith(t, imageDir, &noded.Models{AnthropicKey: "k", AnthropicURL: fake.URL}, nil,
		func(cfg *noded.Config) { cfg.ApprovalGrace = grace })
	ctx := context.Background()
	resp, err := c.cl.Tasks().CreateTask(ctx, connect.NewRequest(&warrenv1.CreateTaskRequest{
		RequestId: "agent-big-turn", Spec: &warrenv1.TaskSpec{Repo: repo, Base: "HEAD", IssueTitle: "Write a big file",
			Driver: "container", Model: "claude-test",
			Policy: []*warrenv1.PolicyRule{{Tool: "write_file", Tier: "approve", Reason: "writes wait"},
				{Tool: "run_command", Tier: "approve", Reason: "commands wait"}}}}))
	if err != nil {
		t.Fatal(err)
	}
	id := resp.Msg.GetTask().GetId()
	for i, call := range []string{"toolu_1", "toolu_2"} {
		waitFor(t, "the task to park on "+call, 3*time.Minute, func() bool {
			tk := c.task(id)
			return tk.GetState() == warrenv1.TaskState_TASK_STATE_FAILED ||
				tk.GetParked() && len(tk.GetPendingApprovals()) == 1 && tk.GetPendingApprovals()[0] == call
		})
		if tk := c.task(id); tk.GetState() == warrenv1.TaskState_TASK_STATE_FAILED {
			evs := c.events(id)
			t.Fatalf("the task failed: %s", evs[len(evs)-1].GetPayload())
		}
		// The actor counts its park after the parked event lands, which
		// the servers show first.
		waitFor(t, "the node to count its park", 10*time.Second, func() bool { return d.Stats().Parked >= i+1 })
		if got := d.Stats().Parked; got != i+1 {
			t.Fatalf("the node parked %d times, want %d", got, i+1)
		}
		if _, err := c.cl.Tasks().Approve(ctx, connect.NewRequest(&warrenv1.DecideRequest{TaskId: id, ToolCallId: call})); err != nil {
			t.Fatal(err)
		}
	}
	waitEnded(t, c, id)
	evs := c.events(id)
	var kinds []string
	var listing string
	split := map[string]int{}
	var j api.PartJoiner
	for _, e := range evs {
		kinds = append(kinds, e.GetKind())
		if n := len(e.GetPayload()); n > api.MaxEventPayloadBytes {
			t.Errorf("event %d (%s) holds %d bytes", e.GetSeq(), e.GetKind(), n)
		}
		if strings.Contains(string(e.GetPayload()), `"`+api.PartsKey+`"`) {
			split[e.GetKind()]++
		}
		p, ok, err := j.Add(e.GetKind(), e.GetPayload())
		if err != nil {
			t.Fatalf("event %d: %v", e.GetSeq(), err)
		}
		if !ok {
			continue
		}
		var m map[string]any
		json.Unmarshal(p, &m)
		if e.GetKind() == "tool_call" && m["tool_call_id"] == "toolu_1" {
			in, _ := m["input"].(map[string]any)
			if in["content"] != content.String() {
				t.Errorf("the joined tool_call holds %d bytes of content, want %d", len(fmt.Sprint(in["content"])), content.Len())
			}
		}
		if e.GetKind() == "tool_result" && m["tool_call_id"] == "toolu_2" {
			listing, _ = m["output"].(string)
		}
	}
	t.Logf("events: %s", strings.Join(kinds, ","))
	if s := c.task(id).GetState(); s != warrenv1.TaskState_TASK_STATE_SUCCEEDED {
		t.Fatalf("the task ended %v", s)
	}
	// (The resumed task records the call's tool_call again, under its
	// new epoch.)
	for kind, want := range map[string]int{"model_call": 1, "approval_requested": 1, "tool_call": 2, "checkpoint": 1} {
		if split[kind] < want {
			t.Errorf("%d split %s events, want %d", split[kind], kind, want)
		}
	}
	if !strings.Contains(strings.Join(kinds, ","), "parked") {
		t.Error("the task never parked: nothing was replayed")
	}
	if want := fmt.Sprintf("%d\n", content.Len()); !strings.Contains(listing, want) {
		t.Errorf("the file in the sandbox: %q, want %d bytes", listing, content.Len())
	}
	mu.Lock()
	defer mu.Unlock()
	if calls != len(turns) {
		t.Errorf("the model was called %d times for %d turns: a recorded response was asked for again", calls, len(turns))
	}
	if u := c.task(id).GetUsage(); u.GetModelCalls() != uint64(len(turns)) {
		t.Errorf("the task's usage counts %d model calls, want %d", u.GetModelCalls(), len(turns))
	}
}
