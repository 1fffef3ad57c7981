package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/warrenhq/warren/actor"
	"github.com/warrenhq/warren/agent/model"
)

// checkConversation fails when msgs is not a conversation a Messages API
// accepts: roles alternate, and every tool_use is answered by a
// tool_result in the next (user) message.
func checkConversation(t *testing.T, msgs []model.Message) {
	t.Helper()
	for i, m := range msgs {
		if i > 0 && msgs[i-1].Role == m.Role {
			t.Errorf("messages %d and %d are both %s", i-1, i, m.Role)
		}
		for _, b := range m.Content {
			if b.Type != model.BlockToolUse {
				continue
			}
			found := false
			if i+1 < len(msgs) {
				for _, r := range msgs[i+1].Content {
					found = found || (r.Type == model.BlockToolResult && r.ToolUseID == b.ID)
				}
			}
			if !found {
				t.Errorf("tool_use %s (%s) in message %d has no tool_result in the next message", b.ID, b.Name, i)
			}
		}
	}
}

// A user steers the task while it waits for an approval (or while a
// command runs when the node crashes): the message is on the log after
// the model_call whose tool calls have no results yet. The replayed turn
// stays open, its approved call runs, and the model sees the message
// after the turn's results. (Replay used to put the message after the
// assistant turn, which FinishReplayedTurn then took for the turn: the
// approved call never ran, and the API refused the conversation.)
func TestSteerWhileWaitingForApprovalFollowsTheResults(t *testing.T) {
	tl := newRepo(t)
	script := `{"content":[{"type":"tool_use","name":"edit_file","input":{"path":"go.mod","old_string":"module demo","new_string":"module demo\n\ngo 1.22"}}]}
{"content":[{"type":"tool_use","name":"finish","input":{"summary":"done"}}]}
`
	p := scriptedFrom(t, script)
	pol, _ := NewPolicy(DefaultPolicy())
	log := &memLog{}
	g := &model.Gateway{Provider: p}
	newL := func() *Loop { return NewLoop(Config{Model: "scripted", Policy: pol}, g, tl, log) }
	l := newL()
	l.Start(context.Background(), Task{IssueTitle: "x"})
	out, err := l.Run(context.Background())
	if err != nil || out.Reason != "waiting_approval" {
		t.Fatalf("%+v %v", out, err)
	}
	// While it waits: a steering message, then the decision.
	log.Record(context.Background(), "user-msg", "message", map[string]any{"from": "user", "text": "use go 1.22"})
	log.Record(context.Background(), "decision", "approval_decided", map[string]any{"tool_call_id": out.Approval.ToolCallID, "approved": true})

	l = newL()
	if _, err := l.Replay(log.events); err != nil {
		t.Fatal(err)
	}
	out, err = l.Resume(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(tl.Root, "go.mod")); !strings.Contains(string(b), "go 1.22") {
		t.Errorf("the approved edit_file never ran (outcome %s)", out.Reason)
	}
	checkConversation(t, p.last.Messages)
}

// A turn with two calls: the first (allowed) edits a file, the second
// waits for an approval. The task parks (its sandbox is destroyed) and
// resumes on a fresh checkout with the last checkpoint restored, which
// holds the first call's edit: a checkpoint follows each call that may
// change the workspace, before its result. (It used to be taken at the
// turn's end only, and the resume skipped the first call, whose result
// was recorded: its edit was gone.)
func TestParkedTurnKeepsAnEarlierCallsEdit(t *testing.T) {
	script := `{"content":[{"type":"tool_use","name":"edit_file","input":{"path":"calc/calc.go","old_string":"return a - b","new_string":"return a + b"}},{"type":"tool_use","name":"edit_file","input":{"path":"go.mod","old_string":"module demo","new_string":"module demo\n\ngo 1.22"}}]}
{"content":[{"type":"tool_use","name":"finish","input":{"summary":"done"}}]}
`
	pol, _ := NewPolicy(DefaultPolicy())
	log := &memLog{}
	tl := newRepo(t)
	if err := tl.InitBase(context.Background()); err != nil {
		t.Fatal(err)
	}
	p := scriptedFrom(t, script)
	cfg := Config{Model: "scripted", Policy: pol, Checkpoints: true}
	l := NewLoop(cfg, &model.Gateway{Provider: p}, tl, log)
	l.Start(context.Background(), Task{IssueTitle: "x"})
	out, err := l.Run(context.Background())
	if err != nil || out.Reason != "waiting_approval" {
		t.Fatalf("%+v %v", out, err)
	}
	if !l.Resumable() {
		t.Fatal("not resumable: the actor would not park")
	}
	log.Record(context.Background(), "decision", "approval_decided", map[string]any{"tool_call_id": out.Approval.ToolCallID, "approved": true})

	// The resume elsewhere, as noded's startAgent does it.
	tl2 := newRepo(t)
	if err := tl2.InitBase(context.Background()); err != nil {
		t.Fatal(err)
	}
	l2 := NewLoop(cfg, &model.Gateway{Provider: scriptedFrom(t, script)}, tl2, &memLog{events: append([]Event(nil), log.events...)})
	if _, err := l2.Replay(log.events); err != nil {
		t.Fatal(err)
	}
	if patch, ok := l2.LastCheckpoint(); ok {
		if err := tl2.Restore(context.Background(), patch); err != nil {
			t.Fatal(err)
		}
	}
	out, err = l2.Resume(context.Background())
	if err != nil || out.Reason != "finished" {
		t.Fatalf("%+v %v", out, err)
	}
	b, _ := os.ReadFile(filepath.Join(tl2.Root, "calc/calc.go"))
	if !strings.Contains(string(b), "a + b") {
		t.Errorf("the first call's edit (its result recorded, the model told it succeeded) is gone after the resume:\n%s", b)
	}
}

