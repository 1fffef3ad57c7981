package agent

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warrenhq/warren/agent/model"
)

// memLog is a TEST DOUBLE of the task's event log: in memory, applying
// each key once.
type memLog struct {
	mu     sync.Mutex
	keys   map[string]bool
	events []Event
}

func (m *memLog) Record(ctx context.Context, key, kind string, payload any) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.keys == nil {
		m.keys = map[string]bool{}
	}
	if m.keys[key] {
		return nil
	}
	b, err := json.Marshal(payload)
	if err != nil {
		return err
	}
	m.keys[key] = true
	m.events = append(m.events, Event{Kind: kind, Payload: b})
	return nil
}

func (m *memLog) kinds() string {
	var ks []string
	for _, e := range m.events {
		ks = append(ks, e.Kind)
	}
	return strings.Join(ks, ",")
}

// counting wraps a provider and counts its calls (the "fake model server
// counts no repeated call" of issue 7, here on the scripted provider).
type counting struct {
	model.Provider
	mu   sync.Mutex
	n    int
	last model.Request
}

func (c *counting) Call(ctx context.Context, r model.Request) (*model.Response, error) {
	c.mu.Lock()
	c.n++
	c.last = r
	c.mu.Unlock()
	return c.Provider.Call(ctx, r)
}

// fixScript is a scripted trajectory that fixes calc.Add: read, search,
// edit, test, finish.
const fixScript = `{"content":[{"type":"text","text":"Reading the code."},{"type":"tool_use","name":"read_file","input":{"path":"calc/calc.go"}}],"usage":{"input_tokens":900,"output_tokens":30}}
{"content":[{"type":"tool_use","name":"search","input":{"pattern":"Add\\(","glob":"*.go"}}],"usage":{"input_tokens":50,"cache_read_tokens":900,"output_tokens":20}}
{"content":[{"type":"tool_use","name":"edit_file","input":{"path":"calc/calc.go","old_string":"return a - b","new_string":"return a + b"}}],"usage":{"input_tokens":60,"output_tokens":40}}
{"content":[{"type":"tool_use","name":"run_command","input":{"command":"go test ./... 2>&1"}}],"usage":{"input_tokens":40,"output_tokens":20}}
{"content":[{"type":"tool_use","name":"finish","input":{"summary":"Add subtracted; it adds now.","cause":"a - b","fix":"a + b"}}],"usage":{"input_tokens":70,"output_tokens":30}}
`

func scripted(t *testing.T) *counting { return scriptedFrom(t, fixScript) }

// scriptedFrom is the scripted provider on script, counting its calls.
func scriptedFrom(t *testing.T, script string) *counting {
	t.Helper()
	s, err := model.ParseScripted("test script", []byte(script))
	if err != nil {
		t.Fatal(err)
	}
	return &counting{Provider: s}
}

func newLoop(t *testing.T, tl *Tools, p model.Provider, b Budgets, log *memLog) *Loop {
	g := &model.Gateway{Provider: p, Price: model.Price{Input: 3, CacheWrite: 3.75, CacheRead: 0.3, Output: 15}}
	return NewLoop(Config{Model: "scripted", Budgets: b, Price: g.Price}, g, tl, log)
}

func TestLoopFixesTheBug(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("needs go to run the demo repository's tests")
	}
	tl := newRepo(t)
	os.WriteFile(filepath.Join(tl.Root, "AGENTS.md"), []byte("Run go test ./... before you finish.\n"), 0o644)
	p := scripted(t)
	log := &memLog{}
	l := newLoop(t, tl, p, Budgets{}, log)
	if err := l.Start(context.Background(), Task{IssueTitle: "Add is wrong", IssueBody: "2+2 is not 0", TestCommand: "go test ./..."}); err != nil {
		t.Fatal(err)
	}
	out, err := l.Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if out.Reason != "finished" || out.Finish.Cause != "a - b" || out.Spent.Steps != 5 || p.n != 5 {
		t.Fatalf("outcome %+v, %d calls", out, p.n)
	}
	want := "message" + strings.Repeat(",model_call,tool_call,tool_result", 5)
	if got := log.kinds(); got != want {
		t.Fatalf("events:\n%s\nwant\n%s", got, want)
	}
	var first struct{ Text string }
	json.Unmarshal(log.events[0].Payload, &first)
	for _, s := range []string{"Add is wrong", "AGENTS.md", "Run go test", "calc/calc.go: Add, Acc, Sum"} {
		if !strings.Contains(first.Text, s) {
			t.Errorf("the first message lacks %q", s)
		}
	}
	var test struct {
		Output  string
		IsError bool `json:"is_error"`
	}
	json.Unmarshal(log.events[12].Payload, &test) // step 4's result
	if test.IsError || !strings.Contains(test.Output, "ok") {
		t.Fatalf("the tests after the fix: %+v", test)
	}
	var sb hostSandbox
	if res, _ := sb.Exec(context.Background(), []string{"go", "test", "./..."}, tl.Root, 0); res.ExitCode != 0 {
		t.Fatalf("the repository's tests fail after the task: %s", res.Stdout)
	}
}

