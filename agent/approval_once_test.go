package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/warrenhq/warren/agent/model"
)

// epochLog is a TEST DOUBLE of the task's log as a node writes it: a key
// is applied once per lease epoch only (the node's request id is
// "e<epoch>/<key>"), so a replay under a new epoch that recorded an event
// under the same key again would add it again. failAfter makes the
// Record of a kind commit and then fail (an answer lost on the way).
type epochLog struct {
	mu        sync.Mutex
	epoch     int
	keys      map[string]bool
	events    []Event
	failAfter map[string]int // kind: how many more commits to answer with an error
}

var errLostAnswer = errors.New("the append's answer was lost")

func (m *epochLog) Record(ctx context.Context, key, kind string, payload any) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.keys == nil {
		m.keys = map[string]bool{}
	}
	k := fmt.Sprintf("e%d/%s", m.epoch, key)
	if !m.keys[k] {
		b, err := json.Marshal(payload)
		if err != nil {
			return err
		}
		m.keys[k] = true
		m.events = append(m.events, Event{Kind: kind, Payload: b})
	}
	if m.failAfter[kind] > 0 {
		m.failAfter[kind]--
		return errLostAnswer
	}
	return nil
}

// approvalsAsked counts the approval_requested events by tool call id.
func (m *epochLog) approvalsAsked() map[string]int {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := map[string]int{}
	for _, e := range m.events {
		var p struct {
			ID string `json:"tool_call_id"`
		}
		if e.Kind == "approval_requested" && json.Unmarshal(e.Payload, &p) == nil {
			n[p.ID]++
		}
	}
	return n
}

// replayRig is a task's loop on a real repository, writing to an
// epochLog, for the tests that cut a task off and resume it from its log
// as a node does.
type replayRig struct {
	t   *testing.T
	ctx context.Context
	tl  *Tools
	cfg Config
	gw  *model.Gateway
	log *epochLog
	p   *counting // the scripted model, counting its calls
}

func newReplayRig(t *testing.T, script string, failAfter map[string]int) *replayRig {
	t.Helper()
	r := &replayRig{t: t, ctx: context.Background(), tl: newRepo(t), p: scriptedFrom(t, script),
		log: &epochLog{epoch: 1, failAfter: failAfter}}
	if err := r.tl.InitBase(r.ctx); err != nil {
		t.Fatal(err)
	}
	pol, err := NewPolicy(DefaultPolicy())
	if err != nil {
		t.Fatal(err)
	}
	r.cfg = Config{Model: "scripted", Policy: pol, Checkpoints: true}
	r.gw = &model.Gateway{Provider: r.p}
	return r
}

// loop is a new loop of the task.
func (r *replayRig) loop() *Loop { return NewLoop(r.cfg, r.gw, r.tl, r.log) }

// started is a new loop that started the task.
func (r *replayRig) started() *Loop {
	r.t.Helper()
	l := r.loop()
	if err := l.Start(r.ctx, Task{IssueTitle: "x"}); err != nil {
		r.t.Fatal(err)
	}
	return l
}

// events is what the log holds now.
func (r *replayRig) events() []Event {
	r.log.mu.Lock()
	defer r.log.mu.Unlock()
	return append([]Event(nil), r.log.events...)
}

// resumed is the task under a new epoch (the node died, or the task parked
// and resumed on another node): a new loop that replayed the log, with the
// workspace restored from its last checkpoint, as startAgent and
// pollApproval do; and the events it replayed.
func (r *replayRig) resumed() (*Loop, []Event) {
	r.t.Helper()
	r.log.mu.Lock()
	r.log.epoch++
	r.log.mu.Unlock()
	evs := r.events()
	l := r.loop()
	if _, err := l.Replay(evs); err != nil {
		r.t.Fatal(err)
	}
	if patch, ok := l.LastCheckpoint(); ok {
		if err := r.tl.Restore(r.ctx, patch); err != nil {
			r.t.Fatal(err)
		}
	}
	return l, evs
}

