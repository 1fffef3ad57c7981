package noded_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"connectrpc.com/connect"

	"github.com/warrenhq/warren/api"
	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
)

// A finish whose summary holds a NUL is refused back to the model
// (finish_rejected), and its next finish opens the pull request. Before,
// the NUL reached git commit, which refused it on every publish try, and
// the task failed. (Scripted provider.)
func TestFinishWithANULInItsSummaryIsRefused(t *testing.T) {
	imageDir := needContainers(t)
	repo := buggyRepo(t)
	script := strings.Join([]string{
		`{"content":[{"type":"tool_use","name":"edit_file","input":{"path":"calc/calc.go","old_string":"return a - b","new_string":"return a + b"}}]}`,
		`{"content":[{"type":"tool_use","name":"finish","input":{"summary":"Add adds now.\u0000"}}]}`,
		`{"content":[{"type":"tool_use","name":"finish","input":{"summary":"Add adds now."}}]}`,
	}, "\n")
	c, _ := startClaimLogNode(t, imageDir, 0)
	id := createScripted(t, c, "agent-finish-nul", repo, "", script)
	waitEnded(t, c, id)
	var rejected, body string
	for _, e := range c.events(id) {
		var p map[string]any
		_ = json.Unmarshal(e.GetPayload(), &p)
		switch e.GetKind() {
		case "finish_rejected":
			rejected = string(e.GetPayload())
		case "pull_request":
			body, _ = p["body"].(string)
		}
	}
	if !strings.Contains(rejected, "control character U+0000") {
		t.Errorf("the refusal: %s; want one naming the NUL", rejected)
	}
	if s := c.task(id).GetState(); s != warrenv1.TaskState_TASK_STATE_SUCCEEDED {
		t.Fatalf("the task ended %v", s)
	}
	if !strings.Contains(body, "Add adds now.") {
		t.Errorf("the pull request's body:\n%s", body)
	}
}

// The tests' output goes into the pull request, and the model writes the
// tests: a credential they print, built at run time (so in no diff), is
// redacted in the body. Before, it went in as it was. (Scripted provider.)
func TestFinishTestOutputCredentialIsRedactedInThePullRequest(t *testing.T) {
	imageDir := needContainers(t)
	repo := buggyRepo(t)
	const key = "AKIAQYLPMN5HHHFPZAM2"
	script := strings.Join([]string{
		`{"content":[{"type":"tool_use","name":"edit_file","input":{"path":"calc/calc.go","old_string":"return a - b","new_string":"return a + b"}}]}`,
		`{"content":[{"type":"tool_use","name":"finish","input":{"summary":"Add adds now."}}]}`,
	}, "\n")
	c, _ := startClaimLogNode(t, imageDir, 0)
	resp, err := c.cl.Tasks().CreateTask(context.Background(), connect.NewRequest(&warrenv1.CreateTaskRequest{
		RequestId: "agent-test-output-key", Spec: &warrenv1.TaskSpec{Repo: repo, Base: "HEAD", IssueTitle: "Add is wrong",
			TestCommand: `go test ./... && k=AKIA && echo "deployed with ${k}QYLPMN5HHHFPZAM2"`, Driver: "container", Model: "scripted", ModelScript: script}}))
	if err != nil {
		t.Fatal(err)
	}
	id := resp.Msg.GetTask().GetId()
	waitEnded(t, c, id)
	if s := c.task(id).GetState(); s != warrenv1.TaskState_TASK_STATE_SUCCEEDED {
		t.Fatalf("the task ended %v", s)
	}
	var body string
	for _, e := range c.events(id) {
		if e.GetKind() == "pull_request" {
			var p map[string]any
			_ = json.Unmarshal(e.GetPayload(), &p)
			body, _ = p["body"].(string)
		}
	}
	if !strings.Contains(body, "deployed with AKIA…[redacted]") || strings.Contains(body, key) {
		t.Errorf("the pull request's body:\n%s", body)
	}
}

