package scheduler

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/cockroachdb/pebble/v2"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	fsmv1 "github.com/warrenhq/warren/api/gen/warren/fsm/v1"
	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
)

// Default resources of a task whose spec names none.
const (
	DefaultTaskMilliCPU    = 1000
	DefaultTaskMemoryBytes = 512 << 20
	// The bounds of a task's resources: a sandbox's memory is what the
	// drivers can give (the microvm driver boots no guest below 128 MiB,
	// and none takes over 64 GiB), and its CPU 1,024 cores.
	MaxTaskMilliCPU    = 1024 * 1000
	MinTaskMemoryBytes = 128 << 20
	MaxTaskMemoryBytes = 64 << 30
)

// Drivers are the sandbox drivers a node may offer. "sim" is the
// simulated in-memory driver for control-plane benchmarks.
var Drivers = []string{"microvm", "container", "sim"}

// DefaultDriver is the driver of a task whose spec names none.
const DefaultDriver = "microvm"

// TaskNeeds returns the resources a task's sandbox takes on its node.
func TaskNeeds(spec *warrenv1.TaskSpec) *warrenv1.Resources {
	r := &warrenv1.Resources{MilliCpu: spec.GetResources().GetMilliCpu(), MemoryBytes: spec.GetResources().GetMemoryBytes()}
	if r.MilliCpu == 0 {
		r.MilliCpu = DefaultTaskMilliCPU
	}
	if r.MemoryBytes == 0 {
		r.MemoryBytes = DefaultTaskMemoryBytes
	}
	return r
}

// cachedNode is a node read or written during one ApplyBatch, written back
// once at the end like cachedTask. n is nil for a node removed in the
// batch: it reads as not found, and its record is deleted at the end
// unless a later command of the batch registers it again.
type cachedNode struct {
	n     *warrenv1.Node
	dirty bool
}

func (a *applier) node(id string) (*warrenv1.Node, *fsmv1.Result) {
	if c, ok := a.nodes[id]; ok {
		if c.n == nil {
			return nil, fail(connect.CodeNotFound, "node %q not found", id)
		}
		return c.n, nil
	}
	n := &warrenv1.Node{}
	if !a.get(keyNode(id), n) {
		return nil, fail(connect.CodeNotFound, "node %q not found", id)
	}
	a.nodes[id] = &cachedNode{n: n}
	return n, nil
}

func (a *applier) putNode(n *warrenv1.Node) {
	c, ok := a.nodes[n.GetId()]
	if !ok {
		c = &cachedNode{}
		a.nodes[n.GetId()] = c
	}
	c.n, c.dirty = n, true
}

func (a *applier) flushNodes() {
	for id, c := range a.nodes {
		if !c.dirty {
			continue
		}
		if c.n == nil {
			if err := a.b.Delete(keyNode(id), nil); err != nil {
				panic(fmt.Sprintf("scheduler: batch delete: %v", err))
			}
			continue
		}
		if invariants {
			// Not bounded by capacity: a node may come back smaller than
			// what its leases hold (placement gives it nothing until they
			// end).
			if al := c.n.GetAllocated(); al.GetMilliCpu() < 0 || al.GetMemoryBytes() < 0 {
				panic(fmt.Sprintf("invariant: node %s allocated %v, below 0", id, al))
			}
		}
		a.put(keyNode(id), c.n)
	}
}

func (a *applier) setIndex(k []byte, on bool) {
	var err error
	if on {
		err = a.b.Set(k, nil, nil)
	} else {
		err = a.b.Delete(k, nil)
	}
	if err != nil {
		panic(fmt.Sprintf("scheduler: batch write: %v", err))
	}
}

