package agent

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warrenhq/warren/agent/model"
)

// brokenOnce is a TEST DOUBLE of the node's sandbox whose first command
// appending to notes.txt runs and then fails as a broken guest channel would:
// the command's effects are in the workspace, its result is lost.
type brokenOnce struct {
	hostSandbox
	mu     sync.Mutex
	broken bool
}

func (s *brokenOnce) Exec(ctx context.Context, argv []string, dir string, timeout time.Duration) (ExecResult, error) {
	res, err := s.hostSandbox.Exec(ctx, argv, dir, timeout)
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.broken && strings.Contains(strings.Join(argv, " "), ">> notes.txt") {
		s.broken = true
		return ExecResult{}, errors.New("guest: connection reset (a test double's broken channel)")
	}
	return res, err
}

const appendScript = `{"content":[{"type":"tool_use","name":"run_command","input":{"command":"echo first > notes.txt"}}]}
{"content":[{"type":"tool_use","name":"run_command","input":{"command":"echo x >> notes.txt"}}]}
{"content":[{"type":"tool_use","name":"finish","input":{"summary":"done"}}]}
`

// A command whose step failed after it ran (its result lost) is run again
// on the workspace as it was before its first try: the last checkpoint is
// put back first, as a resume on another node does. Before, the step was
// tried again on what the first try left, so `echo x >> notes.txt` left
// two lines.
func TestACallWhoseStepFailedIsRunAgainOnTheWorkspaceBeforeIt(t *testing.T) {
	tl := newRepo(t)
	tl.SB = &brokenOnce{}
	ctx := context.Background()
	if err := tl.InitBase(ctx); err != nil {
		t.Fatal(err)
	}
	l := NewLoop(Config{Model: "scripted", Checkpoints: true}, &model.Gateway{Provider: scriptedFrom(t, appendScript)}, tl, &memLog{})
	if err := l.Start(ctx, Task{IssueTitle: "x"}); err != nil {
		t.Fatal(err)
	}
	failed := 0
	var out *Outcome
	for i := 0; out == nil && i < 10; i++ {
		var err error
		if out, err = l.Step(ctx); err != nil {
			failed++
		}
	}
	if out == nil || out.Reason != "finished" || failed != 1 {
		t.Fatalf("outcome %+v after %d failed steps, want finished after 1", out, failed)
	}
	b, err := os.ReadFile(filepath.Join(tl.Root, "notes.txt"))
	if err != nil || string(b) != "first\nx\n" {
		t.Fatalf("notes.txt = %q (%v), want the first line and one x", b, err)
	}
}

// Where the workspace cannot be put back (no checkpoints), the call is not
// run again: the model is told it may have run in part.
func TestACallWhoseStepFailedIsNotRunAgainWithoutCheckpoints(t *testing.T) {
	tl := newRepo(t)
	tl.SB = &brokenOnce{}
	ctx := context.Background()
	log := &memLog{}
	l := NewLoop(Config{Model: "scripted"}, &model.Gateway{Provider: scriptedFrom(t, appendScript)}, tl, log)
	if err := l.Start(ctx, Task{IssueTitle: "x"}); err != nil {
		t.Fatal(err)
	}
	var out *Outcome
	for i := 0; out == nil && i < 10; i++ {
		out, _ = l.Step(ctx)
	}
	if out == nil || out.Reason != "finished" {
		t.Fatalf("outcome %+v", out)
	}
	b, _ := os.ReadFile(filepath.Join(tl.Root, "notes.txt"))
	if string(b) != "first\nx\n" {
		t.Fatalf("notes.txt = %q, want the call run once", b)
	}
	told := false
	for _, e := range log.events {
		if e.Kind == "tool_result" && strings.Contains(string(e.Payload), "may have run in full, in part or not at all") {
			told = true
		}
	}
	if !told {
		t.Error("no tool_result tells the model the call may have run in part")
	}
}
