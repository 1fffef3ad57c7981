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
	l.Steer(strings.Repeat("a long message from the user. ", 800))
	if _, err := l.Step(ctx); err != nil {
		t.Fatal(err)
	}
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
