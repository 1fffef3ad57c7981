package scheduler

import "maps"

// DefaultTemplate is the template a node claims a sandbox of for a task
// whose spec names none: the drivers resolve "" to it (the microvm
// driver's Config.DefaultTemplate, which `warren node` leaves at
// "default"), and their pools report its warm sandboxes under it. Placement
// looks the warm sandboxes of such a task up under this name.
const DefaultTemplate = "default"

// warmTemplate is the template whose warm sandboxes t can use.
func warmTemplate(t *PendingTask) string { return specWarmTemplate(t.Template) }

// specWarmTemplate is the template whose warm sandboxes a task whose spec
// names template can use.
func specWarmTemplate(template string) string {
	if template == "" {
		return DefaultTemplate
	}
	return template
}

// Where placement's warm counts come from: every heartbeat carries the
// node's ready warm sandboxes per template, and the leader keeps the last
// on the node's session, in memory only. They change with every claim and
// refill, and a new leader hears them again within a heartbeat, so they
// never go through raft; and a change does not start a placement round by
// itself, it only informs the next one. A session that ended or was cut
// (the node was declared down, or left, or leadership moved) takes its
// counts with it. Within a round, each warm placement uses up a slot
// (Place); across rounds, the tasks placed on a node and not started yet
// count against its report (discountStarting), since the report may
// predate their claims.

// warmCounts converts a heartbeat's warm counts, leaving out zeros; nil
// when there are none.
func warmCounts(w map[string]uint32) map[string]int {
	var out map[string]int
	for t, n := range w {
		if n == 0 {
			continue
		}
		if out == nil {
			out = make(map[string]int, len(w))
		}
		out[t] = int(n)
	}
	return out
}

// sameWarm reports whether a heartbeat's warm counts w are those of have
// (as warmCounts would make them), so an unchanged report allocates
// nothing.
func sameWarm(have map[string]int, w map[string]uint32) bool {
	n := 0
	for t, c := range w {
		if c == 0 {
			continue
		}
		if have[t] != int(c) {
			return false
		}
		n++
	}
	return n == len(have)
}

// fillWarm sets each node's WarmTemplates to what its open session last
// reported, nil for a node without one. The maps are shared, not copied:
// nobody modifies them (Place only reads its nodes). One lock for the
// whole list, no allocation.
func (h *sessions) fillWarm(pn []PlacementNode) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for i := range pn {
		pn[i].WarmTemplates = nil
		if c := h.byNode[pn[i].ID]; c != nil && !c.isClosed() {
			pn[i].WarmTemplates = c.warm
		}
	}
}

// isClosed reports whether c was closed (cut by the leader, or ended): a
// node declared down keeps its session attached until the handler sees
// the close, and its warm counts must not count meanwhile.
func (c *session) isClosed() bool {
	select {
	case <-c.closed:
		return true
	default:
		return false
	}
}

// nodeTemplate names one node's warm sandboxes of one template.
type nodeTemplate struct{ node, template string }

// discountStarting takes from each node's warm counts the tasks placed
// there that have not started (starting, per node and the template whose
// warm sandboxes they claim): a claim takes a warm sandbox whenever one is
// ready, and the node's last report may predate it. Rounds come every
// 20 ms while a burst lasts and a report every 500 ms, so without this a
// node with one warm sandbox drew a task each round. A count that may
// be low instead (the claim was reported, the task not yet running) only
// makes a task go cold. A node with nothing to discount keeps its map; one
// with something gets a new one (the session's is shared).
func discountStarting(pn []PlacementNode, starting map[nodeTemplate]int) {
	for i := range pn {
		w := pn[i].WarmTemplates
		var out map[string]int
		for t, n := range w {
			k := starting[nodeTemplate{pn[i].ID, t}]
			if k == 0 {
				continue
			}
			if out == nil {
				out = maps.Clone(w)
			}
			if n <= k {
				delete(out, t)
			} else {
				out[t] = n - k
			}
		}
		if out != nil {
			pn[i].WarmTemplates = out
		}
	}
}