// A tool result's view is at most 16 KiB (32 KiB for run_command), but
// the event carries it JSON-encoded: control bytes, invalid UTF-8 and
// <, >, & each become a 6-byte escape. A binary file read, or a command
// printing HTML, still makes a tool_result event the log takes (at most
// 64 KiB; a larger one was refused, and the task failed).
func TestToolResultEventFitsTheLog(t *testing.T) {
	tl := newRepo(t)
	bin := make([]byte, 20<<10)
	for i := range bin {
		bin[i] = byte(0x80 + i%64) // not UTF-8, no newlines: like a .png
	}
	os.WriteFile(filepath.Join(tl.Root, "logo.png"), bin, 0o644)
	html := strings.Repeat("<td>&nbsp;</td>\n", 2048) // 32 KiB
	os.WriteFile(filepath.Join(tl.Root, "page.html"), []byte(html), 0o644)
	script := `{"content":[{"type":"tool_use","name":"read_file","input":{"path":"logo.png"}}]}
{"content":[{"type":"tool_use","name":"run_command","input":{"command":"cat page.html; cat page.html >&2"}}]}
`
	log := &memLog{}
	l := NewLoop(Config{Model: "scripted", Budgets: Budgets{MaxSteps: 2}, Blobs: DirBlobs{Dir: t.TempDir()}}, &model.Gateway{Provider: scriptedFrom(t, script)}, tl, log)
	l.Start(context.Background(), Task{IssueTitle: "x"})
	if _, err := l.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, e := range log.events {
		if len(e.Payload) > 64<<10 {
			t.Errorf("a %s event of %d bytes: over the log's 64 KiB limit (the scheduler refuses it, the task fails)", e.Kind, len(e.Payload))
		}
	}
}

// The first user message holds the issue, AGENTS.md (read up to 64 KiB)
// and the repo map (up to 24 KiB); with a 48 KiB AGENTS.md and a long
// map it is still an event the log takes (every task on such a
// repository used to fail at its start).
func TestContextEventFitsTheLog(t *testing.T) {
	tl := newRepo(t)
	os.WriteFile(filepath.Join(tl.Root, "AGENTS.md"), []byte(strings.Repeat("Run `go test ./...` and keep the API.\n", 1300)), 0o644)
	for i := 0; i < 700; i++ {
		os.WriteFile(filepath.Join(tl.Root, "calc", fmt.Sprintf("file_with_a_rather_long_name_%04d.go", i)), []byte("package calc\n\nfunc F() {}\n"), 0o644)
	}
	log := &memLog{}
	l := NewLoop(Config{Model: "scripted"}, &model.Gateway{Provider: scriptedFrom(t, `{"content":[{"type":"text","text":"x"}]}`)}, tl, log)
	if err := l.Start(context.Background(), Task{IssueTitle: "x", IssueBody: "y"}); err != nil {
		t.Fatal(err)
	}
	if n := len(log.events[0].Payload); n > 64<<10 {
		t.Errorf("the task's context event is %d bytes: over the log's 64 KiB limit", n)
	}
}

// failOnce is a log whose first Record of one key fails (a leader
// election, a dropped connection): the actor retries the step.
type failOnce struct {
	*memLog
	key    string
	failed bool
}

func (f *failOnce) Record(ctx context.Context, key, kind string, payload any) error {
	if key == f.key && !f.failed {
		f.failed = true
		return errors.New("unavailable: no leader")
	}
	return f.memLog.Record(ctx, key, kind, payload)
}