// approve puts a reviewer's approval of call id on the log.
func (r *replayRig) approve(id string) {
	r.log.mu.Lock()
	defer r.log.mu.Unlock()
	b, _ := json.Marshal(map[string]any{"tool_call_id": id, "approved": true})
	r.log.events = append(r.log.events, Event{Kind: "approval_decided", Payload: b})
}

// stepOn steps l on from a step's out and err until it ends.
func stepOn(ctx context.Context, l *Loop, out *Outcome, err error) (*Outcome, error) {
	for err == nil && out == nil {
		out, err = l.Step(ctx)
	}
	return out, err
}

// A tool call gets one approval_requested, however its task is retried,
// restarted or resumed: the live step retried after a record whose answer
// was lost (same epoch: the same key), and a loop that replays the log
// under a new epoch (the node died, or the task parked and resumed on
// another node), before and after the decision, with a second call of the
// same turn that needs its own approval. The key is the same on every run
// (the step and the call's index, from the recorded model_call), and a
// replay finds the request on the log (asked), so it records none again.
func TestApprovalIsAskedOncePerToolCall(t *testing.T) {
	script := `{"content":[{"type":"tool_use","id":"call_a","name":"edit_file","input":{"path":"go.mod","old_string":"module demo","new_string":"module demo\n\ngo 1.22"}},{"type":"tool_use","id":"call_b","name":"write_file","input":{"path":".github/workflows/ci.yml","content":"on: push\n"}}]}
{"content":[{"type":"tool_use","name":"finish","input":{"summary":"done"}}]}
`
	r := newReplayRig(t, script, map[string]int{"approval_requested": 1})
	ctx := r.ctx
	waitsOn := func(tool string) func(*Outcome, error) string {
		return func(out *Outcome, err error) string {
			t.Helper()
			if err != nil || out == nil || out.Reason != "waiting_approval" || out.Approval.Tool != tool {
				t.Fatalf("want a wait for %s: %+v %v", tool, out, err)
			}
			return out.Approval.ToolCallID
		}
	}
	resume := func() (*Outcome, error) {
		t.Helper()
		l, _ := r.resumed()
		return l.Resume(ctx)
	}

	l := r.started()
	// The request lands, its answer is lost: the step fails and is retried.
	if _, err := l.Step(ctx); !errors.Is(err, errLostAnswer) {
		t.Fatalf("want the lost answer, got %v", err)
	}
	a := waitsOn(ToolEditFile)(l.Step(ctx))
	a2 := waitsOn(ToolEditFile)(resume()) // the node died while it waited
	if a2 != a {
		t.Fatalf("waits on %s, then on %s", a, a2)
	}
	r.approve(a)
	b := waitsOn(ToolWriteFile)(resume()) // resumed elsewhere after the decision
	waitsOn(ToolWriteFile)(resume())      // and again, before the second decision
	r.approve(b)
	if out, err := resume(); err != nil || out.Reason != "finished" {
		t.Fatalf("%+v %v", out, err)
	}
	asked := r.log.approvalsAsked()
	if len(asked) != 2 || asked[a] != 1 || asked[b] != 1 {
		t.Errorf("approval_requested by tool call: %v; want one each for %s and %s", asked, a, b)
	}
	for _, f := range []string{"go.mod", ".github/workflows/ci.yml"} {
		if _, err := os.Stat(filepath.Join(r.tl.Root, f)); err != nil {
			t.Errorf("%s: %v", f, err)
		}
	}
}

