package noded

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/warrenhq/warren/agent"
	"github.com/warrenhq/warren/agent/model"
)

// readsFail is a sandbox whose file reads fail as a transport would (the
// guest's channel gone): the sandbox's failure, which the actor retries.
type readsFail struct{}

func (readsFail) Exec(context.Context, []string, string, time.Duration) (agent.ExecResult, error) {
	return agent.ExecResult{ExitCode: 1}, nil
}
func (readsFail) ReadFile(context.Context, string, int64) ([]byte, error) {
	return nil, errors.New("guest: open stream: session shutdown")
}
func (readsFail) WriteFile(context.Context, string, []byte) error { return nil }

type discardLog struct{}

func (discardLog) Record(context.Context, string, string, any) error { return nil }

// stepError runs a loop on script until a step fails, and returns that
// error.
func stepError(t *testing.T, script string) error {
	t.Helper()
	p, err := model.ParseScripted("script", []byte(script))
	if err != nil {
		t.Fatal(err)
	}
	l := agent.NewLoop(agent.Config{Model: "scripted"}, &model.Gateway{Provider: p}, &agent.Tools{SB: readsFail{}, Root: "/work/repo"}, discardLog{})
	if err := l.Start(context.Background(), agent.Task{IssueTitle: "x"}); err != nil {
		t.Fatal(err)
	}
	for range 10 {
		out, err := l.Step(context.Background())
		if err != nil {
			return err
		}
		if out != nil {
			t.Fatalf("the loop ended: %+v", out)
		}
	}
	t.Fatal("no step failed")
	return nil
}

// A step error is the model's (the task fails with a model_error) by its
// type, not its text. Before, any error with "scripted:" in it was the
// model's: a sandbox failure while reading a file the model named
// "scripted:x" failed the task instead of being retried.
func TestModelFailedGoesByTheErrorsType(t *testing.T) {
	sandbox := stepError(t, `{"content":[{"type":"tool_use","name":"read_file","input":{"path":"scripted:x"}}]}`)
	ranOut := stepError(t, `{"content":[{"type":"text","text":"thinking"}]}`)
	for _, c := range []struct {
		name string
		err  error
		want bool
	}{
		{"a sandbox failure on the path scripted:x", sandbox, false},
		{"a script that ran out", ranOut, true},
		{"a malformed response", fmt.Errorf("step 1: %w", model.ErrMalformed), true},
		{"a 400", fmt.Errorf("step 1: %w", &model.HTTPError{Provider: "openai", Status: 400}), true},
		{"a 500 after the retries", fmt.Errorf("step 1: %w", &model.HTTPError{Provider: "openai", Status: 500}), false},
	} {
		if got := modelFailed(c.err); got != c.want {
			t.Errorf("%s (%v): modelFailed %v, want %v", c.name, c.err, got, c.want)
		}
	}
	if !strings.Contains(sandbox.Error(), "scripted:x") || !strings.Contains(sandbox.Error(), "session shutdown") {
		t.Errorf("the sandbox's error: %v; want it to name the path and the failure", sandbox)
	}
	if !strings.Contains(ranOut.Error(), "scripted: script has 1 turns") {
		t.Errorf("the script's error: %v; want its message as before", ranOut)
	}
}

// A task's end reason is cut at a character, not inside one: the reason
// is an event's text, and a cut character left bytes that are not UTF-8.
func TestFailedReasonCutsAtACharacter(t *testing.T) {
	long := "xy" + strings.Repeat("€", 500) // € is 3 bytes: byte 1,000 is inside one
	got := failedReason(long)
	if !utf8.ValidString(got) || len(got) > 1000+len("…") || !strings.HasSuffix(got, "…") {
		t.Fatalf("failedReason cut to %d bytes, valid UTF-8 %v", len(got), utf8.ValidString(got))
	}
}