// A transient failure to record a tool's result (or its call, or a
// sandbox hiccup) fails the Step part-way; the actor retries with another
// Step, which finishes the open turn before any model call. (It used to
// call the model with a tool_use that had no tool_result: the API refused
// it and the task ended model_error.)
func TestStepRetryFinishesTheOpenTurn(t *testing.T) {
	tl := newRepo(t)
	p := scripted(t)
	log := &failOnce{memLog: &memLog{}, key: "step-1/result-1"} // the first turn is [text, tool_use]
	l := NewLoop(Config{Model: "scripted"}, &model.Gateway{Provider: p}, tl, log)
	l.Start(context.Background(), Task{IssueTitle: "x"})
	if _, err := l.Step(context.Background()); err == nil {
		t.Fatal("the failing record did not fail the step")
	}
	// What the actor does: retry the step.
	if _, err := l.Step(context.Background()); err != nil {
		t.Fatal(err)
	}
	checkConversation(t, p.last.Messages)
}

// recordTimeout is a sandbox that notes each Exec's timeout.
type recordTimeout struct {
	hostSandbox
	timeouts []time.Duration
}

func (r *recordTimeout) Exec(ctx context.Context, argv []string, dir string, timeout time.Duration) (ExecResult, error) {
	r.timeouts = append(r.timeouts, timeout)
	return ExecResult{ExitCode: 0}, nil
}

// A command's timeout is bounded by what the wall-clock budget leaves,
// not only by its own (up to an hour).
func TestWallClockBoundsCommands(t *testing.T) {
	tl := newRepo(t)
	sb := &recordTimeout{}
	tl.SB = sb
	clk := actor.NewFakeClock(time.Now())
	script := `{"content":[{"type":"tool_use","name":"run_command","input":{"command":"make slow-tests","timeout_seconds":3600}}]}
`
	l := NewLoop(Config{Model: "scripted", Clock: clk, Started: clk.Now().Add(-55 * time.Minute), Budgets: Budgets{MaxWallClock: time.Hour}},
		&model.Gateway{Provider: scriptedFrom(t, script)}, tl, &memLog{})
	l.msgs = []model.Message{{Role: model.RoleUser, Content: []model.Block{{Type: model.BlockText, Text: "x"}}}}
	if _, err := l.Step(context.Background()); err != nil {
		t.Fatal(err)
	}
	if len(sb.timeouts) != 1 || sb.timeouts[0] > 5*time.Minute {
		t.Errorf("5 minutes of the wall-clock budget left; the command may run %v", sb.timeouts)
	}
}

// A user message that lands between two results of one turn: live and
// replayed, the model sees [result A, result B, message] (a replay used
// to give [result A, message, result B]: another prompt, and Anthropic
// wants tool_result blocks first in a user turn).
func TestReplayedSteerBetweenResultsFollowsThem(t *testing.T) {
	tl := newRepo(t)
	script := `{"content":[{"type":"tool_use","name":"read_file","input":{"path":"go.mod"}},{"type":"tool_use","name":"read_file","input":{"path":"calc/calc.go"}}]}
{"content":[{"type":"tool_use","name":"finish","input":{"summary":"done"}}]}
`
	// The log as it is when the message lands between the two results.
	log := &hookLog{memLog: &memLog{}, after: "step-1/result-0", do: func(m *memLog) {
		m.Record(context.Background(), "user-msg", "message", map[string]any{"from": "user", "text": "hurry"})
	}}
	l := NewLoop(Config{Model: "scripted"}, &model.Gateway{Provider: scriptedFrom(t, script)}, tl, log)
	l.Start(context.Background(), Task{IssueTitle: "x"})
	if _, err := l.Step(context.Background()); err != nil {
		t.Fatal(err)
	}
	l.Steer("hurry") // the actor's steer() at the next step
	l2 := NewLoop(Config{Model: "scripted"}, &model.Gateway{Provider: scriptedFrom(t, script)}, tl, &memLog{})
	if _, err := l2.Replay(log.events); err != nil {
		t.Fatal(err)
	}
	if a, b := mustJSON(t, l.msgs), mustJSON(t, l2.msgs); a != b {
		t.Errorf("live and replayed conversations differ:\n%s\n%s", a, b)
	}
	for _, m := range l2.msgs {
		seenText := false
		for _, b := range m.Content {
			if b.Type == model.BlockText {
				seenText = true
			} else if b.Type == model.BlockToolResult && seenText {
				t.Errorf("a tool_result after text in a user turn: %+v", m.Content)
			}
		}
	}
}

type hookLog struct {
	*memLog
	after string
	do    func(*memLog)
}

func (h *hookLog) Record(ctx context.Context, key, kind string, payload any) error {
	err := h.memLog.Record(ctx, key, kind, payload)
	if key == h.after {
		h.do(h.memLog)
	}
	return err
}