// A model that gives a call the id of one from before a compaction (some
// OpenAI-compatible servers number their ids per response: call_0 again
// and again) gets an id of its own: the compaction took the old call out
// of the conversation, but its approval is on the log, and a call with
// its id would be taken as approved (or its result as this one's).
func TestToolCallIDsStayUniqueAcrossCompaction(t *testing.T) {
	script := `{"content":[{"type":"tool_use","id":"call_0","name":"edit_file","input":{"path":"go.mod","old_string":"module demo","new_string":"module demo\n\ngo 1.22"}}]}
{"content":[{"type":"tool_use","id":"call_1","name":"run_command","input":{"command":"seq 1 3000"}}]}
{"content":[{"type":"text","text":"Summary: go.mod has its go line; seq printed numbers."}]}
{"content":[{"type":"tool_use","id":"call_0","name":"write_file","input":{"path":".github/workflows/ci.yml","content":"on: push\n"}}]}
{"content":[{"type":"tool_use","name":"finish","input":{"summary":"done"}}]}
`
	ctx := context.Background()
	tl := newRepo(t)
	pol, err := NewPolicy(DefaultPolicy())
	if err != nil {
		t.Fatal(err)
	}
	p := scriptedFrom(t, script)
	log := &memLog{}
	newL := func() *Loop {
		return NewLoop(Config{Model: "scripted", Policy: pol, ContextWindow: 4000}, &model.Gateway{Provider: p}, tl, log)
	}
	l := newL()
	if err := l.Start(ctx, Task{IssueTitle: "x"}); err != nil {
		t.Fatal(err)
	}
	out, err := l.Run(ctx)
	if err != nil || out.Reason != "waiting_approval" || out.Approval.ToolCallID != "call_0" {
		t.Fatalf("%+v %v", out, err)
	}
	log.Record(ctx, "decision-1", "approval_decided", map[string]any{"tool_call_id": "call_0", "approved": true})
	l = newL()
	if _, err := l.Replay(log.events); err != nil {
		t.Fatal(err)
	}
	out, err = l.Resume(ctx)
	if !strings.Contains(log.kinds(), "model_call") || p.n < 3 {
		t.Fatalf("the script did not get to its compaction (%d calls)", p.n)
	}
	if err != nil || out.Reason != "waiting_approval" || out.Approval.Tool != ToolWriteFile || out.Approval.ToolCallID == "call_0" {
		t.Fatalf("the CI edit after the compaction: %+v %v; want its own approval", out, err)
	}
	if _, err := os.Stat(filepath.Join(tl.Root, ".github/workflows/ci.yml")); err == nil {
		t.Error("the CI file was written with the approval of an earlier call")
	}
	// A replay sees the same ids, and waits on the same call.
	l = newL()
	if _, err := l.Replay(log.events); err != nil {
		t.Fatal(err)
	}
	again, err := l.Resume(ctx)
	if err != nil || again.Reason != "waiting_approval" || again.Approval.ToolCallID != out.Approval.ToolCallID {
		t.Fatalf("replayed: %+v %v; want the wait on %s", again, err, out.Approval.ToolCallID)
	}
}

// A call whose checkpoint landed but whose result did not (the node died
// between the two) runs again on the resumed task, on the workspace as it
// was before it: the checkpoint that holds its effect is not restored, so
// its effect is not applied twice.
func TestCallRunAgainAfterItsCheckpointFindsNoEffectOfItself(t *testing.T) {
	script := `{"content":[{"type":"tool_use","id":"call_a","name":"run_command","input":{"command":"echo x >> f.txt"}}]}
{"content":[{"type":"tool_use","id":"call_b","name":"run_command","input":{"command":"echo y >> f.txt"}}]}
{"content":[{"type":"tool_use","name":"finish","input":{"summary":"done"}}]}
`
	r := newReplayRig(t, script, map[string]int{})
	ctx := r.ctx
	l := r.started()
	if out, err := l.Step(ctx); err != nil || out != nil {
		t.Fatalf("first step: %+v %v", out, err)
	}
	// The second call's checkpoint lands and its answer is lost; the task
	// is then resumed elsewhere (a new epoch), as after a crash.
	r.log.mu.Lock()
	r.log.failAfter["checkpoint"] = 1
	r.log.mu.Unlock()
	if _, err := l.Step(ctx); !errors.Is(err, errLostAnswer) {
		t.Fatalf("want the lost answer, got %v", err)
	}
	l, evs := r.resumed()
	if last := evs[len(evs)-1]; last.Kind != "checkpoint" {
		t.Fatalf("the log ends with %s, want the checkpoint", last.Kind)
	}
	if _, ok := l.LastCheckpoint(); !ok {
		t.Fatal("no checkpoint to restore")
	}
	out, err := l.Resume(ctx)
	if out, err = stepOn(ctx, l, out, err); err != nil || out.Reason != "finished" {
		t.Fatalf("%+v %v", out, err)
	}
	b, err := os.ReadFile(filepath.Join(r.tl.Root, "f.txt"))
	if err != nil || string(b) != "x\ny\n" {
		t.Errorf("f.txt: %q %v; want each call's line once", b, err)
	}
}

