package scheduler

import (
	"math/rand/v2"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/types/known/timestamppb"

	fsmv1 "github.com/warrenhq/warren/api/gen/warren/fsm/v1"
	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
)

// Placement loop tuning.
const (
	defaultPlacementInterval = 20 * time.Millisecond
	maxPendingPerRound       = 20000 // tasks considered per round
	maxPlacementsPerEntry    = 2000  // placements per ApplyPlan entry
	// DefaultMaxStarting bounds the tasks placed but not yet running,
	// cluster-wide. Each start costs a node a sandbox claim and the
	// cluster a few writes; placing 40,000 at once made a start storm that
	// starved heartbeats on a small box. Placement continues as starts
	// complete.
	DefaultMaxStarting = 4000
	// maxStartingPerNode spreads those starts: with bin-packing, a dead
	// node's 8,000 tasks went to the fullest nodes of one or two fleet
	// processes, whose start storm then got them declared dead too.
	maxStartingPerNode = 16
	spreadLabel        = "zone"
)

// placementLoop runs on every server and acts only on the leader: whenever
// the FSM says placement could have changed (a task became pending, a node
// appeared, changed or gained room), it plans on a snapshot of the local
// state with Place and commits the plan as ApplyPlan entries, which the FSM
// checks again at apply time.
func (s *Server) placementLoop() {
	defer s.wg.Done()
	t := time.NewTicker(orDuration(s.cfg.PlacementInterval, defaultPlacementInterval))
	defer t.Stop()
	seed := s.cfg.PlacementSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	rng := rand.New(rand.NewPCG(seed, seed>>1|1))
	done := ^uint64(0)   // generation last planned for; none yet
	var doneFreed uint64 // sessions' freed count last planned for
	after := ""          // where the next round reads pending tasks from ("": the oldest)
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
		if s.raft.State() != raft.Leader || s.readyTerm.Load() != s.raft.CurrentTerm() {
			// Not leading, or not ready: until its barrier a new leader's
			// FSM may lag behind (tasks placed but not yet applied here
			// would not count against MaxStarting), and no node has
			// reported its verification sandboxes to it yet.
			done, after = ^uint64(0), ""
			continue
		}
		gen, freed := s.fsm.replanGen.Load(), s.sess.freed.Load()
		if gen == done && freed == doneFreed && after == "" {
			continue
		}
		done, doneFreed = gen, freed
		cost, next, err := s.placeOnce(rng, after)
		after = next
		if err != nil {
			s.log.Warn("placement round failed", "err", err)
			done = ^uint64(0) // try again next tick
		}
		// Planning over many nodes and tasks costs CPU the leader also
		// needs for appends: while changes keep coming, spend at most about
		// a fifth of the time planning. (Only planning counts: waiting for
		// the plan to commit costs no CPU, and counting it slowed recovery
		// under load by up to a second per round.)
		if el := cost; el > 5*time.Millisecond {
			select {
			case <-s.stop:
				return
			case <-time.After(min(4*el, time.Second)):
			}
		}
	}
}