// A patch with bytes that are not UTF-8 (a Latin-1 source file's) goes in
// its event as base64 and still applies on resume (as a JSON string its
// bytes became U+FFFD).
func TestCheckpointPatchThatIsNotUTF8SurvivesTheLog(t *testing.T) {
	tl := newRepo(t)
	os.WriteFile(filepath.Join(tl.Root, "legacy.c"), []byte("/* Auteur: Fran\xe7ois */\nint x = 1;\n"), 0o644)
	if err := tl.InitBase(context.Background()); err != nil {
		t.Fatal(err)
	}
	script := `{"content":[{"type":"tool_use","name":"edit_file","input":{"path":"legacy.c","old_string":"int x = 1;","new_string":"int x = 2;"}}]}
`
	log := &memLog{}
	l := NewLoop(Config{Model: "scripted", Checkpoints: true, Budgets: Budgets{MaxSteps: 1}}, &model.Gateway{Provider: scriptedFrom(t, script)}, tl, log)
	l.Start(context.Background(), Task{IssueTitle: "x"})
	if _, err := l.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	tl2 := newRepo(t)
	os.WriteFile(filepath.Join(tl2.Root, "legacy.c"), []byte("/* Auteur: Fran\xe7ois */\nint x = 1;\n"), 0o644)
	if err := tl2.InitBase(context.Background()); err != nil {
		t.Fatal(err)
	}
	l2 := NewLoop(Config{Model: "scripted"}, nil, tl2, &memLog{})
	if _, err := l2.Replay(log.events); err != nil {
		t.Fatal(err)
	}
	patch, ok := l2.LastCheckpoint()
	if !ok {
		t.Fatal("no checkpoint")
	}
	if err := tl2.Restore(context.Background(), patch); err != nil {
		t.Errorf("the recorded checkpoint does not restore: %v", err)
	}
}

// failingCaller is a gateway whose calls keep failing with a retryable
// error (a provider down, a DNS or TLS failure, a request the server
// answers 500 every time).
type failingCaller struct{ n int }

func (f *failingCaller) Call(ctx context.Context, req model.Request) (*model.Result, error) {
	f.n++
	return nil, &model.HTTPError{Provider: "anthropic", Status: 500, Type: "api_error"}
}

// A provider that keeps failing ends the task after MaxFailedCalls calls
// in a row (each after the gateway's retries), budgets or not; a call
// that succeeds starts the count again.
func TestFailedCallsInARowEndTheTask(t *testing.T) {
	tl := newRepo(t)
	f := &failingCaller{}
	l := NewLoop(Config{Model: "scripted"}, f, tl, &memLog{})
	l.msgs = []model.Message{{Role: model.RoleUser, Content: []model.Block{{Type: model.BlockText, Text: "x"}}}}
	for i := 1; i <= MaxFailedCalls; i++ {
		out, err := l.Step(context.Background())
		if i < MaxFailedCalls {
			var he *model.HTTPError
			if out != nil || !errors.As(err, &he) || !he.Retryable() {
				t.Fatalf("call %d: %+v %v, want a retryable error", i, out, err)
			}
			continue
		}
		if err != nil || out == nil || !strings.HasPrefix(out.Reason, "model_error: ") {
			t.Fatalf("call %d: %+v %v, want the task to end with a model_error", i, out, err)
		}
	}
	if f.n != MaxFailedCalls {
		t.Errorf("%d calls, want %d", f.n, MaxFailedCalls)
	}
	// A success in between starts the count again.
	l2 := NewLoop(Config{Model: "scripted"}, &flaky{fail: MaxFailedCalls - 1, then: &model.Gateway{Provider: scripted(t)}}, tl, &memLog{})
	l2.msgs = l.msgs[:1]
	for i := 0; i < MaxFailedCalls-1; i++ {
		if out, err := l2.Step(context.Background()); out != nil || err == nil {
			t.Fatalf("call %d: %+v %v", i, out, err)
		}
	}
	if _, err := l2.Step(context.Background()); err != nil {
		t.Fatalf("the call that succeeds: %v", err)
	}
	if l2.failedCalls != 0 {
		t.Errorf("failed calls after a success: %d", l2.failedCalls)
	}
}

// flaky fails its first fail calls, then answers as then does.
type flaky struct {
	fail int
	then Caller
}

func (f *flaky) Call(ctx context.Context, req model.Request) (*model.Result, error) {
	if f.fail > 0 {
		f.fail--
		return nil, &model.HTTPError{Provider: "anthropic", Status: 503, Type: "overloaded_error"}
	}
	return f.then.Call(ctx, req)
}