func TestBudgets(t *testing.T) {
	tl := newRepo(t)
	// Steps: exactly N model calls.
	p, log := scripted(t), &memLog{}
	l := newLoop(t, tl, p, Budgets{MaxSteps: 2}, log)
	l.Start(context.Background(), Task{IssueTitle: "x"})
	out, err := l.Run(context.Background())
	if err != nil || out.Reason != "max_steps" || out.Spent.Steps != 2 || p.n != 2 || strings.Count(log.kinds(), "model_call") != 2 {
		t.Fatalf("steps: %+v %v, %d calls", out, err, p.n)
	}
	// Cost: checked against each call's worst case, so never exceeded.
	for _, budget := range []int64{1, 5000, 12000, 20000, 40000} {
		p, log := scripted(t), &memLog{}
		tl := newRepo(t)
		l := newLoop(t, tl, p, Budgets{MaxCostMicroUSD: budget}, log)
		l.cfg.MaxTokens = 1024
		l.Start(context.Background(), Task{IssueTitle: "x"})
		out, err := l.Run(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if out.Spent.CostMicroUSD > budget {
			t.Fatalf("budget %d µ$: spent %d", budget, out.Spent.CostMicroUSD)
		}
		t.Logf("cost budget %d µ$: %s after %d steps, spent %d µ$", budget, out.Reason, out.Spent.Steps, out.Spent.CostMicroUSD)
	}
}

// The wall clock runs from the task's start, not the loop's: a task
// resumed past its budget makes no call.
func TestWallClockSpansResumes(t *testing.T) {
	tl := newRepo(t)
	p, log := scripted(t), &memLog{}
	g := &model.Gateway{Provider: p}
	l := NewLoop(Config{Model: "scripted", Budgets: Budgets{MaxWallClock: time.Hour}, Started: time.Now().Add(-2 * time.Hour)}, g, tl, log)
	l.Start(context.Background(), Task{IssueTitle: "x"})
	out, err := l.Run(context.Background())
	if err != nil || out.Reason != "max_wall_clock" || p.n != 0 {
		t.Fatalf("%+v %v, %d calls", out, err, p.n)
	}
	l = NewLoop(Config{Model: "scripted", Budgets: Budgets{MaxWallClock: time.Hour, MaxSteps: 1}, Started: time.Now().Add(-time.Minute)}, g, tl, &memLog{})
	l.Start(context.Background(), Task{IssueTitle: "x"})
	if out, err := l.Run(context.Background()); err != nil || out.Reason != "max_steps" || p.n != 1 {
		t.Fatalf("%+v %v, %d calls", out, err, p.n)
	}
}

// A task resumed from its log (on another node, after a crash) rebuilds
// its conversation from the recorded responses: the model is not called
// again for any step it answered.
func TestReplayRepeatsNoCall(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("needs go")
	}
	type cutAt struct {
		name  string
		keep  int  // events kept
		calls int  // model calls the resumed task makes
		fixed bool // the last checkpoint has step 3's edit
	}
	cuts := []cutAt{
		{"between steps", 1 + 3*2, 3, false},
		{"between a model call and its tool call", 1 + 3*2 + 1, 2, false},
		{"during a workspace-changing command", 1 + 3*3 + 2, 1, true},
	}
	for _, cut := range cuts {
		t.Run(cut.name, func(t *testing.T) {
			tl := newRepo(t)
			first, log := scripted(t), &memLog{}
			l := newLoop(t, tl, first, Budgets{}, log)
			l.Start(context.Background(), Task{IssueTitle: "Add is wrong"})
			if _, err := l.Run(context.Background()); err != nil {
				t.Fatal(err)
			}
			// The "crash": the log as it was at the cut, and a fresh
			// checkout with the last checkpoint applied (here by hand: the
			// checkpoint events come with the forge work).
			events := append([]Event(nil), log.events[:cut.keep]...)
			tl2 := newRepo(t)
			if cut.fixed {
				b, _ := os.ReadFile(filepath.Join(tl2.Root, "calc/calc.go"))
				os.WriteFile(filepath.Join(tl2.Root, "calc/calc.go"), []byte(strings.Replace(string(b), "a - b", "a + b", 1)), 0o644)
			}
			second, log2 := scripted(t), &memLog{events: append([]Event(nil), events...)}
			l2 := newLoop(t, tl2, second, Budgets{}, log2)
			missing, err := l2.Replay(events)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("resumed with %d tool calls to run first", len(missing))
			out, err := l2.Resume(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if out.Reason != "finished" || second.n != cut.calls {
				t.Fatalf("outcome %+v; the resumed task called the model %d times, want %d", out, second.n, cut.calls)
			}
			// The same final workspace: the tests pass.
			var sb hostSandbox
			if res, _ := sb.Exec(context.Background(), []string{"go", "test", "./..."}, tl2.Root, 0); res.ExitCode != 0 {
				t.Fatalf("the resumed task's workspace fails its tests: %s", res.Stdout)
			}
		})
	}
}

// Near the window's end the loop compacts once, in one model call recorded
// as such; the history restarts from the task and the summary, and a
// replay rebuilds it the same way. Large outputs go to the blob store.
func TestCompactionAndBlobs(t *testing.T) {
	tl := newRepo(t)
	script := `{"content":[{"type":"tool_use","name":"run_command","input":{"command":"yes line | head -n 20000"}}]}
{"content":[{"type":"text","text":"Add subtracts; the fix is in calc/calc.go line 4."}]}
{"content":[{"type":"tool_use","name":"edit_file","input":{"path":"calc/calc.go","old_string":"return a - b","new_string":"return a + b"}}]}
{"content":[{"type":"tool_use","name":"finish","input":{"summary":"fixed"}}]}
`
	p := scriptedFrom(t, script)
	log := &memLog{}
	blobs := DirBlobs{Dir: t.TempDir()}
	cfg := Config{Model: "scripted", ContextWindow: 6000, CompactAt: 0.8, Blobs: blobs}
	l := NewLoop(cfg, &model.Gateway{Provider: p}, tl, log)
	l.Start(context.Background(), Task{IssueTitle: "Add is wrong"})
	out, err := l.Run(context.Background())
	if err != nil || out.Reason != "finished" || p.n != 4 {
		t.Fatalf("%+v %v, %d calls", out, err, p.n)
	}
	var compactions int
	var blobRef string
	for _, e := range log.events {
		var m map[string]any
		json.Unmarshal(e.Payload, &m)
		if e.Kind == "model_call" && m["compaction"] == true {
			compactions++
		}
		if e.Kind == "tool_result" && m["blob"] != nil {
			blobRef = m["blob"].(string)
		}
	}
	if compactions != 1 {
		t.Fatalf("%d compactions, want 1: %s", compactions, log.kinds())
	}
	full, err := blobs.Get(blobRef)
	if err != nil || len(full) != 20000*5 {
		t.Fatalf("the full output in the blob store: %d bytes, %v", len(full), err)
	}
	// A replay after the compaction rebuilds the compacted history.
	l2 := NewLoop(cfg, &model.Gateway{Provider: p}, tl, &memLog{})
	if _, err := l2.Replay(log.events[:len(log.events)-3]); err != nil {
		t.Fatal(err)
	}
	if len(l2.msgs) != 5 || !strings.Contains(l2.msgs[1].Content[0].Text, "Add subtracts") {
		t.Fatalf("replayed history: %d messages: %+v", len(l2.msgs), l2.msgs)
	}
}

// A refused finish (the tests failed outside the model's control) goes
// back to the model as the finish call's error, and a replay of the log
// rebuilds the same conversation.
func TestRejectFinishGoesBackToTheModel(t *testing.T) {
	const script = `{"content":[{"type":"tool_use","name":"finish","input":{"summary":"done"}}]}
{"content":[{"type":"tool_use","name":"read_file","input":{"path":"calc/calc.go"}}]}
{"content":[{"type":"tool_use","name":"finish","input":{"summary":"really done"}}]}
`
	tl := newRepo(t)
	p, log := scriptedFrom(t, script), &memLog{}
	l := newLoop(t, tl, p, Budgets{}, log)
	l.Start(context.Background(), Task{IssueTitle: "x"})
	out, err := l.Run(context.Background())
	if err != nil || out.Reason != "finished" || out.Finish.Summary != "done" {
		t.Fatalf("%+v %v", out, err)
	}
	// A user message lands while the task is in its finish step.
	log.Record(context.Background(), "user-msg", "message", map[string]any{"from": "user", "text": "keep the API"})
	if err := l.RejectFinish(context.Background(), "the test command failed"); err != nil {
		t.Fatal(err)
	}
	l.Steer("keep the API") // what the actor does live at the next step
	// Replayed from before the refusal (a resume mid-finish), the same
	// refusal gives the same conversation.
	l4 := newLoop(t, tl, scriptedFrom(t, script), Budgets{}, &memLog{})
	var beforeRefusal []Event
	for _, e := range log.events {
		if e.Kind != "finish_rejected" {
			beforeRefusal = append(beforeRefusal, e)
		}
	}
	if _, err := l4.Replay(beforeRefusal); err != nil {
		t.Fatal(err)
	}
	if o, _ := l4.FinishReplayedTurn(context.Background()); o == nil || o.Reason != "finished" {
		t.Fatalf("replayed mid-finish: %+v", o)
	}
	if err := l4.RejectFinish(context.Background(), "the test command failed"); err != nil {
		t.Fatal(err)
	}
	if a, b := mustJSON(t, l.msgs), mustJSON(t, l4.msgs); a != b {
		t.Fatalf("live and resumed-mid-finish conversations differ:\n%s\n%s", a, b)
	}
	// A resumed copy, replaying the log up to here, says the same next.
	l2 := newLoop(t, tl, scriptedFrom(t, script), Budgets{}, &memLog{events: append([]Event(nil), log.events...)})
	if _, err := l2.Replay(log.events); err != nil {
		t.Fatal(err)
	}
	if o, err := l2.FinishReplayedTurn(context.Background()); o != nil || err != nil {
		t.Fatalf("the replayed, refused finish: %+v %v", o, err)
	}
	if a, b := mustJSON(t, l.msgs), mustJSON(t, l2.msgs); a != b {
		t.Fatalf("live and replayed conversations differ:\n%s\n%s", a, b)
	}
	out, err = l.Run(context.Background())
	if err != nil || out.Reason != "finished" || out.Finish.Summary != "really done" || p.n != 3 {
		t.Fatalf("%+v %v, %d calls", out, err, p.n)
	}
	second := mustJSON(t, p.last.Messages)
	if !strings.Contains(second, "finish was refused: the test command failed") || l.FinishRejections() != 1 {
		t.Fatalf("the model did not see the refusal: %s", second)
	}
	// Replaying a log that ends finished keeps the finish out of the
	// conversation, so a refusal after a resume works the same.
	l3 := newLoop(t, tl, scriptedFrom(t, script), Budgets{}, &memLog{events: append([]Event(nil), log.events...)})
	l3.Replay(log.events)
	if o, _ := l3.FinishReplayedTurn(context.Background()); o == nil || o.Finish.Summary != "really done" {
		t.Fatalf("replayed end: %+v", o)
	}
	if err := l3.RejectFinish(context.Background(), "again"); err != nil || l3.FinishRejections() != 2 {
		t.Fatalf("%v, %d", err, l3.FinishRejections())
	}
}

func mustJSON(t *testing.T, v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// A turn whose two calls share one id (some OpenAI-compatible servers
// repeat ids) gets an approval for each: approving the first call does
// not approve the second, which the gateway gave an id of its own.
func TestRepeatedToolCallIDsGetTheirOwnApprovals(t *testing.T) {
	script := `{"content":[{"type":"tool_use","id":"call_0","name":"edit_file","input":{"path":"go.mod","old_string":"module demo","new_string":"module demo\n\ngo 1.22"}},{"type":"tool_use","id":"call_0","name":"write_file","input":{"path":".github/workflows/ci.yml","content":"on: push\n"}}]}
{"content":[{"type":"tool_use","name":"finish","input":{"summary":"done"}}]}
`
	tl := newRepo(t)
	pol, _ := NewPolicy(DefaultPolicy())
	log := &memLog{}
	g := &model.Gateway{Provider: scriptedFrom(t, script)}
	newL := func() *Loop { return NewLoop(Config{Model: "scripted", Policy: pol}, g, tl, log) }
	l := newL()
	l.Start(context.Background(), Task{IssueTitle: "x"})
	out, err := l.Run(context.Background())
	if err != nil || out.Reason != "waiting_approval" || out.Approval.Tool != ToolEditFile {
		t.Fatalf("%+v %v", out, err)
	}
	first := out.Approval.ToolCallID
	log.Record(context.Background(), "decision-1", "approval_decided", map[string]any{"tool_call_id": first, "approved": true})
	l = newL()
	if _, err := l.Replay(log.events); err != nil {
		t.Fatal(err)
	}
	out, err = l.Resume(context.Background())
	if err != nil || out.Reason != "waiting_approval" || out.Approval.Tool != ToolWriteFile || out.Approval.ToolCallID == first {
		t.Fatalf("the second call's own approval: %+v %v", out, err)
	}
	if b, _ := os.ReadFile(filepath.Join(tl.Root, "go.mod")); !strings.Contains(string(b), "go 1.22") {
		t.Error("the approved edit did not run")
	}
	if _, err := os.Stat(filepath.Join(tl.Root, ".github/workflows/ci.yml")); err == nil {
		t.Error("the CI file was written without its own approval")
	}
}

// A model that refuses (Anthropic's refusal, OpenAI's content_filter)
// ends the task: asked to continue, it would refuse again, at a model
// call's cost each time, until a budget stopped it (budgets are optional).
func TestRefusalEndsTheTask(t *testing.T) {
	for _, stop := range []string{model.StopRefusal, model.StopContentFilter} {
		p := scriptedFrom(t, `{"stop_reason":"`+stop+`","content":[{"type":"text","text":"I cannot help with that."}]}
{"content":[{"type":"text","text":"still no"}]}
`)
		l := NewLoop(Config{Model: "scripted"}, &model.Gateway{Provider: p}, newRepo(t), &memLog{})
		if err := l.Start(context.Background(), Task{IssueTitle: "x"}); err != nil {
			t.Fatal(err)
		}
		out, err := l.Run(context.Background())
		if err != nil || out == nil || out.Reason != "model_refused: the model stopped with "+stop {
			t.Fatalf("%s: %+v %v", stop, out, err)
		}
		if p.n != 1 {
			t.Errorf("%s: %d model calls, want 1", stop, p.n)
		}
	}
}

// hangingProvider never answers: its calls end only with their context.
type hangingProvider struct{}

func (hangingProvider) Name() string { return "scripted" }
func (hangingProvider) Call(ctx context.Context, _ model.Request) (*model.Response, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

// The wall-clock budget bounds a model call too: a provider that never
// answers does not hold the task past its budget (the call is given up
// on, and the next step ends the task on the budget).
func TestWallClockBoundsAModelCall(t *testing.T) {
	tl := newRepo(t)
	g := &model.Gateway{Provider: hangingProvider{}}
	l := NewLoop(Config{Model: "scripted", Budgets: Budgets{MaxWallClock: 300 * time.Millisecond}}, g, tl, &memLog{})
	l.Start(context.Background(), Task{IssueTitle: "x"})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	out, err := l.Step(ctx)
	if err == nil || ctx.Err() != nil {
		t.Fatalf("a call to a provider that never answers: %+v %v after %v; want it given up on at the budget", out, err, time.Since(start))
	}
	if out, err := l.Step(ctx); err != nil || out == nil || out.Reason != "max_wall_clock" {
		t.Fatalf("the next step: %+v %v; want max_wall_clock", out, err)
	}
}

// A tool call whose arguments were not JSON (an OpenAI-compatible model's
// slip, kept by the provider under model.InvalidArgumentsKey) comes back
// to the model as a tool error, and the task goes on: the model calls
// again, correctly.
func TestToolCallWithArgumentsThatAreNotJSONIsAToolError(t *testing.T) {
	script := `{"content":[{"type":"tool_use","id":"call_a","name":"run_command","input":{"` + model.InvalidArgumentsKey + `":"{\"command\": echo hi"}}]}
{"content":[{"type":"tool_use","id":"call_b","name":"run_command","input":{"command":"echo hi > hi.txt"}}]}
{"content":[{"type":"tool_use","name":"finish","input":{"summary":"done"}}]}
`
	tl := newRepo(t)
	log := &memLog{}
	l := NewLoop(Config{Model: "scripted"}, &model.Gateway{Provider: scriptedFrom(t, script)}, tl, log)
	l.Start(context.Background(), Task{IssueTitle: "x"})
	out, err := l.Run(context.Background())
	if err != nil || out.Reason != "finished" {
		t.Fatalf("%+v %v", out, err)
	}
	var first string
	for _, e := range log.events {
		if e.Kind == "tool_result" && strings.Contains(string(e.Payload), `"call_a"`) {
			first = string(e.Payload)
		}
	}
	if !strings.Contains(first, "not JSON") || !strings.Contains(first, `"is_error":true`) {
		t.Errorf("the first call's result: %s; want a tool error saying its arguments are not JSON", first)
	}
	if b, err := os.ReadFile(filepath.Join(tl.Root, "hi.txt")); err != nil || string(b) != "hi\n" {
		t.Errorf("the second call did not run: %q %v", b, err)
	}
}

// When the task's context alone is over the compaction threshold (a small
// window, a long issue), the loop compacts once and then lets the model
// take its turn. Before, every step after the first compaction compacted
// again, each a paid model call, for as long as the budgets allowed.
func TestNoCompactionRightAfterACompaction(t *testing.T) {
	tl := newRepo(t)
	script := `{"content":[{"type":"text","text":"Reading the issue."}]}
{"content":[{"type":"text","text":"The issue is long; nothing done yet."}]}
{"content":[{"type":"tool_use","name":"finish","input":{"summary":"nothing to change"}}]}
`
	p := scriptedFrom(t, script)
	log := &memLog{}
	cfg := Config{Model: "scripted", ContextWindow: 6000, CompactAt: 0.8}
	l := NewLoop(cfg, &model.Gateway{Provider: p}, tl, log)
	l.Start(context.Background(), Task{IssueTitle: "long", IssueBody: strings.Repeat("the report goes on. ", 1500)})
	out, err := l.Run(context.Background())
	if err != nil || out.Reason != "finished" || p.n != 3 {
		t.Fatalf("%+v %v, %d calls; log %s", out, err, p.n, log.kinds())
	}
	var compactions []int
	for i, e := range log.events {
		var m map[string]any
		json.Unmarshal(e.Payload, &m)
		if e.Kind == "model_call" && m["compaction"] == true {
			compactions = append(compactions, i)
		}
	}
	if len(compactions) != 1 {
		t.Fatalf("%d compactions, want 1: %s", len(compactions), log.kinds())
	}
	// A replay that ends right after the compaction does not compact
	// again either: its next step is the model's turn.
	l2 := NewLoop(cfg, &model.Gateway{Provider: scriptedFrom(t, script)}, tl, &memLog{})
	if _, err := l2.Replay(log.events[:compactions[0]+1]); err != nil {
		t.Fatal(err)
	}
	if out, err := l2.Run(context.Background()); err != nil || out.Reason != "finished" {
		t.Fatalf("after the replayed compaction: %+v %v", out, err)
	}
}

// A note the node gave the model (a message from "node", such as the one
// a resume without the workspace's changes records) is replayed where a
// user's message at that point would be.
func TestReplayKeepsTheNodesNote(t *testing.T) {
	tl := newRepo(t)
	script := `{"content":[{"type":"tool_use","name":"read_file","input":{"path":"calc/calc.go"}}]}
`
	log := &memLog{}
	l := newLoop(t, tl, scriptedFrom(t, script), Budgets{}, log)
	l.Start(context.Background(), Task{IssueTitle: "x"})
	if _, err := l.Step(context.Background()); err != nil {
		t.Fatal(err)
	}
	log.Record(context.Background(), "node-note", "message", map[string]any{"from": "node", "text": "NOTE FROM THE NODE"})
	l2 := newLoop(t, tl, scriptedFrom(t, script), Budgets{}, &memLog{})
	if _, err := l2.Replay(log.events); err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(l2.msgs)
	if !strings.Contains(string(b), "NOTE FROM THE NODE") {
		t.Fatalf("the node's note is not in the replayed conversation: %s", b)
	}
}
