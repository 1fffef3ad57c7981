package netpolicy

import (
	"fmt"
	"testing"
)

// A flood of distinct names between two reports fills the resolver's
// backlog; the lookups past it are still counted, in events without a
// name, so the audit's counts add up to every lookup made.
func TestDNSBacklogKeepsCount(t *testing.T) {
	s := &Sandbox{seen: map[attemptKey]uint64{}}
	const names = 3 * maxPendingDNS
	for i := range names {
		s.noteDNS(AuditEvent{Verdict: "deny", Kind: "dns", Name: fmt.Sprintf("n%d.example.", i), Reason: "not on the allowlist"})
	}
	s.noteDNS(AuditEvent{Verdict: "allow", Kind: "dns", Name: "allowed.example."})
	if len(s.pending) > maxPendingDNS+2 {
		t.Fatalf("%d decisions kept; the backlog holds %d, plus one unnamed event per verdict and reason", len(s.pending), maxPendingDNS)
	}
	var named, unnamed, allowed uint64
	for range 100 {
		b, left := summarise(s.seen, nil, s.pending)
		s.pending = left
		for _, e := range b.Events {
			switch {
			case e.Verdict == "allow":
				allowed += e.Count
			case e.Name == "":
				unnamed += e.Count
			default:
				named += e.Count
			}
		}
		if b.Omitted == 0 {
			break
		}
	}
	if named != maxPendingDNS || unnamed != names-maxPendingDNS || allowed != 1 {
		t.Errorf("%d denied lookups and 1 allowed: reported %d by name, %d without, %d allowed; want %d, %d, 1",
			names, named, unnamed, allowed, maxPendingDNS, names-maxPendingDNS)
	}
}
