package netpolicy

import (
	"cmp"
	"net/netip"
	"slices"
	"strconv"
)

// AuditEvent is one destination or name a sandbox tried, with how many
// times since the last report.
type AuditEvent struct {
	Verdict string `json:"verdict"` // "allow" or "deny"
	Kind    string `json:"kind"`    // "connect" (a new connection or packet flow), "dns" (a lookup) or "audit_full" (an audit set full: attempts past it not recorded; Reason says which)
	Addr    string `json:"addr,omitempty"`
	Proto   string `json:"proto,omitempty"` // "tcp", "udp", "icmp", "ipv6-icmp" or the protocol number
	Port    int    `json:"port,omitempty"`
	Name    string `json:"name,omitempty"`   // the name looked up (dns); "" sums the lookups past the names a sandbox's backlog holds
	Reason  string `json:"reason,omitempty"` // why a lookup was denied or cut
	Count   uint64 `json:"count"`            // packets that opened connections, or lookups
}

// AuditBatch is one sandbox's report for one interval.
type AuditBatch struct {
	Events []AuditEvent `json:"events"`
	// Omitted counts the events that did not fit under MaxAuditEvents
	// (OmittedCount attempts); they come in a later batch.
	Omitted      int    `json:"omitted,omitempty"`
	OmittedCount uint64 `json:"omitted_count,omitempty"`
}

// MaxAuditEvents bounds one sandbox's report per interval.
const MaxAuditEvents = 32

type attemptKey struct {
	allowed bool
	addr    netip.Addr
	proto   uint8
	port    uint16
}

func protoName(p uint8) string {
	switch p {
	case 1:
		return "icmp"
	case 6:
		return "tcp"
	case 17:
		return "udp"
	case 58:
		return "ipv6-icmp"
	}
	return strconv.Itoa(int(p))
}

// summarise turns the audit sets' current counters into events for what
// changed since seen (which it updates), adds the pending events (resolver
// decisions and audit_full notes), and caps the batch at MaxAuditEvents:
// denials first, but a quarter of the places kept for allowances, so
// neither starves the other; within each, what was never reported first,
// then the most attempts. What does not fit is not lost: it stays
// unreported (seen is not advanced for it, and its pending events come
// back as leftover) and goes in a later batch; Omitted says how much waits.
func summarise(seen map[attemptKey]uint64, now []Attempt, pending []AuditEvent) (AuditBatch, []AuditEvent) {
	type item struct {
		ev   AuditEvent
		key  *attemptKey // connect events: the counter to advance when reported
		pkts uint64
		// fresh: never reported (a destination not in seen, or a pending
		// event, which waited already). Fresh events go first: sorted by
		// count alone, a destination tried once waited behind 32 others a
		// sandbox kept trying, until it left its set unreported.
		fresh bool
	}
	var items []item
	live := make(map[attemptKey]bool, len(now))
	for _, a := range now {
		k := attemptKey{a.Allowed, a.Addr, a.Proto, a.Port}
		live[k] = true
		prev, ok := seen[k]
		delta := a.Packets
		if ok && a.Packets >= prev {
			delta = a.Packets - prev
		}
		if delta == 0 && ok {
			continue
		}
		if delta == 0 {
			delta = 1 // counted before its counter was
		}
		v := "deny"
		if a.Allowed {
			v = "allow"
		}
		items = append(items, item{ev: AuditEvent{Verdict: v, Kind: "connect", Addr: a.Addr.String(), Proto: protoName(a.Proto), Port: int(a.Port), Count: delta}, key: &k, pkts: a.Packets, fresh: !ok})
	}
	for k := range seen {
		if !live[k] {
			delete(seen, k) // expired from its set
		}
	}
	for _, e := range pending {
		items = append(items, item{ev: e, fresh: true})
	}
	slices.SortStableFunc(items, func(a, b item) int {
		if af, bf := a.ev.Kind == "audit_full", b.ev.Kind == "audit_full"; af != bf {
			if af {
				return -1 // first: it says the others are not all there
			}
			return 1
		}
		if a.ev.Verdict != b.ev.Verdict {
			if a.ev.Verdict == "deny" {
				return -1
			}
			return 1
		}
		if a.fresh != b.fresh {
			if a.fresh {
				return -1
			}
			return 1
		}
		return cmp.Compare(b.ev.Count, a.ev.Count)
	})
	// Denials take at most three quarters of the places while allowances
	// wait; then whatever is left fills the rest.
	var denies, allows []item
	for _, it := range items {
		if it.ev.Verdict == "deny" {
			denies = append(denies, it)
		} else {
			allows = append(allows, it)
		}
	}
	nd := min(len(denies), max(MaxAuditEvents*3/4, MaxAuditEvents-len(allows)))
	na := min(len(allows), MaxAuditEvents-nd)
	var b AuditBatch
	var leftover []AuditEvent
	take := func(its []item, n int) {
		for i, it := range its {
			if i < n {
				b.Events = append(b.Events, it.ev)
				if it.key != nil {
					seen[*it.key] = it.pkts
				}
				continue
			}
			b.Omitted++
			b.OmittedCount += it.ev.Count
			if it.key == nil {
				leftover = append(leftover, it.ev)
			}
		}
	}
	take(denies, nd)
	take(allows, na)
	return b, leftover
}