// A model call whose model_call append failed (or whose answer was lost)
// is recorded by the retried step, under the same key, not made again:
// it is paid once, and the log holds it once, followed by its calls'
// results, so a later replay works.
func TestAModelCallIsNotMadeAgainWhenItsRecordFailed(t *testing.T) {
	script := `{"content":[{"type":"tool_use","id":"call_a","name":"run_command","input":{"command":"echo x >> f.txt"}}]}
{"content":[{"type":"tool_use","name":"finish","input":{"summary":"done"}}]}
`
	r := newReplayRig(t, script, map[string]int{"model_call": 1})
	ctx := r.ctx
	l := r.started()
	if _, err := l.Step(ctx); !errors.Is(err, errLostAnswer) {
		t.Fatalf("want the lost answer, got %v", err)
	}
	out, err := l.Step(ctx)
	if out, err = stepOn(ctx, l, out, err); err != nil || out.Reason != "finished" {
		t.Fatalf("%+v %v", out, err)
	}
	if r.p.n != 2 || out.Spent.Steps != 2 {
		t.Errorf("%d model calls, %d steps spent; want 2 each (one per turn)", r.p.n, out.Spent.Steps)
	}
	if _, err := r.loop().Replay(r.events()); err != nil {
		t.Errorf("the log does not replay: %v", err)
	}
}

// A turn that finishes and makes another call that waits for approval:
// resumed from the log after the decision, the call runs (its change is
// in the workspace) and the turn ends as a finish that can be refused.
func TestAFinishWithACallAfterItInItsTurnRunsTheCallOnResume(t *testing.T) {
	script := `{"content":[{"type":"tool_use","id":"call_f","name":"finish","input":{"summary":"done"}},{"type":"tool_use","id":"call_m","name":"edit_file","input":{"path":"go.mod","old_string":"module demo","new_string":"module demo\n\ngo 1.22"}}]}
{"content":[{"type":"tool_use","name":"finish","input":{"summary":"done again"}}]}
`
	r := newReplayRig(t, script, map[string]int{})
	ctx := r.ctx
	out, err := r.started().Step(ctx)
	if err != nil || out == nil || out.Reason != "waiting_approval" || out.Approval.ToolCallID != "call_m" {
		t.Fatalf("want a wait for the go.mod edit: %+v %v", out, err)
	}
	r.approve("call_m")
	l, _ := r.resumed()
	out, err = l.FinishReplayedTurn(ctx)
	if err != nil || out == nil || out.Reason != "finished" {
		t.Fatalf("the replayed turn: %+v %v; want finished", out, err)
	}
	if b, err := os.ReadFile(filepath.Join(r.tl.Root, "go.mod")); err != nil || !strings.Contains(string(b), "go 1.22") {
		t.Errorf("go.mod: %q %v; want the approved edit", b, err)
	}
	if err := l.RejectFinish(ctx, "the tests failed"); err != nil {
		t.Errorf("refusing the finish: %v", err)
	}
}
