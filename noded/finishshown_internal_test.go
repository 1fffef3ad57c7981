package noded

import (
	"strings"
	"testing"

	"github.com/warrenhq/warren/agent"
	"github.com/warrenhq/warren/api"
)

// The finish the task's last event carries fits in the log's 64 KiB
// with a failed task's reason, whatever its length or bytes (each `<`,
// `&` or control character takes six bytes once escaped), and a short
// one is carried as it is. Before, it was carried whole.
func TestTheEndsFinishFits(t *testing.T) {
	const n = 1 << 20
	for _, tc := range []struct {
		name string
		f    *agent.Finish
	}{
		{"long", &agent.Finish{Summary: strings.Repeat("x", n), Cause: strings.Repeat("y", n), Fix: strings.Repeat("z", n)}},
		{"escaped", &agent.Finish{Summary: strings.Repeat("<", n), Cause: strings.Repeat("\x01", n), Fix: strings.Repeat("&", n)}},
		{"not UTF-8", &agent.Finish{Summary: strings.Repeat("\xff", n), Cause: strings.Repeat("\u2028", n), Fix: strings.Repeat(">", n)}},
	} {
		shown := finishShown(tc.f)
		p := ev("state_changed", map[string]any{"to": "failed", "reason": failedReason(strings.Repeat("<", n)), "finish": shown,
			"spent": agent.Spent{Steps: 1 << 30}, "pull_request": map[string]any{"forge": "github", "head": "agent/01M8", "base": "main"}})
		if len(p.Payload) > api.MaxEventPayloadBytes {
			t.Errorf("%s: the end's payload takes %d bytes, over %d", tc.name, len(p.Payload), api.MaxEventPayloadBytes)
		}
		if !strings.HasPrefix(tc.f.Summary, strings.TrimSuffix(shown.Summary, "…")) || !strings.HasSuffix(shown.Summary, "…") {
			t.Errorf("%s: the summary shown starts %.20q", tc.name, shown.Summary)
		}
	}
	short := &agent.Finish{Summary: "Add adds now.", Cause: "a - b", Fix: "a + b"}
	if got := finishShown(short); *got != *short {
		t.Errorf("a short finish became %+v", got)
	}
	if finishShown(nil) != nil {
		t.Error("no finish became one")
	}
}
