package agent

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/warrenhq/warren/agent/model"
)

// talker is a Caller whose model answers text only, every time; it
// counts its calls, and stops the test past 200 (the loop would call it
// for good).
type talker struct {
	t *testing.T
	n int
	// tools: the calls (1-based) answered with a tool call instead
	tools map[int]bool
}

func (c *talker) Call(ctx context.Context, req model.Request) (*model.Result, error) {
	c.n++
	if c.n > 200 {
		c.t.Fatalf("%d model calls for a model that answers text only: the loop does not stop", c.n)
	}
	content := []model.Block{{Type: model.BlockText, Text: "I think the bug is in calc.go."}}
	stop := model.StopEndTurn
	if c.tools[c.n] {
		content = []model.Block{{Type: model.BlockToolUse, ID: "t" + string(rune('a'+c.n)), Name: ToolRepoMap, Input: json.RawMessage(`{}`)}}
		stop = model.StopToolUse
	}
	return &model.Result{Response: &model.Response{ID: "r", Model: "m", Content: content, StopReason: stop,
		Usage: model.Usage{InputTokens: 10, OutputTokens: 10}}, Attempts: 1}, nil
}

// A model that keeps answering text without calling a tool ends the
// task, budgets or not: each such turn got "Continue with the tools" and
// another paid call, for good, when the task had no budget.
func TestModelThatNeverCallsAToolEndsTheTask(t *testing.T) {
	want := "model_stalled: 3 turns in a row without a tool call"
	c := &talker{t: t}
	log := &memLog{}
	l := NewLoop(Config{Model: "m"}, c, newRepo(t), log)
	if err := l.Start(context.Background(), Task{IssueTitle: "x"}); err != nil {
		t.Fatal(err)
	}
	out, err := l.Run(context.Background())
	if err != nil || out == nil || out.Reason != want {
		t.Fatalf("%+v %v after %d calls; want %q", out, err, c.n, want)
	}
	if c.n != DefaultMaxTurnsWithoutTools {
		t.Errorf("%d model calls, want %d", c.n, DefaultMaxTurnsWithoutTools)
	}

	// A replay of that log (the node died before the task's end was
	// recorded) ends the same way, without another call.
	c2 := &talker{t: t}
	l2 := NewLoop(Config{Model: "m"}, c2, newRepo(t), &memLog{})
	if _, err := l2.Replay(log.events); err != nil {
		t.Fatal(err)
	}
	if out, err := l2.Resume(context.Background()); err != nil || out == nil || out.Reason != want || c2.n != 0 {
		t.Fatalf("resumed after the last turn: %+v %v, %d calls; want %q and none", out, err, c2.n, want)
	}

	// A replay of its first two turns: the count survives, so one more
	// text-only turn ends it.
	var cut int
	for i, e := range log.events {
		if e.Kind == "model_call" {
			cut = i // the last one
		}
	}
	c3 := &talker{t: t}
	l3 := NewLoop(Config{Model: "m"}, c3, newRepo(t), &memLog{})
	if _, err := l3.Replay(log.events[:cut]); err != nil {
		t.Fatal(err)
	}
	if out, err := l3.Resume(context.Background()); err != nil || out == nil || out.Reason != want || c3.n != 1 {
		t.Fatalf("resumed after two turns: %+v %v, %d calls; want %q after 1", out, err, c3.n, want)
	}
}

// Only turns in a row count: a tool call starts the count over, and the
// limit is the config's.
func TestTurnsWithoutToolsCountInARow(t *testing.T) {
	c := &talker{t: t, tools: map[int]bool{2: true, 4: true}}
	l := NewLoop(Config{Model: "m", MaxTurnsWithoutTools: 2}, c, newRepo(t), &memLog{})
	if err := l.Start(context.Background(), Task{IssueTitle: "x"}); err != nil {
		t.Fatal(err)
	}
	out, err := l.Run(context.Background())
	// text, tool, text, tool, text, text: ends at the sixth call.
	if err != nil || out == nil || !strings.HasPrefix(out.Reason, "model_stalled: 2 turns") || c.n != 6 {
		t.Fatalf("%+v %v after %d calls; want model_stalled after 6", out, err, c.n)
	}
}
