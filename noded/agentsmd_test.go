package noded_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestLargeAgentsMDIsCutNotDropped checks, through a real sandbox, that a
// repository's AGENTS.md larger than the task's first message can hold
// (here about 70 KiB; the guest refuses a read over its limit rather
// than cutting it) reaches the model cut to fit: its head is in the
// context, with a note of what was left out, and the context event
// still fits the log.
func TestLargeAgentsMDIsCutNotDropped(t *testing.T) {
	imageDir := needContainers(t)
	repo := buggyRepo(t)
	big := "AGENTS-HEAD-MARKER: always run go vet.\n" + strings.Repeat("Some long house rules for agents.\n", 2100)
	if err := os.WriteFile(filepath.Join(repo, "AGENTS.md"), []byte(big), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"add", "-A"}, {"-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "long AGENTS.md"}} {
		if out, err := exec.Command("git", append([]string{"-C", repo}, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v %s", args, err, out)
		}
	}
	script := `{"content":[{"type":"tool_use","name":"finish","input":{"summary":"nothing"}}]}`
	c := startAgentNode(t, imageDir, nil, nil)
	id := createScripted(t, c, "large-agents-md", repo, "Add(2, 2) is 0.", script)
	var text string
	var size int
	waitFor(t, "the task's context", 2*time.Minute, func() bool {
		for _, e := range c.events(id) {
			var p struct {
				Initial bool
				Text    string
			}
			if e.GetKind() == "message" && json.Unmarshal(e.GetPayload(), &p) == nil && p.Initial {
				text, size = p.Text, len(e.GetPayload())
				return true
			}
		}
		return false
	})
	if !strings.Contains(text, "The repository's AGENTS.md:\nAGENTS-HEAD-MARKER") {
		t.Errorf("the model's first message lacks the head of the 70 KiB AGENTS.md (%d bytes): %.300q", len(text), text)
	}
	if !strings.Contains(text, "left out") {
		t.Errorf("the first message does not say AGENTS.md was cut (%d bytes)", len(text))
	}
	if size > 64<<10 {
		t.Errorf("the context event is %d bytes, over the log's 64 KiB", size)
	}
}
