package scheduler

import "slices"

// A finishing task's tests run in a verification sandbox of their own,
// beside the task's sandbox (noded/verify.go), so for that while the task
// holds about twice its needs on its node. The node reports such tasks in
// each heartbeat (Heartbeat.verifying); the leader keeps the last report on
// the node's session, in memory only, like the warm counts (warm.go), and
// placement counts each reported task's needs a second time in the node's
// allocation. Without it a node full of tasks that finish at once held
// twice what placement believed. A report names only tasks the node runs:
// one whose lease is elsewhere, or that has ended, is not counted.

// maxVerifyingPerNode bounds the reported tasks used per node: a node has
// no more tasks than that, and a longer report is not trusted further.
const maxVerifyingPerNode = 1024

// verifyingReport keeps a heartbeat's report (at most maxVerifyingPerNode
// tasks, nil when empty); the slice is the session's from then on.
func verifyingReport(v []string) []string {
	if len(v) == 0 {
		return nil
	}
	return slices.Clone(v[:min(len(v), maxVerifyingPerNode)])
}

// verifyingOn returns, per node with an open session, the tasks its last
// heartbeat reported holding a verification sandbox. The slices are the
// sessions' and must not be modified.
func (h *sessions) verifyingOn() map[string][]string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out map[string][]string
	for node, c := range h.byNode {
		if c == nil || len(c.verifying) == 0 || c.isClosed() {
			continue
		}
		if out == nil {
			out = map[string][]string{}
		}
		out[node] = c.verifying
	}
	return out
}

// addVerifying adds to each node's allocation the needs of the tasks it
// reported verifying, for those whose lease is on that node and that have
// not ended (read through task).
func addVerifying(pn []PlacementNode, on map[string][]string, task func(id string) (node string, needs Resources, live bool)) {
	if len(on) == 0 {
		return
	}
	for i := range pn {
		for _, id := range on[pn[i].ID] {
			node, needs, live := task(id)
			if !live || node != pn[i].ID {
				continue
			}
			pn[i].Allocated.MilliCPU += needs.MilliCPU
			pn[i].Allocated.MemoryBytes += needs.MemoryBytes
		}
	}
}

// verifyingTask is addVerifying's view of a task in the FSM.
func (s *Server) verifyingTask(id string) (string, Resources, bool) {
	t, err := s.fsm.Task(id)
	if err != nil || Terminal(t.GetState()) {
		return "", Resources{}, false
	}
	n := TaskNeeds(t.GetSpec())
	return t.GetLease().GetNode(), Resources{MilliCPU: n.GetMilliCpu(), MemoryBytes: n.GetMemoryBytes()}, true
}
