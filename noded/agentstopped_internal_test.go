package noded

import (
	"strings"
	"testing"

	"github.com/warrenhq/warren/agent"
	"github.com/warrenhq/warren/agent/model"
)

// The reason a task's loop stopped with goes on the task's last event
// cut like any failed task's reason: a model error's can carry whatever
// a provider sent. Before, agentOutcome recorded it whole.
func TestAgentStoppedReasonIsCut(t *testing.T) {
	he := &model.HTTPError{Provider: "openai", Status: 400, Type: strings.Repeat("t", 1<<20), Message: "no"}
	out := &agent.Outcome{Reason: "model_error: " + he.Error(), Spent: agent.Spent{Steps: 3}}
	m := agentStopped(out)
	reason, _ := m.payload["reason"].(string)
	if len(reason) > 1000+len("…") || len(m.why) > 1000+len("…") || !strings.HasPrefix(reason, "model_error: openai: HTTP 400 ttt") {
		t.Errorf("a reason of %d bytes (why: %d), starting %q; want it cut to 1000", len(reason), len(m.why), reason[:min(len(reason), 40)])
	}
	if m.payload["to"] != "failed" || m.payload["spent"] != out.Spent || m.key != "agent/stopped" {
		t.Errorf("end %+v", m)
	}
	if short := agentStopped(&agent.Outcome{Reason: "max_steps"}); short.payload["reason"] != "max_steps" || short.why != "max_steps" {
		t.Errorf("a short reason changed: %+v", short)
	}
}