func (a *applier) registerNode(m *fsmv1.RegisterNode) *fsmv1.Result {
	in := m.GetNode()
	if in.GetId() == "" {
		return fail(connect.CodeInvalidArgument, "node.id: required")
	}
	n, r := a.node(in.GetId())
	if r != nil {
		n = &warrenv1.Node{
			Id: in.GetId(), Status: warrenv1.NodeStatus_NODE_STATUS_READY, Eligible: true,
			Allocated: &warrenv1.Resources{}, RegisteredAt: m.GetTime(), StatusChangedAt: m.GetTime(),
		}
	} else {
		n = proto.Clone(n).(*warrenv1.Node)
	}
	n.Drivers, n.Templates, n.Labels = in.GetDrivers(), in.GetTemplates(), in.GetLabels()
	n.Capacity, n.Accelerator, n.Address = in.GetCapacity(), in.GetAccelerator(), in.GetAddress()
	n.SandboxUrl = in.GetSandboxUrl()
	if n.GetStatus() == warrenv1.NodeStatus_NODE_STATUS_DOWN {
		n.Status, n.StatusChangedAt, n.StatusReason = warrenv1.NodeStatus_NODE_STATUS_READY, m.GetTime(), "registered again"
	}
	if n.GetStatus() != warrenv1.NodeStatus_NODE_STATUS_DRAINING {
		n.DrainDeadline = nil // a drain's that a down ended
	}
	a.putNode(n)
	if r == nil {
		// Its drivers, templates or labels may have changed: a task it
		// can no longer run is requeued, else the hello's reconcile would
		// start it there anyway (under a weaker driver, or to fail for a
		// template the node no longer has).
		if err := a.requeueMisfits(n, m.GetTime()); err != nil {
			panic(fmt.Sprintf("scheduler: requeue tasks %s no longer fits: %v", n.GetId(), err))
		}
		n, _ = a.node(n.GetId()) // requeueing released resources on it
	}
	a.replan = true
	return &fsmv1.Result{Node: proto.Clone(n).(*warrenv1.Node)}
}

// requeueMisfits lets go of every lease n holds whose task n no longer
// passes the static filters of (see misfit), requeueing the task.
func (a *applier) requeueMisfits(n *warrenv1.Node, ts *timestamppb.Timestamp) error {
	ids, err := a.leaseIDs(n.GetId())
	if err != nil {
		return err
	}
	for _, id := range ids {
		t, r := a.task(id)
		if r != nil || Terminal(t.GetState()) || t.GetLease().GetNode() != n.GetId() {
			continue
		}
		if why := misfit(n, t.GetSpec()); why != "" {
			a.requeue(t, ts, fmt.Sprintf("node %s no longer offers %s", n.GetId(), why))
			a.putTask(t)
		}
	}
	return nil
}

// specDriver is the driver a task of spec runs under.
func specDriver(spec *warrenv1.TaskSpec) string {
	if d := spec.GetDriver(); d != "" {
		return d
	}
	return DefaultDriver
}

// misfit names the first static filter of placement (driver, template
// when the spec names one, node selector) that n fails for a task of spec
// ("driver microvm", "template go", "labels gpu=1"), or "" when it passes
// them all. It mirrors placer.check on the FSM's records, so that the FSM
// refuses at apply what placement would not have planned.
func misfit(n *warrenv1.Node, spec *warrenv1.TaskSpec) string {
	switch d, tpl, sel := specDriver(spec), spec.GetTemplate(), spec.GetNodeSelector(); {
	case !slices.Contains(n.GetDrivers(), d):
		return "driver " + d
	case tpl != "" && !slices.Contains(n.GetTemplates(), tpl):
		return "template " + tpl
	case !hasLabels(n.GetLabels(), sel):
		return "labels " + selectorText(sel)
	}
	return ""
}