// placeOnce plans the pending tasks after after ("": from the oldest) once
// (up to the room under MaxStarting). It returns the time spent reading
// state and planning, and where the next round should read from: past
// this round's tasks when all it could read (maxPendingPerRound) were
// held back (no node takes them, or they wait for room that later tasks
// need not), else "".
func (s *Server) placeOnce(rng *rand.Rand, after string) (time.Duration, string, error) {
	start := time.Now()
	nodes, err := s.fsm.Nodes()
	if err != nil || len(nodes) == 0 {
		return time.Since(start), "", err
	}
	maxPending := s.cfg.maxPendingPerRound
	if maxPending == 0 {
		maxPending = maxPendingPerRound
	}
	limit := s.cfg.MaxStarting
	if limit == 0 {
		limit = DefaultMaxStarting
	}
	// The tasks starting now, and on which nodes.
	starting, _, err := s.fsm.ListTasks(warrenv1.TaskState_TASK_STATE_PLACED, "", limit, 0)
	if err != nil {
		return time.Since(start), "", err
	}
	startingOn := map[string]int{}
	startingWarm := map[nodeTemplate]int{} // the warm sandboxes their claims may take
	for _, t := range starting {
		startingOn[t.GetLease().GetNode()]++
		startingWarm[nodeTemplate{t.GetLease().GetNode(), specWarmTemplate(t.GetSpec().GetTemplate())}]++
	}
	room := min(maxPending, limit-len(starting))
	if room <= 0 {
		return time.Since(start), "", nil // a task leaving placed changes replanGen
	}
	// The oldest room pending tasks first. If tasks no node could take
	// even empty (a selector, driver or template no node has) fill that
	// window while nodes have room, look further, 4 times as far each
	// time: else they would hold back every task created after them. The
	// same when the window's tasks wait for room on their nodes while
	// other nodes have room none of them can use (pools of different
	// labels or templates: a full pool's backlog held back every task of
	// the idle one). Within the wider window the older tasks still come
	// first. When even the widest window (maxPendingPerRound) is held
	// back so, the next round reads the tasks after it, and so on to the
	// newest, then from the oldest again: 20,000 tasks no node takes (a
	// selector that matches none) held back every later task of the
	// cluster.
	// Read once per round, not per window: each reported task is an FSM
	// read.
	extra := verifyingExtra(s.sess.verifyingOn(), s.verifyingTask)
	var plan Plan
	resume := ""
	for window := room; ; window = min(4*window, maxPending) {
		pending, next, err := s.fsm.ListTasks(warrenv1.TaskState_TASK_STATE_PENDING, after, window, 0)
		if err != nil {
			return time.Since(start), "", err
		}
		if len(pending) == 0 {
			return time.Since(start), "", nil
		}
		pn := placementNodes(nodes)
		for i := range pn {
			pn[i].Starting = startingOn[pn[i].ID]
		}
		s.sess.fillWarm(pn)
		discountStarting(pn, startingWarm)
		addExtra(pn, extra)
		tasks := pendingTasks(pending)
		plan = Place(pn, tasks, PlacementConfig{SpreadLabel: spreadLabel, MaxStartingPerNode: maxStartingPerNode}, rng)
		blocked := plan.Unfit > 0 && len(plan.Placements)+plan.Unfit == len(pending) && anyReady(pn)
		blocked = blocked || len(plan.Placements) < room && len(plan.Unplaced) > 0 && roomUnused(pn, tasks, plan, maxStartingPerNode)
		if !blocked || len(plan.Placements) >= room || len(pending) < window {
			break
		}
		if window >= maxPending {
			resume = next
			break
		}
	}
	plan.Placements = plan.Placements[:min(len(plan.Placements), room)]
	cost := time.Since(start)
	for len(plan.Placements) > 0 {
		n := min(len(plan.Placements), maxPlacementsPerEntry)
		m := &fsmv1.ApplyPlan{Time: timestamppb.New(s.clock.Now())}
		for _, p := range plan.Placements[:n] {
			m.Placements = append(m.Placements, &fsmv1.ApplyPlan_Placement{TaskId: p.TaskID, NodeId: p.NodeID, Warm: p.Warm})
		}
		plan.Placements = plan.Placements[n:]
		// No deadline but the server's: a proposal given up on may still
		// commit, and its tasks would then stay placed with no start
		// sent. It ends when it commits, or fails (leadership lost), or
		// the server stops.
		res, _, err := s.proposeLocal(s.stopCtx, m)
		if err != nil {
			return cost, "", err
		}
		var placed []string
		for i, e := range res.GetPlacementErrors() {
			if e == "" {
				placed = append(placed, m.Placements[i].GetTaskId())
			} else {
				s.log.Debug("placement refused at apply", "task", m.Placements[i].GetTaskId(), "node", m.Placements[i].GetNodeId(), "err", e)
			}
		}
		s.log.Debug("placed tasks", "placed", len(placed), "planned", len(m.Placements))
		s.notifyPlaced(placed)
	}
	return cost, resume, nil
}