// A finish whose summary and fix take more than the log's 64 KiB as JSON
// (12,000 "<", six bytes each once escaped; 70,000 "x") ends the task
// succeeded with its pull request recorded, and the finish's tool_result
// keeps them whole. Before, the end's state_changed carried the finish
// whole: the log refused it, and the task whose pull request was open
// and recorded ended failed. (Scripted provider.)
func TestALongFinishSummaryEndsTheTaskSucceeded(t *testing.T) {
	imageDir := needContainers(t)
	repo := buggyRepo(t)
	summary, fix := strings.Repeat("<", 12000), strings.Repeat("x", 70000)
	finish, err := json.Marshal(map[string]any{"content": []any{map[string]any{"type": "tool_use", "name": "finish",
		"input": map[string]any{"summary": summary, "cause": "a - b", "fix": fix}}}})
	if err != nil {
		t.Fatal(err)
	}
	script := strings.Join([]string{
		`{"content":[{"type":"tool_use","name":"edit_file","input":{"path":"calc/calc.go","old_string":"return a - b","new_string":"return a + b"}}]}`,
		string(finish),
	}, "\n")
	c, _ := startClaimLogNode(t, imageDir, 0)
	id := createScripted(t, c, "agent-finish-long", repo, "", script)
	waitEnded(t, c, id)
	var kinds []string
	var pr bool
	var end map[string]any
	for _, e := range c.events(id) {
		kinds = append(kinds, e.GetKind())
		switch e.GetKind() {
		case "pull_request":
			pr = true
		case "state_changed":
			end = nil
			_ = json.Unmarshal(e.GetPayload(), &end)
		}
	}
	if s := c.task(id).GetState(); s != warrenv1.TaskState_TASK_STATE_SUCCEEDED || !pr {
		t.Fatalf("the task ended %v (pull_request recorded: %v): %v; its last event: %.300v", s, pr, kinds, end)
	}
	f, _ := end["finish"].(map[string]any)
	if s, _ := f["summary"].(string); !strings.HasPrefix(s, "<<<<") || len(s) >= len(summary) || f["cause"] != "a - b" {
		t.Errorf("the end's finish: %.200v", f)
	}
	// The finish's tool_result has it whole (split into payload_part events).
	evs, err := c.cl.Tasks().ListEvents(context.Background(), connect.NewRequest(&warrenv1.ListEventsRequest{TaskId: id, Limit: 1000}))
	if err != nil {
		t.Fatal(err)
	}
	var j api.PartJoiner
	whole := false
	for _, e := range evs.Msg.GetEvents() {
		p, ok, err := j.Add(e.GetKind(), e.GetPayload())
		if err != nil {
			t.Fatal(err)
		}
		var r struct {
			Finish *struct{ Summary, Fix string }
		}
		if ok && e.GetKind() == "tool_result" && json.Unmarshal(p, &r) == nil && r.Finish != nil {
			whole = r.Finish.Summary == summary && r.Finish.Fix == fix
		}
	}
	if !whole {
		t.Error("the finish's tool_result does not hold the finish whole")
	}
}

// A task the finish step fails has its reason cut to 1,000 bytes, like
// any failed task's (docs/events.md): here the last of five refused
// finishes quotes 3,000 bytes of the test command's output. Before, the
// finish step's reasons went on the end event whole. (Scripted provider.)
func TestAFinishStepFailureReasonIsCut(t *testing.T) {
	imageDir := needContainers(t)
	repo := buggyRepo(t)
	lines := []string{`{"content":[{"type":"tool_use","name":"edit_file","input":{"path":"calc/calc.go","old_string":"return a - b","new_string":"return a + b"}}]}`}
	for range 5 {
		lines = append(lines, `{"content":[{"type":"tool_use","name":"finish","input":{"summary":"Add adds now."}}]}`)
	}
	c, _ := startClaimLogNode(t, imageDir, 0)
	resp, err := c.cl.Tasks().CreateTask(context.Background(), connect.NewRequest(&warrenv1.CreateTaskRequest{
		RequestId: "agent-finish-fail-reason", Spec: &warrenv1.TaskSpec{Repo: repo, Base: "HEAD", IssueTitle: "Add is wrong",
			TestCommand: "yes xxxxxxxxx | head -n 1000; exit 1", Driver: "container", Model: "scripted", ModelScript: strings.Join(lines, "\n")}}))
	if err != nil {
		t.Fatal(err)
	}
	id := resp.Msg.GetTask().GetId()
	waitEnded(t, c, id)
	var end map[string]any
	for _, e := range c.events(id) {
		if e.GetKind() == "state_changed" {
			end = nil
			_ = json.Unmarshal(e.GetPayload(), &end)
		}
	}
	reason, _ := end["reason"].(string)
	if end["to"] != "failed" || !strings.HasPrefix(reason, "finish refused 5 times") {
		t.Fatalf("the task's last event: %.300v", end)
	}
	if len(reason) > 1000+len("…") {
		t.Errorf("the reason takes %d bytes, over 1,000: %.200q", len(reason), reason)
	}
}