func (a *applier) nodeOp(m *fsmv1.NodeOp) *fsmv1.Result {
	n, r := a.node(m.GetId())
	if r != nil {
		return r
	}
	if m.GetOp() == fsmv1.NodeOp_OP_REMOVE {
		return a.removeNode(n)
	}
	n = proto.Clone(n).(*warrenv1.Node)
	status := n.GetStatus()
	switch m.GetOp() {
	case fsmv1.NodeOp_OP_CORDON:
		n.Eligible = false
	case fsmv1.NodeOp_OP_UNCORDON:
		n.Eligible = true
		if status == warrenv1.NodeStatus_NODE_STATUS_DRAINING {
			n.Status, n.DrainDeadline = warrenv1.NodeStatus_NODE_STATUS_READY, nil
		}
	case fsmv1.NodeOp_OP_DRAIN:
		if status == warrenv1.NodeStatus_NODE_STATUS_DOWN {
			return fail(connect.CodeFailedPrecondition, "node %s is down", n.GetId())
		}
		n.Status, n.Eligible, n.DrainDeadline = warrenv1.NodeStatus_NODE_STATUS_DRAINING, false, m.GetDrainDeadline()
	case fsmv1.NodeOp_OP_DOWN:
		if status == warrenv1.NodeStatus_NODE_STATUS_DOWN {
			return &fsmv1.Result{Node: n}
		}
		// A down for a passed drain deadline names the deadline it saw:
		// an uncordon, or a drain with another deadline, committed since
		// the leader read the node overrides it.
		if dl := m.GetDrainDeadline(); dl != nil &&
			(status != warrenv1.NodeStatus_NODE_STATUS_DRAINING || !proto.Equal(dl, n.GetDrainDeadline())) {
			return fail(connect.CodeFailedPrecondition, "node %s is no longer draining with the deadline %s (%s, deadline %s)",
				n.GetId(), formatDeadline(dl), NodeStatusName(status), formatDeadline(n.GetDrainDeadline()))
		}
		n.Status = warrenv1.NodeStatus_NODE_STATUS_DOWN
		a.putNode(n)
		if err := a.requeueAll(n.GetId(), m.GetTime(), m.GetReason()); err != nil {
			panic(fmt.Sprintf("scheduler: requeue tasks of %s: %v", n.GetId(), err))
		}
		n, _ = a.node(n.GetId()) // requeueing released resources on it
	default:
		return fail(connect.CodeInvalidArgument, "op: unknown %v", m.GetOp())
	}
	if n.GetStatus() != status {
		n.StatusChangedAt, n.StatusReason = m.GetTime(), m.GetReason()
	}
	if n.GetStatus() != warrenv1.NodeStatus_NODE_STATUS_DRAINING {
		n.DrainDeadline = nil // a drain's, which ended
	}
	a.putNode(n)
	a.replan = true
	return &fsmv1.Result{Node: proto.Clone(n).(*warrenv1.Node)}
}

// formatDeadline renders a drain deadline for an error ("none" if unset).
func formatDeadline(ts *timestamppb.Timestamp) string {
	if ts == nil {
		return "none"
	}
	return ts.AsTime().UTC().Format(time.RFC3339Nano)
}

