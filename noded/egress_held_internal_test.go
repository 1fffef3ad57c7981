package noded

import (
	"log/slog"
	"testing"

	"github.com/warrenhq/warren/netpolicy"
)

// What is held for a re-adopted sandbox is bounded (past maxHeld batches
// only counted), delivered in order when its id is bound, and dropped by
// unbind when no actor binds it.
func TestHeldAuditIsBoundedAndDroppedByUnbind(t *testing.T) {
	e := &Egress{log: slog.New(slog.DiscardHandler), sinks: map[string]func(netpolicy.AuditBatch){}, held: map[string][]netpolicy.AuditBatch{}}
	batch := func(port int) netpolicy.AuditBatch {
		return netpolicy.AuditBatch{Events: []netpolicy.AuditEvent{{Verdict: "deny", Kind: "connect", Addr: "198.51.100.1", Proto: "tcp", Port: port, Count: 2}}}
	}
	e.held["task-a-e1"] = []netpolicy.AuditBatch{} // as Reattach holds
	e.held["task-b-e1-verify-0"] = []netpolicy.AuditBatch{}
	for i := range maxHeld + 5 {
		e.audit("task-a-e1", batch(i))
	}
	e.audit("task-b-e1-verify-0", batch(1))
	var got []netpolicy.AuditBatch
	e.route("task-a-e1", func(b netpolicy.AuditBatch) { got = append(got, b) })
	e.audit("task-a-e1", batch(9999))
	if len(got) != maxHeld+1 {
		t.Fatalf("%d batches delivered, want %d held and the next", len(got), maxHeld+1)
	}
	for i, b := range got[:maxHeld] {
		if b.Events[0].Port != i {
			t.Fatalf("batch %d is port %d: out of order", i, b.Events[0].Port)
		}
	}
	if last := got[maxHeld-1]; last.Omitted != 5 || last.OmittedCount != 10 {
		t.Errorf("past the cap: omitted %d (%d attempts), want 5 (10)", last.Omitted, last.OmittedCount)
	}
	if got[maxHeld].Events[0].Port != 9999 {
		t.Errorf("the report after the bind is port %d", got[maxHeld].Events[0].Port)
	}
	e.unbind("task-b-e1-verify-0")
	if len(e.held) != 0 {
		t.Errorf("held after bind and unbind: %v", e.held)
	}
}
