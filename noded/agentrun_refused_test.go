package noded

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/warrenhq/warren/agent"
)

// A tool call the guest refuses because of the model's input is a tool
// error the model sees, not a sandbox failure: those are retried by the
// task actor until it gives up (10 minutes) and fails the task.
func TestToolCallsTheGuestRefusesAreToolErrors(t *testing.T) {
	box := newAgentBox(t, "sb-refused")
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "pkg"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "go.mod"), []byte("module demo\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tools := &agent.Tools{SB: agentSandbox{ia: box}, Root: root}
	for _, c := range []struct{ tool, input, want string }{
		{agent.ToolWriteFile, `{"path":"pkg","content":"x"}`, "is a directory"},
		{agent.ToolWriteFile, `{"path":"go.mod/x","content":"x"}`, "go.mod"},
		{agent.ToolListFiles, `{"path":"nope"}`, "nope"},
		{agent.ToolListFiles, `{"path":"go.mod"}`, "go.mod"},
		{agent.ToolRunCommand, `{"command":"echo a\u0000b"}`, "NUL"},
		{agent.ToolSearch, `{"pattern":"a\u0000b"}`, "NUL"},
	} {
		res, err := tools.Run(context.Background(), c.tool, json.RawMessage(c.input))
		if err != nil {
			t.Errorf("%s %s: a sandbox error (retried until the task fails): %v", c.tool, c.input, err)
			continue
		}
		if !res.IsError || !strings.Contains(res.View, c.want) {
			t.Errorf("%s %s: %+v, want a tool error mentioning %q", c.tool, c.input, res, c.want)
		}
	}
}