// removeNode deletes a node that is down and whose lease index names no
// unfinished task, with its index: a decommissioned node otherwise stays
// down in every list for good, every placement round and liveness round
// reads it, and its id, used again, inherits its cordon and drain. An
// index entry of a finished or missing task is stale (requeueAll explains
// how one is left) and goes with the node. Once it is gone the id may
// register again as a new node.
func (a *applier) removeNode(n *warrenv1.Node) *fsmv1.Result {
	id := n.GetId()
	switch st := n.GetStatus(); st {
	case warrenv1.NodeStatus_NODE_STATUS_DOWN:
	case warrenv1.NodeStatus_NODE_STATUS_DRAINING:
		return fail(connect.CodeFailedPrecondition,
			"node %s is draining: only a down node can be removed; stop its daemon once its tasks have moved off (it is down within the node TTL), then remove it", id)
	default:
		return fail(connect.CodeFailedPrecondition,
			"node %s is %s: only a down node can be removed; drain it and stop it first (it is down within the node TTL once stopped)", id, NodeStatusName(st))
	}
	ids, err := a.leaseIDs(id)
	if err != nil {
		panic(fmt.Sprintf("scheduler: read the lease index of %s: %v", id, err))
	}
	var held []string
	for _, tid := range ids {
		t, r := a.task(tid)
		if r == nil && !Terminal(t.GetState()) {
			held = append(held, t.GetId())
		}
	}
	if len(held) > 0 {
		leases, named := "leases", strings.Join(held[:min(len(held), 3)], ", ")
		if len(held) == 1 {
			leases = "lease"
		} else if len(held) > 3 {
			named += ", …"
		}
		return fail(connect.CodeFailedPrecondition,
			"node %s still holds %d %s of unfinished tasks (%s): removing it would strand them; start its daemon again so that it registers, drain it, then stop it",
			id, len(held), leases, named)
	}
	for _, tid := range ids {
		a.setIndex(keyNodeTask(id, tid), false)
	}
	// A down node offers placement nothing, so nothing to replan.
	a.nodes[id] = &cachedNode{dirty: true}
	a.removed = append(a.removed, id)
	return &fsmv1.Result{Node: proto.Clone(n).(*warrenv1.Node)}
}

// requeueAll takes every lease of a down node: each task goes back to
// pending under a new epoch, so anything the old node still appends is
// refused. An index entry of a finished task is stale and only released.
func (a *applier) requeueAll(node string, ts *timestamppb.Timestamp, reason string) error {
	ids, err := a.leaseIDs(node)
	if err != nil {
		return err
	}
	if reason == "" {
		reason = "node down"
	}
	for _, id := range ids {
		t, r := a.task(id)
		if r != nil {
			continue
		}
		if Terminal(t.GetState()) {
			// A finished task holds no lease, so its index entry is stale:
			// ending it did not release it (on a replica whose read failed
			// before release panicked on read errors). Releasing it now
			// puts this replica back in step with the others; requeueing
			// it would bring a finished task back to pending.
			if t.GetLease().GetNode() == node {
				a.release(t)
			} else {
				a.setIndex(keyNodeTask(node, id), false)
			}
			continue
		}
		a.requeue(t, ts, reason)
		a.putTask(t)
	}
	return nil
}

// leaseIDs lists the tasks in node's lease index, in id order (as this
// batch sees it).
func (a *applier) leaseIDs(node string) ([]string, error) { return leaseIndex(a.b, node) }

// leaseIndex lists the tasks in node's lease index as r (the store, or a
// batch) holds it, in id order.
func leaseIndex(r pebble.Reader, node string) ([]string, error) {
	prefix := keyNodeTasks(node)
	it, err := r.NewIter(&pebble.IterOptions{LowerBound: prefix, UpperBound: prefixEnd(prefix)})
	if err != nil {
		return nil, err
	}
	var ids []string
	for ok := it.First(); ok; ok = it.Next() {
		ids = append(ids, string(it.Key()[len(prefix):]))
	}
	if err := errors.Join(it.Error(), it.Close()); err != nil {
		return nil, err
	}
	return ids, nil
}

// requeue moves a task that held a lease back to pending under a new
// epoch, releasing its node's resources, and marks it for resumption.
func (a *applier) requeue(t *warrenv1.Task, ts *timestamppb.Timestamp, reason string) {
	lost := a.letGo(t)
	t.LastFailedNode = lost
	if t.GetCancelRequested() {
		// Nothing would run it again but to record the cancellation (and
		// where no node fits it would stay pending for good).
		why := "cancelled before its node was lost; "
		if t.GetState() == warrenv1.TaskState_TASK_STATE_WAITING_APPROVAL {
			why = "cancelled while waiting for approval; "
		}
		a.setState(t, ts, warrenv1.TaskState_TASK_STATE_CANCELLED, map[string]any{"reason": why + reason, "node": lost})
		return
	}
	if t.GetState() == warrenv1.TaskState_TASK_STATE_WAITING_APPROVAL && len(t.GetPendingApprovals()) > 0 {
		// It waits for a person, not for a node: park it until the
		// decision, as its node would have after the grace period.
		t.Parked = true
		a.appendEvent(t, ts, KindParked, mustJSON(map[string]any{"reason": reason, "node": lost, "epoch": t.GetLease().GetEpoch()}), t.GetLease().GetEpoch())
		return
	}
	a.replan = true
	a.setState(t, ts, warrenv1.TaskState_TASK_STATE_PENDING, map[string]any{"reason": reason, "node": lost, "epoch": t.GetLease().GetEpoch()})
}