// anyReady reports whether some node takes tasks now: with none (all
// draining or down), every task is unfit, and looking further finds no
// task to place.
func anyReady(pn []PlacementNode) bool {
	for _, n := range pn {
		if n.Status == NodeReady && n.Eligible {
			return true
		}
	}
	return false
}

// roomUnused reports whether, after plan, some ready, eligible node may
// still start a task and has free capacity for the smallest of tasks the
// plan left unplaced (the least CPU and the least memory among them): such
// a node took none of them for its filters (Place gives a task any node
// that passes them and has room), so tasks further back may fit it.
func roomUnused(pn []PlacementNode, tasks []PendingTask, plan Plan, maxStarting int) bool {
	var least Resources
	first := true
	for _, t := range tasks {
		if _, ok := plan.Unplaced[t.ID]; !ok {
			continue
		}
		if first || t.Needs.MilliCPU < least.MilliCPU {
			least.MilliCPU = t.Needs.MilliCPU
		}
		if first || t.Needs.MemoryBytes < least.MemoryBytes {
			least.MemoryBytes = t.Needs.MemoryBytes
		}
		first = false
	}
	if first {
		return false
	}
	needs := make(map[string]Resources, len(tasks))
	for _, t := range tasks {
		needs[t.ID] = t.Needs
	}
	type use struct {
		Resources
		starts int
	}
	planned := map[string]use{}
	for _, p := range plan.Placements {
		u := planned[p.NodeID]
		u.MilliCPU += needs[p.TaskID].MilliCPU
		u.MemoryBytes += needs[p.TaskID].MemoryBytes
		u.starts++
		planned[p.NodeID] = u
	}
	for _, n := range pn {
		if n.Status != NodeReady || !n.Eligible {
			continue
		}
		u := planned[n.ID]
		if maxStarting > 0 && n.Starting+u.starts >= maxStarting {
			continue
		}
		if n.Capacity.MilliCPU-n.Allocated.MilliCPU-u.MilliCPU >= least.MilliCPU &&
			n.Capacity.MemoryBytes-n.Allocated.MemoryBytes-u.MemoryBytes >= least.MemoryBytes {
			return true
		}
	}
	return false
}

func placementNodes(nodes []*warrenv1.Node) []PlacementNode {
	out := make([]PlacementNode, len(nodes))
	for i, n := range nodes {
		st := NodeStatusUnknown
		switch n.GetStatus() {
		case warrenv1.NodeStatus_NODE_STATUS_READY:
			st = NodeReady
		case warrenv1.NodeStatus_NODE_STATUS_DOWN:
			st = NodeDown
		case warrenv1.NodeStatus_NODE_STATUS_DRAINING:
			st = NodeDraining
		}
		out[i] = PlacementNode{
			ID: n.GetId(), Status: st, Eligible: n.GetEligible(),
			Drivers: n.GetDrivers(), Templates: n.GetTemplates(), Labels: n.GetLabels(),
			Capacity:  Resources{MilliCPU: n.GetCapacity().GetMilliCpu(), MemoryBytes: n.GetCapacity().GetMemoryBytes()},
			Allocated: Resources{MilliCPU: n.GetAllocated().GetMilliCpu(), MemoryBytes: n.GetAllocated().GetMemoryBytes()},
		}
	}
	return out
}

func pendingTasks(tasks []*warrenv1.Task) []PendingTask {
	out := make([]PendingTask, len(tasks))
	for i, t := range tasks {
		needs := TaskNeeds(t.GetSpec())
		out[i] = PendingTask{
			ID: t.GetId(), Driver: specDriver(t.GetSpec()), Template: t.GetSpec().GetTemplate(),
			Needs:     Resources{MilliCPU: needs.GetMilliCpu(), MemoryBytes: needs.GetMemoryBytes()},
			AvoidNode: t.GetLastFailedNode(),
			Labels:    t.GetSpec().GetNodeSelector(),
		}
	}
	return out
}
