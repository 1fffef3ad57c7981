package agent

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

// brokenReads is a sandbox whose reads fail as a transport would (the
// guest's channel gone), not with the guest's answer.
type brokenReads struct{ hostSandbox }

func (brokenReads) ReadFile(context.Context, string, int64) ([]byte, error) {
	return nil, errors.New("guest: open stream: session shutdown")
}

// A read that fails in the sandbox's transport is an error of the step
// (which the node retries, or finds the sandbox gone), not a tool error
// the model would take as its own; a missing file still is the model's.
// Before, read_file and edit_file turned every failure into a tool error.
func TestReadFailuresOfTheSandboxAreNotTheModels(t *testing.T) {
	tl := newRepo(t)
	if r := call(t, tl, ToolReadFile, `{"path":"no/such.go"}`); !r.IsError || !strings.Contains(r.View, "no/such.go") {
		t.Fatalf("a missing file: %+v, want a tool error", r)
	}
	tl.SB = brokenReads{}
	for _, c := range []struct{ tool, input string }{
		{ToolReadFile, `{"path":"calc/calc.go"}`},
		{ToolEditFile, `{"path":"calc/calc.go","old_string":"a - b","new_string":"a + b"}`},
	} {
		r, err := tl.Run(context.Background(), c.tool, json.RawMessage(c.input))
		if err == nil || !strings.Contains(err.Error(), "session shutdown") {
			t.Fatalf("%s with the sandbox's channel gone: %+v, %v; want the error", c.tool, r, err)
		}
	}
}