// letGo takes a task's lease from its holder: the node's resources come
// back, the epoch moves on (the holder's appends are refused from now
// on) and the next holder resumes from the log. It returns the node.
func (a *applier) letGo(t *warrenv1.Task) (node string) {
	node = t.GetLease().GetNode()
	a.release(t)
	t.Lease = &warrenv1.Lease{Epoch: t.GetLease().GetEpoch() + 1}
	t.Resume = true
	return node
}

// release returns a task's resources to the node holding its lease.
func (a *applier) release(t *warrenv1.Task) {
	node := t.GetLease().GetNode()
	if node == "" {
		return
	}
	k := keyNodeTask(node, t.GetId())
	_, closer, err := a.b.Get(k)
	if errors.Is(err, pebble.ErrNotFound) {
		return // not accounted (a lease granted without a node record)
	}
	if err != nil {
		// As in read: taking a failed read for "not accounted" would keep
		// the node's resources and index entry on this replica only.
		panic(fmt.Sprintf("scheduler: read lease index %x: %v", k, err))
	}
	closer.Close()
	a.setIndex(k, false)
	n, r := a.node(node)
	if r != nil {
		return
	}
	n = proto.Clone(n).(*warrenv1.Node)
	needs := TaskNeeds(t.GetSpec())
	n.Allocated = &warrenv1.Resources{
		MilliCpu:    n.GetAllocated().GetMilliCpu() - needs.GetMilliCpu(),
		MemoryBytes: n.GetAllocated().GetMemoryBytes() - needs.GetMemoryBytes(),
	}
	if n.TaskCount > 0 {
		n.TaskCount--
	}
	a.putNode(n)
	a.replan = true // room freed
}

// applyPlan places tasks, checking each placement against the state now.
func (a *applier) applyPlan(m *fsmv1.ApplyPlan) *fsmv1.Result {
	res := &fsmv1.Result{PlacementErrors: make([]string, len(m.GetPlacements()))}
	for i, p := range m.GetPlacements() {
		if err := a.place(p, m.GetTime()); err != "" {
			res.PlacementErrors[i] = err
		}
	}
	return res
}

