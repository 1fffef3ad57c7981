package agent

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/warrenhq/warren/agent/model"
)

// duringCall runs hook(n) inside the n-th model call: the moment a user's
// message reaches the task's log while the call is under way.
type duringCall struct {
	model.Provider
	n    int
	hook func(n int)
}

func (d *duringCall) Call(ctx context.Context, r model.Request) (*model.Response, error) {
	d.n++
	d.hook(d.n)
	return d.Provider.Call(ctx, r)
}

// A message that comes during a model call is on the log before that
// call's model_call, but the live loop gets it after the call (the actor
// Steers between steps), so the model sees it after the turn. A replay
// now gives it there too, by the call's user_messages count. Before, the
// replay put it before the turn, so a resumed task's model saw another
// conversation than the one it had.
func TestAMessageDuringAModelCallIsReplayedAfterIt(t *testing.T) {
	tl := newRepo(t)
	script := `{"content":[{"type":"tool_use","name":"read_file","input":{"path":"go.mod"}}]}
{"content":[{"type":"tool_use","name":"read_file","input":{"path":"calc/calc.go"}}]}
{"content":[{"type":"tool_use","name":"finish","input":{"summary":"done"}}]}
`
	ctx := context.Background()
	log := &memLog{}
	p := &duringCall{Provider: scriptedFrom(t, script), hook: func(n int) {
		if n <= 2 {
			log.Record(ctx, fmt.Sprintf("msg-%d", n), "message", map[string]any{"from": "user", "text": fmt.Sprintf("said during call %d", n)})
		}
	}}
	l := NewLoop(Config{Model: "scripted"}, &model.Gateway{Provider: p}, tl, log)
	if err := l.Start(ctx, Task{IssueTitle: "x"}); err != nil {
		t.Fatal(err)
	}
	for n := 1; n <= 2; n++ {
		if _, err := l.Step(ctx); err != nil {
			t.Fatal(err)
		}
		l.Steer(fmt.Sprintf("said during call %d", n)) // the actor, after the step
		replayMatches(t, fmt.Sprintf("after step %d", n), log, l, script)
	}
	if out, err := l.Step(ctx); err != nil || out == nil || out.Reason != "finished" {
		t.Fatalf("the last step: %+v %v", out, err)
	}
}

// A message that comes during a compaction is given after it: live, the
// model sees it after the summary. A replay dropped it with the history
// the compaction replaced, so a task resumed after it never saw it.
func TestAMessageDuringACompactionIsNotLostOnReplay(t *testing.T) {
	tl := newRepo(t)
	script := `{"content":[{"type":"text","text":"Reading the issue."}]}
{"content":[{"type":"text","text":"The issue is long; nothing done yet."}]}
{"content":[{"type":"tool_use","name":"finish","input":{"summary":"nothing to change"}}]}
`
	ctx := context.Background()
	log := &memLog{}
	p := &duringCall{Provider: scriptedFrom(t, script), hook: func(n int) {
		if n == 2 {
			log.Record(ctx, "msg", "message", map[string]any{"from": "user", "text": "SAID DURING THE COMPACTION"})
		}
	}}
	cfg := Config{Model: "scripted", ContextWindow: 6000, CompactAt: 0.8}
	l := NewLoop(cfg, &model.Gateway{Provider: p}, tl, log)
	if err := l.Start(ctx, Task{IssueTitle: "long", IssueBody: strings.Repeat("the report goes on. ", 1500)}); err != nil {
		t.Fatal(err)
	}
	for n := 1; n <= 2; n++ {
		if _, err := l.Step(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if !l.compactedLast {
		t.Fatalf("step 2 was not a compaction: %s", log.kinds())
	}
	l.Steer("SAID DURING THE COMPACTION")
	l2 := replayMatches(t, "after the compaction", log, l, script)
	if !strings.Contains(mustJSON(t, l2.msgs), "SAID DURING THE COMPACTION") {
		t.Fatalf("the replayed conversation lost the message; after the task's context it is %s", mustJSON(t, l2.msgs[1:]))
	}
}

// replayMatches replays log into a new loop and checks that its
// conversation is the live loop's.
func replayMatches(t *testing.T, when string, log *memLog, live *Loop, script string) *Loop {
	t.Helper()
	l2 := NewLoop(live.cfg, &model.Gateway{Provider: scriptedFrom(t, script)}, live.tools, &memLog{})
	if _, err := l2.Replay(log.events); err != nil {
		t.Fatal(err)
	}
	if a, b := mustJSON(t, live.msgs), mustJSON(t, l2.msgs); a != b {
		// After the task's context, which is long and the same.
		t.Errorf("%s: live and replayed conversations differ:\n%s\n%s", when, mustJSON(t, live.msgs[1:]), mustJSON(t, l2.msgs[1:]))
	}
	if live.given != l2.given {
		t.Errorf("%s: the live loop was given %d messages, the replay %d", when, live.given, l2.given)
	}
	checkConversation(t, l2.msgs)
	return l2
}
