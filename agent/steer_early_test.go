package agent

import (
	"context"
	"strings"
	"testing"

	"github.com/warrenhq/warren/agent/model"
)

// A user's message sent before the task started (it waited for a node) is
// on the log before the task's context. Live, the actor Steers it after
// Start; a replay puts it in the same place: the model's conversation is
// the same, live or replayed, before and after the first model call.
// (Replay reset the conversation at the context message, dropping it.)
func TestMessageBeforeTheContextIsReplayedAfterIt(t *testing.T) {
	tl := newRepo(t)
	script := `{"content":[{"type":"tool_use","name":"read_file","input":{"path":"go.mod"}}]}
{"content":[{"type":"tool_use","name":"finish","input":{"summary":"done"}}]}
`
	ctx := context.Background()
	log := &memLog{}
	log.Record(ctx, "user-msg-1", "message", map[string]any{"from": "user", "text": "look at calc.go"})
	l := NewLoop(Config{Model: "scripted"}, &model.Gateway{Provider: scriptedFrom(t, script)}, tl, log)
	if err := l.Start(ctx, Task{IssueTitle: "x"}); err != nil {
		t.Fatal(err)
	}
	l.Steer("look at calc.go") // the actor steers the messages already on the log
	log.Record(ctx, "user-msg-2", "message", map[string]any{"from": "user", "text": "and its test"})
	l.Steer("and its test") // one that came after the start, before the first step

	replay := func(when string) {
		t.Helper()
		l2 := NewLoop(Config{Model: "scripted"}, &model.Gateway{Provider: scriptedFrom(t, script)}, tl, &memLog{})
		if _, err := l2.Replay(log.events); err != nil {
			t.Fatal(err)
		}
		if a, b := mustJSON(t, l.msgs), mustJSON(t, l2.msgs); a != b {
			t.Errorf("%s: live and replayed conversations differ:\n%s\n%s", when, a, b)
		}
		if first := mustJSON(t, l2.msgs[0]); !strings.Contains(first, "look at calc.go") || !strings.Contains(first, "and its test") {
			t.Errorf("%s: the replayed first message lacks the user's messages: %s", when, first)
		}
		checkConversation(t, l2.msgs)
	}
	replay("before the first model call")
	if _, err := l.Step(ctx); err != nil {
		t.Fatal(err)
	}
	replay("after the first model call")
}

// A start that ran again before any model call (its node failed after
// recording the context) leaves two context messages: the replay starts
// over at the second, with every message the user sent before the first
// model call after it, as the actor's second start Steered them.
func TestSecondContextKeepsTheEarlierMessages(t *testing.T) {
	tl := newRepo(t)
	ctx := context.Background()
	log := &memLog{}
	log.Record(ctx, "m1", "message", map[string]any{"from": "user", "text": "one"})
	log.Record(ctx, "c1", "message", map[string]any{"from": "agent", "role": "user", "initial": true, "text": "context"})
	log.Record(ctx, "m2", "message", map[string]any{"from": "user", "text": "two"})
	log.Record(ctx, "c2", "message", map[string]any{"from": "agent", "role": "user", "initial": true, "text": "context"})
	l := NewLoop(Config{Model: "scripted"}, &model.Gateway{Provider: scriptedFrom(t, `{"content":[{"type":"text","text":"x"}]}`)}, tl, &memLog{})
	if _, err := l.Replay(log.events); err != nil {
		t.Fatal(err)
	}
	want := []model.Message{{Role: model.RoleUser, Content: []model.Block{
		{Type: model.BlockText, Text: "context"},
		{Type: model.BlockText, Text: "Message from the user: one"},
		{Type: model.BlockText, Text: "Message from the user: two"},
	}}}
	if a, b := mustJSON(t, want), mustJSON(t, l.msgs); a != b {
		t.Errorf("replayed conversation:\n%s\nwant\n%s", b, a)
	}
}
