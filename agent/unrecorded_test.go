package agent

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/warrenhq/warren/agent/model"
)

// failModelCallOnce is a log that refuses the next model_call once.
type failModelCallOnce struct {
	*memLog
	fail bool
}

func (f *failModelCallOnce) Record(ctx context.Context, key, kind string, payload any) error {
	if kind == "model_call" && f.fail {
		f.fail = false
		return errors.New("the log is unavailable for a moment")
	}
	return f.memLog.Record(ctx, key, kind, payload)
}

// A model call made and paid for whose model_call the log refused is
// recorded by the next step and acted on, even when a message Steered
// meanwhile puts the conversation over the compaction threshold. Before,
// that step compacted, which dropped the paid call and asked the model
// again.
func TestAnUnrecordedCallIsNotDroppedForACompaction(t *testing.T) {
	tl := newRepo(t)
	script := `{"content":[{"type":"tool_use","name":"read_file","input":{"path":"go.mod"}}]}
{"content":[{"type":"tool_use","name":"read_file","input":{"path":"calc/calc.go"}}]}
{"content":[{"type":"tool_use","name":"finish","input":{"summary":"done"}}]}
`
	ctx := context.Background()
	p := scriptedFrom(t, script)
	log := &failModelCallOnce{memLog: &memLog{}}
	l := NewLoop(Config{Model: "scripted", ContextWindow: 6000, CompactAt: 0.8}, &model.Gateway{Provider: p}, tl, log)
	if err := l.Start(ctx, Task{IssueTitle: "x"}); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Step(ctx); err != nil {
		t.Fatal(err)
	}
	log.fail = true
	if _, err := l.Step(ctx); err == nil {
		t.Fatal("step 2's model_call was refused, yet the step succeeded")
	}
	long := strings.Repeat("a long message from the user. ", 800)
	log.Record(ctx, "msg", "message", map[string]any{"from": "user", "text": long})
	l.Steer(long) // the actor, before it runs the step again
	if _, err := l.Step(ctx); err != nil {
		t.Fatal(err)
	}
	// The turn was made without the message: it follows the turn's
	// results, live as on a replay.
	replayMatches(t, "after the recorded call", log.memLog, l, script)
	if p.n != 2 {
		t.Fatalf("%d model calls after the retried step, want 2: the paid call was made again (log %s)", p.n, log.kinds())
	}
	for _, e := range log.events {
		var m map[string]any
		_ = json.Unmarshal(e.Payload, &m)
		if e.Kind == "model_call" && m["compaction"] == true {
			t.Fatalf("the retried step compacted: %s", log.kinds())
		}
	}
}

// A message that comes while a paid compaction waits to be recorded
// follows the summary: the summary was made without it. Before, the live
// loop put it in the history the summary then replaced, so the model never
// saw it.
func TestAMessageDuringAnUnrecordedCompactionFollowsTheSummary(t *testing.T) {
	tl := newRepo(t)
	script := `{"content":[{"type":"text","text":"Reading the issue."}]}
{"content":[{"type":"text","text":"The issue is long; nothing done yet."}]}
{"content":[{"type":"tool_use","name":"finish","input":{"summary":"nothing to change"}}]}
`
	ctx := context.Background()
	p := scriptedFrom(t, script)
	log := &failModelCallOnce{memLog: &memLog{}}
	cfg := Config{Model: "scripted", ContextWindow: 6000, CompactAt: 0.8}
	l := NewLoop(cfg, &model.Gateway{Provider: p}, tl, log)
	if err := l.Start(ctx, Task{IssueTitle: "long", IssueBody: strings.Repeat("the report goes on. ", 1500)}); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Step(ctx); err != nil {
		t.Fatal(err)
	}
	log.fail = true
	if _, err := l.Step(ctx); err == nil { // the compaction, not recorded
		t.Fatal("the compaction's model_call was refused, yet the step succeeded")
	}
	log.Record(ctx, "msg", "message", map[string]any{"from": "user", "text": "SAID WHILE THE SUMMARY WAITED"})
	l.Steer("SAID WHILE THE SUMMARY WAITED")
	if _, err := l.Step(ctx); err != nil {
		t.Fatal(err)
	}
	if !l.compactedLast || p.n != 2 {
		t.Fatalf("the retried step: compacted %v after %d model calls; want the recorded compaction, 2 calls", l.compactedLast, p.n)
	}
	if !strings.Contains(mustJSON(t, l.msgs), "SAID WHILE THE SUMMARY WAITED") {
		t.Fatalf("the live conversation lost the message; after the task's context it is %s", mustJSON(t, l.msgs[1:]))
	}
	replayMatches(t, "after the compaction", log.memLog, l, script)
}
