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
	Kind    string `json:"kind"`    // "connect" (a new connection or packet flow) or "dns" (a lookup)
	Addr    string `json:"addr,omitempty"`
	Proto   string `json:"proto,omitempty"` // "tcp", "udp", "icmp", "ipv6-icmp" or the protocol number
	Port    int    `json:"port,omitempty"`
	Name    string `json:"name,omitempty"`   // the name looked up (dns)
	Reason  string `json:"reason,omitempty"` // why a lookup was denied or cut
	Count   uint64 `json:"count"`            // packets that opened connections, or lookups
}

// AuditBatch is one sandbox's report for one interval.
type AuditBatch struct {
	Events []AuditEvent `json:"events"`
	// Omitted counts the events past MaxAuditEvents, summed into
	// OmittedCount attempts; denials are reported before allowances.
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
// changed since seen (which it updates), adds the resolver's events, and
// caps the batch.
func summarise(seen map[attemptKey]uint64, now []Attempt, dns []AuditEvent) AuditBatch {
	var evs []AuditEvent
	live := make(map[attemptKey]bool, len(now))
	for _, a := range now {
		k := attemptKey{a.Allowed, a.Addr, a.Proto, a.Port}
		live[k] = true
		prev, ok := seen[k]
		delta := a.Packets
		if ok && a.Packets >= prev {
			delta = a.Packets - prev
		}
		seen[k] = a.Packets
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
		evs = append(evs, AuditEvent{Verdict: v, Kind: "connect", Addr: a.Addr.String(), Proto: protoName(a.Proto), Port: int(a.Port), Count: delta})
	}
	for k := range seen {
		if !live[k] {
			delete(seen, k) // expired from its set
		}
	}
	evs = append(evs, dns...)
	slices.SortStableFunc(evs, func(a, b AuditEvent) int {
		if a.Verdict != b.Verdict {
			if a.Verdict == "deny" {
				return -1
			}
			return 1
		}
		return cmp.Compare(b.Count, a.Count)
	})
	b := AuditBatch{Events: evs}
	if len(evs) > MaxAuditEvents {
		b.Events = evs[:MaxAuditEvents]
		for _, e := range evs[MaxAuditEvents:] {
			b.Omitted++
			b.OmittedCount += e.Count
		}
	}
	return b
}