func (a *applier) place(p *fsmv1.ApplyPlan_Placement, ts *timestamppb.Timestamp) string {
	t, r := a.writable(p.GetTaskId())
	if r != nil {
		return r.GetMessage()
	}
	if t.GetState() != warrenv1.TaskState_TASK_STATE_PENDING {
		return fmt.Sprintf("task %s is %s, not pending", t.GetId(), StateName(t.GetState()))
	}
	n, r := a.node(p.GetNodeId())
	if r != nil {
		return r.GetMessage()
	}
	if n.GetStatus() != warrenv1.NodeStatus_NODE_STATUS_READY || !n.GetEligible() {
		return fmt.Sprintf("node %s is not taking tasks (%s, eligible=%v)", n.GetId(), NodeStatusName(n.GetStatus()), n.GetEligible())
	}
	if why := misfit(n, t.GetSpec()); why != "" {
		// The plan was made before the node registered again without it.
		return fmt.Sprintf("node %s does not offer %s", n.GetId(), why)
	}
	needs := TaskNeeds(t.GetSpec())
	freeCPU := n.GetCapacity().GetMilliCpu() - n.GetAllocated().GetMilliCpu()
	freeMem := n.GetCapacity().GetMemoryBytes() - n.GetAllocated().GetMemoryBytes()
	if needs.GetMilliCpu() > freeCPU || needs.GetMemoryBytes() > freeMem {
		return fmt.Sprintf("node %s has no room: task needs %dm CPU and %d B, %dm and %d B free",
			n.GetId(), needs.GetMilliCpu(), needs.GetMemoryBytes(), freeCPU, freeMem)
	}
	n = proto.Clone(n).(*warrenv1.Node)
	n.Allocated = &warrenv1.Resources{
		MilliCpu:    n.GetAllocated().GetMilliCpu() + needs.GetMilliCpu(),
		MemoryBytes: n.GetAllocated().GetMemoryBytes() + needs.GetMemoryBytes(),
	}
	n.TaskCount++
	a.putNode(n)
	a.setIndex(keyNodeTask(n.GetId(), t.GetId()), true)
	t.Lease = &warrenv1.Lease{Node: n.GetId(), Epoch: t.GetLease().GetEpoch() + 1}
	a.setState(t, ts, warrenv1.TaskState_TASK_STATE_PLACED, map[string]any{"node": n.GetId(), "epoch": t.GetLease().GetEpoch(), "warm": p.GetWarm()})
	a.putTask(t)
	return ""
}

// NodeStatusName is the lower-case name of a node status ("ready").
func NodeStatusName(s warrenv1.NodeStatus) string {
	switch s {
	case warrenv1.NodeStatus_NODE_STATUS_READY:
		return "ready"
	case warrenv1.NodeStatus_NODE_STATUS_DOWN:
		return "down"
	case warrenv1.NodeStatus_NODE_STATUS_DRAINING:
		return "draining"
	}
	return "unspecified"
}

// Node returns a node or ErrNotFound.
func (f *FSM) Node(id string) (*warrenv1.Node, error) {
	n := &warrenv1.Node{}
	if err := f.getProto(keyNode(id), n); err != nil {
		return nil, fmt.Errorf("node %q: %w", id, err)
	}
	return n, nil
}

// Nodes returns every node in id order.
func (f *FSM) Nodes() ([]*warrenv1.Node, error) {
	it, err := f.db.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixNode}, UpperBound: []byte{prefixNode + 1}})
	if err != nil {
		return nil, err
	}
	defer it.Close()
	var out []*warrenv1.Node
	for ok := it.First(); ok; ok = it.Next() {
		n := &warrenv1.Node{}
		if err := proto.Unmarshal(it.Value(), n); err != nil {
			return nil, fmt.Errorf("decode node %q: %w", it.Key()[1:], err)
		}
		out = append(out, n)
	}
	return out, it.Error()
}

// Pools returns the warm-pool targets, by template.
func (f *FSM) Pools() ([]*fsmv1.SetPool, error) {
	it, err := f.db.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixPool}, UpperBound: []byte{prefixPool + 1}})
	if err != nil {
		return nil, err
	}
	defer it.Close()
	var out []*fsmv1.SetPool
	for ok := it.First(); ok; ok = it.Next() {
		p := &fsmv1.SetPool{}
		if err := proto.Unmarshal(it.Value(), p); err != nil {
			return nil, fmt.Errorf("decode pool %q: %w", it.Key()[1:], err)
		}
		out = append(out, p)
	}
	return out, it.Error()
}

// NodeTasks returns the tasks whose leases node holds, in id order.
func (f *FSM) NodeTasks(node string) ([]*warrenv1.Task, error) {
	ids, err := leaseIndex(f.db, node)
	if err != nil {
		return nil, err
	}
	out := make([]*warrenv1.Task, 0, len(ids))
	for _, id := range ids {
		t, err := f.Task(id)
		if err != nil {
			continue // released between the index read and this one
		}
		out = append(out, t)
	}
	return out, nil
}
