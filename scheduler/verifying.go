package scheduler

// A finishing task's tests run in a verification sandbox of their own,
// beside the task's sandbox (noded/verify.go), so for that while the task
// holds about twice its needs on its node. The node reports such tasks in
// each heartbeat (Heartbeat.verifying); the leader keeps the last report on
// the node's session, in memory only, like the warm counts (warm.go), and
// past the session's end until the node attaches again, and placement
// counts each reported task's needs a second time in the node's
// allocation. Without it a node full of tasks that finish at once held
// twice what placement believed. A report names only tasks the node runs:
// one whose lease is elsewhere, or that has ended, is not counted.

// maxVerifyingPerNode bounds the reported tasks used per node: a node has
// no more tasks than that, and a longer report is not trusted further.
const maxVerifyingPerNode = 1024

// verifyingReport keeps a heartbeat's report: the task ids in it, each
// once, at most maxVerifyingPerNode (nil when none). The slice is the
// session's from then on.
func verifyingReport(v []string) []string {
	var out []string
	seen := map[string]bool{}
	for _, id := range v {
		if len(out) == maxVerifyingPerNode {
			break
		}
		if isTaskID(id) && !seen[id] {
			seen[id] = true
			out = append(out, id)
		}
	}
	return out
}

// lostAny reports whether a report names fewer tasks than the one before
// it: some task's verification sandbox went, and its room came back.
func lostAny(before, after []string) bool {
	if len(before) == 0 {
		return false
	}
	now := make(map[string]bool, len(after))
	for _, id := range after {
		now[id] = true
	}
	for _, id := range before {
		if !now[id] {
			return true
		}
	}
	return false
}

// verifyingOn returns, per node, the tasks its last heartbeat reported
// holding a verification sandbox: its session's, or, once that ended,
// the last one's until the node attaches again (sessions.kept). The
// slices are the sessions' and must not be modified.
func (h *sessions) verifyingOn() map[string][]string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out map[string][]string
	add := func(node string, v []string) {
		if len(v) == 0 {
			return
		}
		if out == nil {
			out = map[string][]string{}
		}
		out[node] = v
	}
	for node, v := range h.kept {
		add(node, v)
	}
	for node, c := range h.byNode {
		if c != nil {
			add(node, c.verifying) // a closed one's too: detach keeps it
		}
	}
	return out
}

// verifyingExtra sums, per node, the needs of the tasks it reported
// verifying, for those whose lease is on that node and that have not ended
// (read through task, once each).
func verifyingExtra(on map[string][]string, task func(id string) (node string, needs Resources, live bool)) map[string]Resources {
	var out map[string]Resources
	for node, ids := range on {
		for _, id := range ids {
			n, needs, live := task(id)
			if !live || n != node {
				continue
			}
			if out == nil {
				out = map[string]Resources{}
			}
			r := out[node]
			r.MilliCPU += needs.MilliCPU
			r.MemoryBytes += needs.MemoryBytes
			out[node] = r
		}
	}
	return out
}

// addExtra adds extra (verifyingExtra's) to the nodes' allocations.
func addExtra(pn []PlacementNode, extra map[string]Resources) {
	if len(extra) == 0 {
		return
	}
	for i := range pn {
		r := extra[pn[i].ID]
		pn[i].Allocated.MilliCPU += r.MilliCPU
		pn[i].Allocated.MemoryBytes += r.MemoryBytes
	}
}

// verifyingTask is verifyingExtra's view of a task in the FSM.
func (s *Server) verifyingTask(id string) (string, Resources, bool) {
	t, err := s.fsm.Task(id)
	if err != nil || Terminal(t.GetState()) {
		return "", Resources{}, false
	}
	n := TaskNeeds(t.GetSpec())
	return t.GetLease().GetNode(), Resources{MilliCPU: n.GetMilliCpu(), MemoryBytes: n.GetMemoryBytes()}, true
}
