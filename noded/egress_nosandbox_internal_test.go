package noded

import (
	"context"
	"strings"
	"testing"

	"github.com/warrenhq/warren/netpolicy"
	"github.com/warrenhq/warren/noded/driver/sim"
)

// A task's sandbox went away (sandboxGone) while egress batches were still
// queued: its own audit's and a verification sandbox's. The actor has no
// sandbox until the next claim; when the task ends first (a cancel read
// before the claim, or a claim refused for good), the batches still land
// before its last event (docs/egress.md: every attempt is on the log
// before the task's last event), each naming its sandbox.
func TestQueuedEgressIsRecordedWhenTheSandboxIsGone(t *testing.T) {
	d, id := pendingTaskOnNode(t, sim.New(sim.Config{}), "egress-no-sandbox")
	ctx := context.Background()
	batch := func(addr string) netpolicy.AuditBatch {
		return netpolicy.AuditBatch{Events: []netpolicy.AuditEvent{{Verdict: "deny", Kind: "connect", Addr: addr, Proto: "tcp", Port: 443, Count: 1}}}
	}
	// After sandboxGone: Stopped set a.sb to nil; the gone sandbox's
	// batch and a verification sandbox's are still queued.
	a := &taskActor{d: d, id: id, epoch: 0, ctx: ctx, sb: nil}
	a.egressQ = []egressBatch{{b: batch("198.51.100.1"), sandbox: id + "-e0"}, {b: batch("198.51.100.2"), sandbox: id + "-e0-verify-0"}}
	if err := a.flushBeforeLast(); err != nil {
		t.Fatal(err)
	}
	// What stopAtBoundary appends next: the task's last event.
	if _, err := a.append(ctx, "cancelled", ev("state_changed", map[string]any{"to": "cancelled", "reason": "cancel requested"})); err != nil {
		t.Fatal(err)
	}
	egress := egressPayloads(t, d, id)
	if len(egress) != 2 {
		t.Errorf("flushBeforeLast returned nil (lastFlushed %v) and the task's last event went on the log with %d of its 2 queued egress batches (%d still queued, %d pending): %s",
			a.lastFlushed, len(egress), len(a.egressQ), len(a.egressPending), strings.Join(egress, "; "))
	}
}
