package scheduler

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	"github.com/oklog/ulid/v2"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	fsmv1 "github.com/warrenhq/warren/api/gen/warren/fsm/v1"
	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
	"github.com/warrenhq/warren/api/gen/warren/v1/warrenv1connect"
	"github.com/warrenhq/warren/raftlog"
)

// registerNode registers a node with room for `slots` default-sized tasks,
// offering the driver of testSpec's tasks (which name none).
func (tf *testFSM) registerNode(id string, slots int64) *warrenv1.Node {
	tf.t.Helper()
	return tf.ok(&fsmv1.RegisterNode{Node: &warrenv1.Node{
		Id: id, Drivers: []string{DefaultDriver},
		Capacity: &warrenv1.Resources{MilliCpu: slots * DefaultTaskMilliCPU, MemoryBytes: slots * DefaultTaskMemoryBytes},
	}, Time: timestamppb.New(t0)})[0].GetNode()
}

func (tf *testFSM) plan(pl ...*fsmv1.ApplyPlan_Placement) []string {
	tf.t.Helper()
	return tf.ok(&fsmv1.ApplyPlan{Placements: pl, Time: timestamppb.New(t0)})[0].GetPlacementErrors()
}

func at(task, node string) *fsmv1.ApplyPlan_Placement {
	return &fsmv1.ApplyPlan_Placement{TaskId: task, NodeId: node}
}

func (tf *testFSM) mustNode(id string) *warrenv1.Node {
	tf.t.Helper()
	n, err := tf.fsm.Node(id)
	if err != nil {
		tf.t.Fatal(err)
	}
	return n
}

func (tf *testFSM) mustTask(id string) *warrenv1.Task {
	tf.t.Helper()
	t, err := tf.fsm.Task(id)
	if err != nil {
		tf.t.Fatal(err)
	}
	return t
}

func TestPlanChecksCapacityAtApply(t *testing.T) {
	tf := newTestFSM(t)
	n := tf.registerNode("n1", 2)
	if n.GetStatus() != warrenv1.NodeStatus_NODE_STATUS_READY || !n.GetEligible() {
		t.Fatalf("new node = %v", n)
	}
	a, b, c := tf.create("").GetId(), tf.create("").GetId(), tf.create("").GetId()
	errs := tf.plan(at(a, "n1"), at(b, "n1"), at(c, "n1"), at(a, "n1"), at(c, "ghost"))
	if errs[0] != "" || errs[1] != "" {
		t.Fatalf("first two placements refused: %q", errs)
	}
	for i, want := range map[int]string{2: "no room", 3: "not pending", 4: "not found"} {
		if !strings.Contains(errs[i], want) {
			t.Errorf("placement %d: %q, want %q", i, errs[i], want)
		}
	}
	got := tf.mustNode("n1")
	if got.GetTaskCount() != 2 || got.GetAllocated().GetMilliCpu() != 2*DefaultTaskMilliCPU {
		t.Fatalf("node after plan: %v", got)
	}
	if tk := tf.mustTask(a); tk.GetState() != warrenv1.TaskState_TASK_STATE_PLACED || tk.GetLease().GetNode() != "n1" || tk.GetLease().GetEpoch() != 1 {
		t.Fatalf("placed task: %v", tk)
	}
}

func TestNodeDownRequeuesUnderNewEpoch(t *testing.T) {
	tf := newTestFSM(t)
	tf.registerNode("n1", 4)
	a, b := tf.create("").GetId(), tf.create("").GetId()
	tf.plan(at(a, "n1"), at(b, "n1"))
	tf.ok(&fsmv1.AppendEvents{TaskId: a, LeaseEpoch: 1, Events: []*warrenv1.EventInput{stateEvent("running")}, Time: timestamppb.New(t0)})

	tf.ok(&fsmv1.NodeOp{Id: "n1", Op: fsmv1.NodeOp_OP_DOWN, Reason: "no heartbeat for 3s", Time: timestamppb.New(t0)})
	n := tf.mustNode("n1")
	if n.GetStatus() != warrenv1.NodeStatus_NODE_STATUS_DOWN || n.GetTaskCount() != 0 || n.GetAllocated().GetMilliCpu() != 0 {
		t.Fatalf("node after down: %v", n)
	}
	for _, id := range []string{a, b} {
		tk := tf.mustTask(id)
		if tk.GetState() != warrenv1.TaskState_TASK_STATE_PENDING || tk.GetLease().GetEpoch() != 2 || tk.GetLease().GetNode() != "" ||
			!tk.GetResume() || tk.GetLastFailedNode() != "n1" {
			t.Fatalf("task %s after node down: %v", id, tk)
		}
	}
	// The old owner's append is fenced off.
	r := tf.apply(&fsmv1.AppendEvents{TaskId: a, LeaseEpoch: 1, Events: []*warrenv1.EventInput{logEvent("late")}, Time: timestamppb.New(t0)})[0]
	if connect.Code(r.GetCode()) != connect.CodeFailedPrecondition || !strings.Contains(r.GetMessage(), ErrStaleEpoch.Error()) {
		t.Fatalf("stale append after node down: %v %s", connect.Code(r.GetCode()), r.GetMessage())
	}
	if got := kindsOf(tf.events(a)); got != "1:task_created 2:state_changed 3:state_changed 4:state_changed" {
		t.Fatalf("events = %s", got)
	}
	// Down twice is a no-op; registering again makes the node ready.
	tf.ok(&fsmv1.NodeOp{Id: "n1", Op: fsmv1.NodeOp_OP_DOWN, Time: timestamppb.New(t0)})
	if got := kindsOf(tf.events(a)); !strings.HasSuffix(got, "4:state_changed") {
		t.Fatalf("second down wrote events: %s", got)
	}
	if n := tf.registerNode("n1", 4); n.GetStatus() != warrenv1.NodeStatus_NODE_STATUS_READY {
		t.Fatalf("re-registered node: %v", n)
	}
	if errs := tf.plan(at(a, "n1")); errs[0] != "" {
		t.Fatalf("re-place: %s", errs[0])
	}
	if tk := tf.mustTask(a); tk.GetLease().GetEpoch() != 3 {
		t.Fatalf("epoch after re-place = %d, want 3", tk.GetLease().GetEpoch())
	}
}

func TestWriterEndingOrReturningTaskReleasesNode(t *testing.T) {
	tf := newTestFSM(t)
	tf.registerNode("n1", 2)
	a, b := tf.create("").GetId(), tf.create("").GetId()
	tf.plan(at(a, "n1"), at(b, "n1"))
	tf.ok(&fsmv1.AppendEvents{TaskId: a, LeaseEpoch: 1, Events: []*warrenv1.EventInput{stateEvent("running"), stateEvent("succeeded")}, Time: timestamppb.New(t0)})
	tf.ok(&fsmv1.AppendEvents{TaskId: b, LeaseEpoch: 1, Events: []*warrenv1.EventInput{stateEvent("running"), stateEvent("pending")}, Time: timestamppb.New(t0)})
	if n := tf.mustNode("n1"); n.GetTaskCount() != 0 || n.GetAllocated().GetMemoryBytes() != 0 {
		t.Fatalf("node still holds resources: %v", n)
	}
	if tk := tf.mustTask(a); tk.GetLease().GetNode() != "n1" {
		t.Fatalf("a finished task should keep where it ran: %v", tk.GetLease())
	}
	if tk := tf.mustTask(b); tk.GetLease().GetEpoch() != 2 || !tk.GetResume() {
		t.Fatalf("returned task: %v", tk)
	}
}

func TestCordonDrainUncordon(t *testing.T) {
	tf := newTestFSM(t)
	tf.registerNode("n1", 4)
	a := tf.create("").GetId()
	tf.ok(&fsmv1.NodeOp{Id: "n1", Op: fsmv1.NodeOp_OP_CORDON, Time: timestamppb.New(t0)})
	if errs := tf.plan(at(a, "n1")); !strings.Contains(errs[0], "not taking tasks") {
		t.Fatalf("placement on a cordoned node: %q", errs[0])
	}
	tf.ok(&fsmv1.NodeOp{Id: "n1", Op: fsmv1.NodeOp_OP_UNCORDON, Time: timestamppb.New(t0)})
	if errs := tf.plan(at(a, "n1")); errs[0] != "" {
		t.Fatal(errs[0])
	}
	n := tf.ok(&fsmv1.NodeOp{Id: "n1", Op: fsmv1.NodeOp_OP_DRAIN, DrainDeadline: timestamppb.New(t0), Time: timestamppb.New(t0)})[0].GetNode()
	if n.GetStatus() != warrenv1.NodeStatus_NODE_STATUS_DRAINING || n.GetEligible() || n.GetTaskCount() != 1 {
		t.Fatalf("draining node: %v", n)
	}
	n = tf.ok(&fsmv1.NodeOp{Id: "n1", Op: fsmv1.NodeOp_OP_UNCORDON, Time: timestamppb.New(t0)})[0].GetNode()
	if n.GetStatus() != warrenv1.NodeStatus_NODE_STATUS_READY || !n.GetEligible() {
		t.Fatalf("uncordoned draining node: %v", n)
	}
	if r := tf.apply(&fsmv1.NodeOp{Id: "ghost", Op: fsmv1.NodeOp_OP_CORDON, Time: timestamppb.New(t0)})[0]; connect.Code(r.GetCode()) != connect.CodeNotFound {
		t.Fatalf("cordon unknown node: %v", r)
	}
	nodes, err := tf.fsm.Nodes()
	if err != nil || len(nodes) != 1 {
		t.Fatalf("Nodes() = %v, %v", nodes, err)
	}
}

func TestValidateNode(t *testing.T) {
	good := func() *warrenv1.Node {
		return &warrenv1.Node{Id: "n1", Drivers: []string{"sim"}, Capacity: &warrenv1.Resources{MilliCpu: 2000, MemoryBytes: 1 << 30}}
	}
	if err := validateNode(good()); err != nil {
		t.Fatal(err)
	}
	cases := map[string]func(*warrenv1.Node){
		"node.id":          func(n *warrenv1.Node) { n.Id = "N 1" },
		"node.drivers":     func(n *warrenv1.Node) { n.Drivers = nil },
		"node.drivers[0]":  func(n *warrenv1.Node) { n.Drivers = []string{"docker"} },
		"node.capacity":    func(n *warrenv1.Node) { n.Capacity = nil },
		"node.accelerator": func(n *warrenv1.Node) { n.Accelerator = "gpu" },
	}
	for field, mod := range cases {
		n := good()
		mod(n)
		if err := validateNode(n); err == nil || !strings.Contains(err.Error(), field+":") {
			t.Errorf("%s: err = %v", field, err)
		}
	}
}

// Warm-pool targets are replicated records: set, changed, removed at 0,
// and kept across a restart of the state machine.
func TestPoolTargets(t *testing.T) {
	tf := newTestFSM(t)
	for _, m := range []*fsmv1.SetPool{{Template: "default", Target: 2}, {Template: "go", Target: 1}, {Template: "default", Target: 5}, {Template: "go"}} {
		if r := tf.apply(m); r[0].GetCode() != 0 {
			t.Fatalf("%v: %s", m, r[0].GetMessage())
		}
	}
	if r := tf.apply(&fsmv1.SetPool{Template: "Bad Name", Target: 1}); r[0].GetCode() == 0 || !strings.Contains(r[0].GetMessage(), "template") {
		t.Fatalf("bad template accepted: %v", r[0])
	}
	tf.reopen()
	pools, err := tf.fsm.Pools()
	if err != nil {
		t.Fatal(err)
	}
	if len(pools) != 1 || pools[0].GetTemplate() != "default" || pools[0].GetTarget() != 5 {
		t.Fatalf("pools %v, want default=5 only", pools)
	}
}

// waitingTask places a task on n1 and has it ask for approval of call-1.
func (tf *testFSM) waitingTask() string {
	tf.t.Helper()
	id := tf.create("").GetId()
	tf.plan(at(id, "n1"))
	tf.ok(&fsmv1.AppendEvents{TaskId: id, LeaseEpoch: 1, Events: []*warrenv1.EventInput{stateEvent("running"),
		{Kind: KindApprovalRequested, Payload: []byte(`{"tool_call_id":"call-1"}`)}, stateEvent("waiting_approval")}, Time: timestamppb.New(t0)})
	return id
}

// A task waiting for approval parks: its node's room is freed and its
// holder fenced off; the decision puts it back to pending under the new
// epoch, to resume anywhere.
func TestParkedTaskFreesItsNodeUntilDecided(t *testing.T) {
	tf := newTestFSM(t)
	tf.registerNode("n1", 4)
	id := tf.waitingTask()
	if r := tf.apply(&fsmv1.AppendEvents{TaskId: tf.create("").GetId(), Events: []*warrenv1.EventInput{{Kind: KindParked}}, Time: timestamppb.New(t0)})[0]; connect.Code(r.GetCode()) != connect.CodeFailedPrecondition {
		t.Fatalf("a pending task parked: %v %s", connect.Code(r.GetCode()), r.GetMessage())
	}
	tf.ok(&fsmv1.AppendEvents{TaskId: id, LeaseEpoch: 1, Events: []*warrenv1.EventInput{{Kind: KindParked, Payload: []byte(`{"reason":"grace over"}`)}}, Time: timestamppb.New(t0)})
	tk := tf.mustTask(id)
	if tk.GetState() != warrenv1.TaskState_TASK_STATE_WAITING_APPROVAL || !tk.GetParked() || tk.GetLease().GetNode() != "" || tk.GetLease().GetEpoch() != 2 || !tk.GetResume() {
		t.Fatalf("parked task: %v", tk)
	}
	if n := tf.mustNode("n1"); n.GetTaskCount() != 0 || n.GetAllocated().GetMilliCpu() != 0 {
		t.Fatalf("node still holds the parked task: %v", n)
	}
	if r := tf.apply(&fsmv1.AppendEvents{TaskId: id, LeaseEpoch: 1, Events: []*warrenv1.EventInput{logEvent("late")}, Time: timestamppb.New(t0)})[0]; !strings.Contains(r.GetMessage(), ErrStaleEpoch.Error()) {
		t.Fatalf("the old holder appended after parking: %s", r.GetMessage())
	}
	if errs := tf.plan(at(id, "n1")); errs[0] == "" {
		t.Fatal("a parked task was placed")
	}
	tf.ok(&fsmv1.Decide{TaskId: id, ToolCallId: "call-1", Approved: true, Time: timestamppb.New(t0)})
	tk = tf.mustTask(id)
	if tk.GetState() != warrenv1.TaskState_TASK_STATE_PENDING || tk.GetParked() || tk.GetLease().GetEpoch() != 2 {
		t.Fatalf("decided task: %v", tk)
	}
	if errs := tf.plan(at(id, "n1")); errs[0] != "" {
		t.Fatalf("the decided task was not placed: %s", errs[0])
	}
	if tk := tf.mustTask(id); tk.GetLease().GetEpoch() != 3 || !tk.GetResume() {
		t.Fatalf("placed after the decision: %v", tk)
	}
}

// A decision that lands before the node's park goes through is not lost:
// the park puts the task straight back to pending.
func TestParkAfterTheDecisionRequeues(t *testing.T) {
	tf := newTestFSM(t)
	tf.registerNode("n1", 4)
	id := tf.waitingTask()
	tf.ok(&fsmv1.Decide{TaskId: id, ToolCallId: "call-1", Approved: false, Comment: "no", Time: timestamppb.New(t0)})
	tf.ok(&fsmv1.AppendEvents{TaskId: id, LeaseEpoch: 1, Events: []*warrenv1.EventInput{{Kind: KindParked}}, Time: timestamppb.New(t0)})
	if tk := tf.mustTask(id); tk.GetState() != warrenv1.TaskState_TASK_STATE_PENDING || tk.GetParked() {
		t.Fatalf("task: %v", tk)
	}
}

// A node that dies while its task waits for approval parks the task
// rather than placing it elsewhere to wait again; cancelling a parked
// task ends it at once.
func TestNodeDownParksWaitingTaskAndCancelEndsIt(t *testing.T) {
	tf := newTestFSM(t)
	tf.registerNode("n1", 4)
	id := tf.waitingTask()
	tf.ok(&fsmv1.NodeOp{Id: "n1", Op: fsmv1.NodeOp_OP_DOWN, Reason: "no heartbeat", Time: timestamppb.New(t0)})
	tk := tf.mustTask(id)
	if tk.GetState() != warrenv1.TaskState_TASK_STATE_WAITING_APPROVAL || !tk.GetParked() || tk.GetLease().GetNode() != "" {
		t.Fatalf("task after its node died: %v", tk)
	}
	evs := tf.events(id)
	if last := evs[len(evs)-1]; last.GetKind() != KindParked {
		t.Fatalf("last event: %s", kindsOf(evs))
	}
	tf.ok(&fsmv1.CancelTask{TaskId: id, Time: timestamppb.New(t0)})
	if tk := tf.mustTask(id); tk.GetState() != warrenv1.TaskState_TASK_STATE_CANCELLED || tk.GetParked() {
		t.Fatalf("cancelled parked task: %v", tk)
	}
}

// The task record sums its model calls' usage and cost.
func TestTaskSumsModelUsage(t *testing.T) {
	tf := newTestFSM(t)
	id := tf.create("").GetId()
	call := func(p string) *warrenv1.EventInput {
		return &warrenv1.EventInput{Kind: KindModelCall, Payload: []byte(p)}
	}
	tf.ok(&fsmv1.AppendEvents{TaskId: id, Events: []*warrenv1.EventInput{
		call(`{"usage":{"input_tokens":100,"cache_write_tokens":900,"cache_read_tokens":0,"output_tokens":50},"cost_micro_usd":4000}`),
		call(`{"usage":{"input_tokens":100,"cache_write_tokens":0,"cache_read_tokens":1000,"output_tokens":30},"cost_micro_usd":900}`),
		call(`{}`),
	}, Time: timestamppb.New(t0)})
	u := tf.mustTask(id).GetUsage()
	if u.GetModelCalls() != 3 || u.GetInputTokens() != 200 || u.GetCacheWriteTokens() != 900 || u.GetCacheReadTokens() != 1000 ||
		u.GetOutputTokens() != 80 || u.GetCostMicroUsd() != 4900 || u.GetCacheHitRate() != 1000.0/2100 {
		t.Fatalf("usage = %v", u)
	}
}

// A cancel that lands while a waiting task parks, or before its node dies,
// is not lost: the task ends cancelled.
func TestCancelWhileParkingEndsTheTask(t *testing.T) {
	tf := newTestFSM(t)
	tf.registerNode("n1", 4)
	a := tf.waitingTask()
	tf.ok(&fsmv1.CancelTask{TaskId: a, Time: timestamppb.New(t0)})
	tf.ok(&fsmv1.AppendEvents{TaskId: a, LeaseEpoch: 1, Events: []*warrenv1.EventInput{{Kind: KindParked}}, Time: timestamppb.New(t0)})
	if tk := tf.mustTask(a); tk.GetState() != warrenv1.TaskState_TASK_STATE_CANCELLED || tk.GetParked() {
		t.Fatalf("parked after a cancel: %v", tk)
	}
	b := tf.waitingTask()
	tf.ok(&fsmv1.CancelTask{TaskId: b, Time: timestamppb.New(t0)})
	tf.ok(&fsmv1.NodeOp{Id: "n1", Op: fsmv1.NodeOp_OP_DOWN, Reason: "no heartbeat", Time: timestamppb.New(t0)})
	if tk := tf.mustTask(b); tk.GetState() != warrenv1.TaskState_TASK_STATE_CANCELLED {
		t.Fatalf("a cancelled waiting task whose node died: %v", tk)
	}
}

// A node daemon that restarts with a smaller capacity (an operator lowers
// --cpu, or the host lost memory) while it holds leases re-registers with
// less than it has allocated: a legal state (placement gives it nothing
// until leases end), which the invariants build took for a broken one and
// panicked in every replica's apply.
func TestReRegisterSmallerThanItsLeases(t *testing.T) {
	tf := newTestFSM(t)
	tf.registerNode("n1", 4)
	a, b := tf.create("").GetId(), tf.create("").GetId()
	tf.plan(at(a, "n1"), at(b, "n1"))
	defer func() {
		if r := recover(); r != nil {
			t.Fatalf("re-registering n1 with room for 1 task while it holds 2 panicked: %v", r)
		}
	}()
	n := tf.ok(&fsmv1.RegisterNode{Node: &warrenv1.Node{
		Id: "n1", Drivers: []string{DefaultDriver},
		Capacity: &warrenv1.Resources{MilliCpu: DefaultTaskMilliCPU, MemoryBytes: DefaultTaskMemoryBytes},
	}, Time: timestamppb.New(t0)})[0].GetNode()
	if n.GetTaskCount() != 2 {
		t.Fatalf("node after re-register: %v", n)
	}
}

// A task cancelled while placed (or running) whose node then dies, or
// which its node gives back, ends cancelled: it went back to pending, to
// be placed again only to record the cancellation (and where no node fits
// it, it sat in pending for good although the cancel was accepted).
func TestCancelledTaskLetGoEndsCancelled(t *testing.T) {
	tf := newTestFSM(t)
	tf.registerNode("n1", 4)

	// Cancelled while being placed; its node dies before it starts.
	a := tf.create("").GetId()
	tf.plan(at(a, "n1"))
	tf.ok(&fsmv1.CancelTask{TaskId: a, Reason: "user", Time: timestamppb.New(t0)})
	// Cancelled while running; its node gives it back (drain) at the step boundary.
	b := tf.create("").GetId()
	tf.plan(at(b, "n1"))
	tf.ok(&fsmv1.AppendEvents{TaskId: b, LeaseEpoch: 1, Events: []*warrenv1.EventInput{stateEvent("running")}, Time: timestamppb.New(t0)})
	tf.ok(&fsmv1.CancelTask{TaskId: b, Reason: "user", Time: timestamppb.New(t0)})
	tf.ok(&fsmv1.AppendEvents{TaskId: b, LeaseEpoch: 1, Events: []*warrenv1.EventInput{stateEvent("pending")}, Time: timestamppb.New(t0)})

	tf.ok(&fsmv1.NodeOp{Id: "n1", Op: fsmv1.NodeOp_OP_DOWN, Reason: "no heartbeat", Time: timestamppb.New(t0)})
	var bad []string
	for _, id := range []string{a, b} {
		tk := tf.mustTask(id)
		if tk.GetState() != warrenv1.TaskState_TASK_STATE_CANCELLED {
			bad = append(bad, id+": "+StateName(tk.GetState())+" cancel_requested="+map[bool]string{true: "true", false: "false"}[tk.GetCancelRequested()])
		}
	}
	if len(bad) > 0 {
		t.Fatalf("cancelled tasks requeued instead of ending cancelled: %v", bad)
	}
}

// DrainNode's deadline_seconds is bounded (a year): 18446744074 s (about
// 584 years) wrapped to 0.29 s in a time.Duration, a drain that forced
// the node's tasks off at once. It is refused, naming the field.
func TestDrainDeadlineBeyondAYearIsRefused(t *testing.T) {
	n := startSingle(t)
	cc := warrenv1connect.NewClusterServiceClient(http.DefaultClient, n.url)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := cc.RegisterNode(ctx, connect.NewRequest(&warrenv1.RegisterNodeRequest{Node: &warrenv1.Node{
		Id: "node-a", Drivers: []string{"sim"}, Capacity: &warrenv1.Resources{MilliCpu: 4000, MemoryBytes: 8 << 30},
	}})); err != nil {
		t.Fatal(err)
	}
	for _, secs := range []int64{18446744074, -1} {
		_, err := cc.DrainNode(ctx, connect.NewRequest(&warrenv1.DrainNodeRequest{Id: "node-a", DeadlineSeconds: secs}))
		if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "deadline_seconds") {
			t.Fatalf("deadline_seconds %d: %v, want invalid_argument naming it", secs, err)
		}
	}
	resp, err := cc.DrainNode(ctx, connect.NewRequest(&warrenv1.DrainNodeRequest{Id: "node-a", DeadlineSeconds: 7200}))
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Until(resp.Msg.GetNode().GetDrainDeadline().AsTime()); d < 119*time.Minute || d > 2*time.Hour {
		t.Fatalf("a 2 h drain's deadline is %v from now", d)
	}
}

// A read of a task's lease index entry that fails (an I/O or checksum
// error) stops the apply, as any other read in Apply does, instead of
// passing for "not accounted" and keeping the node's resources and index
// entry on this replica only.
func TestReleasePanicsOnAReadError(t *testing.T) {
	var fail atomic.Bool
	fs := errorfs.Wrap(vfs.NewMem(), errorfs.InjectorFunc(func(op errorfs.Op) error {
		if fail.Load() && strings.HasSuffix(op.Path, ".sst") && op.Kind.ReadOrWrite() == errorfs.OpIsRead {
			return errorfs.ErrInjected
		}
		return nil
	}))
	db, err := raftlog.OpenWithFS("db", fs)
	if err != nil {
		t.Fatal(err)
	}
	task := &warrenv1.Task{Id: "t1", Lease: &warrenv1.Lease{Node: "n1", Epoch: 1}}
	if err := db.Set(keyNodeTask("n1", task.GetId()), nil, pebble.Sync); err != nil {
		t.Fatal(err)
	}
	if err := db.Flush(); err != nil {
		t.Fatal(err)
	}
	// Reopen with an empty block cache, so the read goes to the sstable.
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if db, err = raftlog.OpenWithFS("db", fs); err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	b := db.NewIndexedBatch()
	defer b.Close()
	a := &applier{b: b, nodes: map[string]*cachedNode{}}

	fail.Store(true)
	defer fail.Store(false)
	defer func() {
		r := recover()
		if r == nil || !strings.Contains(fmt.Sprint(r), errorfs.ErrInjected.Error()) {
			t.Fatalf("release with a failing read: recover() = %v, want a panic with the injected error", r)
		}
	}()
	a.release(task)
}

// A finished task whose release was skipped on one replica (before release
// panicked on read errors, one taken for "not found" kept the task's lease
// index entry and its node's resources there) is not requeued when its
// node goes down: that would bring it back to pending on that replica
// alone. The down releases it instead, which puts the replica back in step.
func TestNodeDownLeavesAFinishedTaskWithAStaleIndexEntryFinished(t *testing.T) {
	tf := newTestFSM(t)
	tf.registerNode("n1", 2)
	a := tf.create("").GetId()
	tf.plan(at(a, "n1"))
	held, closer, err := tf.db.Get(keyNode("n1"))
	if err != nil {
		t.Fatal(err)
	}
	held = append([]byte(nil), held...)
	closer.Close()
	tf.ok(&fsmv1.AppendEvents{TaskId: a, LeaseEpoch: 1, Events: []*warrenv1.EventInput{stateEvent("running"), stateEvent("succeeded")}, Time: timestamppb.New(t0)})

	// The state of the replica that skipped the release.
	if err := tf.db.Set(keyNode("n1"), held, pebble.Sync); err != nil {
		t.Fatal(err)
	}
	if err := tf.db.Set(keyNodeTask("n1", a), nil, pebble.Sync); err != nil {
		t.Fatal(err)
	}
	if n := tf.mustNode("n1"); n.GetTaskCount() != 1 {
		t.Fatalf("set-up: node %v", n)
	}

	tf.ok(&fsmv1.NodeOp{Id: "n1", Op: fsmv1.NodeOp_OP_DOWN, Reason: "no heartbeat", Time: timestamppb.New(t0)})
	if tk := tf.mustTask(a); tk.GetState() != warrenv1.TaskState_TASK_STATE_SUCCEEDED || tk.GetLease().GetEpoch() != 1 {
		t.Fatalf("finished task after its node went down: %s, lease %v", StateName(tk.GetState()), tk.GetLease())
	}
	if n := tf.mustNode("n1"); n.GetTaskCount() != 0 || n.GetAllocated().GetMilliCpu() != 0 || n.GetAllocated().GetMemoryBytes() != 0 {
		t.Fatalf("node after down: %v", n)
	}
	if ts, err := tf.fsm.NodeTasks("n1"); err != nil || len(ts) != 0 {
		t.Fatalf("NodeTasks(n1) after down = %d tasks, %v; want none", len(ts), err)
	}
}

// A node that registers again without a task's driver, template or
// labels loses that task's lease: the task is requeued under a new epoch
// and its resources come back, instead of the hello's reconcile starting
// it there (under a weaker driver, or to fail for good on a template the
// node no longer has). A plan made before such a registration is refused
// when it lands after it. A registration that still fits keeps the lease.
func TestReRegisterWithoutWhatATaskNeedsRequeuesIt(t *testing.T) {
	register := func(tf *testFSM, drivers, templates []string, labels map[string]string) {
		tf.t.Helper()
		tf.ok(&fsmv1.RegisterNode{Node: &warrenv1.Node{
			Id: "n1", Drivers: drivers, Templates: templates, Labels: labels,
			Capacity: &warrenv1.Resources{MilliCpu: 4 * DefaultTaskMilliCPU, MemoryBytes: 4 * DefaultTaskMemoryBytes},
		}, Time: timestamppb.New(t0)})
	}
	create := func(tf *testFSM, template string, selector map[string]string) string {
		tf.t.Helper()
		spec := testSpec()
		spec.Driver, spec.Template, spec.NodeSelector = "sim", template, selector
		return tf.ok(&fsmv1.CreateTask{Id: ulid.Make().String(), Tenant: "default", Spec: spec, Time: timestamppb.New(t0)})[0].GetTask().GetId()
	}
	gpu := map[string]string{"gpu": "1"}
	for _, c := range []struct {
		name      string
		template  string
		selector  map[string]string
		drivers   []string
		templates []string
		labels    map[string]string
		reason    string // "" when the lease stays
	}{
		{"template dropped", "go", nil, []string{"sim"}, nil, gpu, "node n1 no longer offers template go"},
		{"driver changed", "go", nil, []string{"container"}, []string{"go"}, gpu, "node n1 no longer offers driver sim"},
		{"label dropped", "", gpu, []string{"sim"}, []string{"go"}, nil, "node n1 no longer offers labels gpu=1"},
		{"label changed", "", gpu, []string{"sim"}, []string{"go"}, map[string]string{"gpu": "2"}, "node n1 no longer offers labels gpu=1"},
		// A task naming no template runs the node's default one, which
		// placement does not look for in the node's list.
		{"no template, templates dropped", "", nil, []string{"sim"}, nil, nil, ""},
		{"still fits", "go", gpu, []string{"container", "sim"}, []string{"go", "py"}, map[string]string{"gpu": "1", "zone": "a"}, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			tf := newTestFSM(t)
			register(tf, []string{"sim"}, []string{"go"}, gpu)
			id := create(tf, c.template, c.selector)
			if errs := tf.plan(at(id, "n1")); errs[0] != "" {
				t.Fatal(errs[0])
			}
			register(tf, c.drivers, c.templates, c.labels)
			tk, n := tf.mustTask(id), tf.mustNode("n1")
			if c.reason == "" {
				if tk.GetState() != warrenv1.TaskState_TASK_STATE_PLACED || tk.GetLease().GetNode() != "n1" || tk.GetLease().GetEpoch() != 1 ||
					n.GetTaskCount() != 1 || n.GetAllocated().GetMilliCpu() != DefaultTaskMilliCPU {
					t.Fatalf("a registration that still fits moved the task: %v\nnode %v", tk, n)
				}
				return
			}
			if tk.GetState() != warrenv1.TaskState_TASK_STATE_PENDING || tk.GetLease().GetNode() != "" || tk.GetLease().GetEpoch() != 2 ||
				!tk.GetResume() || tk.GetLastFailedNode() != "n1" {
				t.Fatalf("task after n1 registered without what it needs: %v", tk)
			}
			if n.GetTaskCount() != 0 || n.GetAllocated().GetMilliCpu() != 0 || n.GetAllocated().GetMemoryBytes() != 0 {
				t.Fatalf("n1 still holds the task's resources: %v", n)
			}
			if held, err := tf.fsm.NodeTasks("n1"); err != nil || len(held) != 0 {
				t.Fatalf("n1's lease index: %v, %v", held, err)
			}
			evs := tf.events(id)
			if last := evs[len(evs)-1]; last.GetKind() != KindStateChanged || !strings.Contains(string(last.GetPayload()), c.reason) {
				t.Fatalf("last event %s %s, want a requeue saying %q", last.GetKind(), last.GetPayload(), c.reason)
			}
			// A plan made before the registration, landing after it.
			if errs := tf.plan(at(id, "n1")); !strings.Contains(errs[0], "node n1 does not offer") {
				t.Fatalf("placement on n1 after it registered without what the task needs: %q", errs[0])
			}
		})
	}
}

// ApplyPlan checks a placement against the node's driver, template and
// labels as they are at apply: a plan made on a snapshot from before the
// node registered again without them is refused.
func TestPlanChecksDriverTemplateAndLabelsAtApply(t *testing.T) {
	tf := newTestFSM(t)
	tf.ok(&fsmv1.RegisterNode{Node: &warrenv1.Node{
		Id: "n1", Drivers: []string{"sim"}, Templates: []string{"go"}, Labels: map[string]string{"gpu": "1"},
		Capacity: &warrenv1.Resources{MilliCpu: 4 * DefaultTaskMilliCPU, MemoryBytes: 4 * DefaultTaskMemoryBytes},
	}, Time: timestamppb.New(t0)})
	var ids []string
	for _, mod := range []func(*warrenv1.TaskSpec){
		func(s *warrenv1.TaskSpec) { s.Driver = "microvm" },
		func(s *warrenv1.TaskSpec) { s.Template = "py" },
		func(s *warrenv1.TaskSpec) { s.NodeSelector = map[string]string{"gpu": "2"} },
		func(s *warrenv1.TaskSpec) { s.Template, s.NodeSelector = "go", map[string]string{"gpu": "1"} },
		func(s *warrenv1.TaskSpec) {}, // no template: the node's default one
	} {
		spec := testSpec()
		spec.Driver = "sim"
		mod(spec)
		ids = append(ids, tf.ok(&fsmv1.CreateTask{Id: ulid.Make().String(), Tenant: "default", Spec: spec, Time: timestamppb.New(t0)})[0].GetTask().GetId())
	}
	errs := tf.plan(at(ids[0], "n1"), at(ids[1], "n1"), at(ids[2], "n1"), at(ids[3], "n1"), at(ids[4], "n1"))
	for i, want := range []string{"node n1 does not offer driver microvm", "node n1 does not offer template py", "node n1 does not offer labels gpu=2", "", ""} {
		if errs[i] != want {
			t.Errorf("placement %d: %q, want %q", i, errs[i], want)
		}
	}
	if n := tf.mustNode("n1"); n.GetTaskCount() != 2 {
		t.Fatalf("n1 after the plan: %v", n)
	}
}

// The liveness loop's down for a passed drain deadline names the deadline
// it read, and applies only if the node is still draining with it: an
// uncordon (or a drain with a later deadline) committed between the
// leader's read and the down keeps the node and its tasks. A down with
// no deadline (no heartbeat) applies as before. A deadline does not
// outlive the drain.
func TestDrainDownAppliesOnlyToTheDrainItSaw(t *testing.T) {
	tf := newTestFSM(t)
	tf.registerNode("n1", 4)
	a := tf.create("").GetId()
	if errs := tf.plan(at(a, "n1")); errs[0] != "" {
		t.Fatal(errs[0])
	}
	dl := timestamppb.New(t0)
	drainDown := &fsmv1.NodeOp{Id: "n1", Op: fsmv1.NodeOp_OP_DOWN, Reason: "drain deadline passed", DrainDeadline: dl, Time: timestamppb.New(t0.Add(time.Minute))}

	tf.ok(&fsmv1.NodeOp{Id: "n1", Op: fsmv1.NodeOp_OP_DRAIN, DrainDeadline: dl, Time: timestamppb.New(t0)})
	if n := tf.ok(&fsmv1.NodeOp{Id: "n1", Op: fsmv1.NodeOp_OP_UNCORDON, Time: timestamppb.New(t0)})[0].GetNode(); n.GetDrainDeadline() != nil {
		t.Fatalf("an uncordon kept the drain's deadline: %v", n)
	}
	if r := tf.apply(drainDown)[0]; connect.Code(r.GetCode()) != connect.CodeFailedPrecondition {
		t.Fatalf("a drain's down after an uncordon: %v %s, want failed_precondition", connect.Code(r.GetCode()), r.GetMessage())
	}
	if n := tf.mustNode("n1"); n.GetStatus() != warrenv1.NodeStatus_NODE_STATUS_READY || n.GetTaskCount() != 1 {
		t.Fatalf("n1 after a stale drain down: %v", n)
	}
	if tk := tf.mustTask(a); tk.GetState() != warrenv1.TaskState_TASK_STATE_PLACED || tk.GetLease().GetEpoch() != 1 {
		t.Fatalf("task after a stale drain down: %v", tk)
	}

	// Drained again with a later deadline: the down for the first one
	// does not apply; the down for this one does.
	later := timestamppb.New(t0.Add(time.Hour))
	tf.ok(&fsmv1.NodeOp{Id: "n1", Op: fsmv1.NodeOp_OP_DRAIN, DrainDeadline: later, Time: timestamppb.New(t0)})
	if r := tf.apply(drainDown)[0]; connect.Code(r.GetCode()) != connect.CodeFailedPrecondition {
		t.Fatalf("a down for an earlier drain deadline: %v %s, want failed_precondition", connect.Code(r.GetCode()), r.GetMessage())
	}
	if n := tf.mustNode("n1"); n.GetStatus() != warrenv1.NodeStatus_NODE_STATUS_DRAINING || n.GetTaskCount() != 1 {
		t.Fatalf("n1 after a down for an earlier deadline: %v", n)
	}
	n := tf.ok(&fsmv1.NodeOp{Id: "n1", Op: fsmv1.NodeOp_OP_DOWN, Reason: "drain deadline passed", DrainDeadline: later, Time: timestamppb.New(t0)})[0].GetNode()
	if n.GetStatus() != warrenv1.NodeStatus_NODE_STATUS_DOWN || n.GetTaskCount() != 0 || n.GetDrainDeadline() != nil {
		t.Fatalf("n1 after the down for its drain's deadline: %v", n)
	}
	if tk := tf.mustTask(a); tk.GetState() != warrenv1.TaskState_TASK_STATE_PENDING || tk.GetLease().GetEpoch() != 2 {
		t.Fatalf("task after its node's drain deadline passed: %v", tk)
	}
	if n := tf.registerNode("n1", 4); n.GetStatus() != warrenv1.NodeStatus_NODE_STATUS_READY || n.GetDrainDeadline() != nil {
		t.Fatalf("n1 registered again after a drain's down: %v", n)
	}

	// A plain down (no heartbeat) applies whatever the node's state.
	tf.ok(&fsmv1.NodeOp{Id: "n1", Op: fsmv1.NodeOp_OP_UNCORDON, Time: timestamppb.New(t0)}) // a drain cordons
	if errs := tf.plan(at(a, "n1")); errs[0] != "" {
		t.Fatal(errs[0])
	}
	tf.ok(&fsmv1.NodeOp{Id: "n1", Op: fsmv1.NodeOp_OP_DRAIN, DrainDeadline: later, Time: timestamppb.New(t0)})
	tf.ok(&fsmv1.NodeOp{Id: "n1", Op: fsmv1.NodeOp_OP_DOWN, Reason: "no heartbeat for 3s", Time: timestamppb.New(t0)})
	if n := tf.mustNode("n1"); n.GetStatus() != warrenv1.NodeStatus_NODE_STATUS_DOWN || n.GetTaskCount() != 0 {
		t.Fatalf("n1 after a plain down: %v", n)
	}
	if tk := tf.mustTask(a); tk.GetState() != warrenv1.TaskState_TASK_STATE_PENDING || tk.GetLease().GetEpoch() != 4 {
		t.Fatalf("task after a plain down: %v", tk)
	}
}

func removeOp(id string) *fsmv1.NodeOp {
	return &fsmv1.NodeOp{Id: id, Op: fsmv1.NodeOp_OP_REMOVE, Reason: "operator", Time: timestamppb.New(t0)}
}

// A decommissioned node is removed once it is down: it leaves the node
// list with its lease index, a second remove finds nothing, and its id
// registers again as a new node, ready and eligible, with none of the
// old record's cordon, drain deadline or times (before, nothing removed
// a node: it stayed down in every list for good, and a reused id
// inherited Eligible=false).
func TestRemoveDownNode(t *testing.T) {
	tf := newTestFSM(t)
	var removed []string
	tf.fsm.nodeRemoved = func(id string) { removed = append(removed, id) }
	tf.registerNode("n1", 2)
	tf.registerNode("n2", 2)
	a := tf.create("").GetId()
	tf.plan(at(a, "n1"))
	tf.ok(&fsmv1.NodeOp{Id: "n1", Op: fsmv1.NodeOp_OP_DRAIN, DrainDeadline: timestamppb.New(t0.Add(time.Hour)), Time: timestamppb.New(t0)})
	tf.ok(&fsmv1.NodeOp{Id: "n1", Op: fsmv1.NodeOp_OP_DOWN, Reason: "drain deadline passed", Time: timestamppb.New(t0)})

	got := tf.ok(removeOp("n1"))[0].GetNode()
	if got.GetId() != "n1" || got.GetStatus() != warrenv1.NodeStatus_NODE_STATUS_DOWN {
		t.Fatalf("remove answered %v, want n1's record as it was removed (down)", got)
	}
	if len(removed) != 1 || removed[0] != "n1" {
		t.Fatalf("nodeRemoved called with %v, want [n1]", removed)
	}
	nodes, err := tf.fsm.Nodes()
	if err != nil || len(nodes) != 1 || nodes[0].GetId() != "n2" {
		t.Fatalf("Nodes() after removing n1 = %v, %v; want n2 only", nodes, err)
	}
	if _, err := tf.fsm.Node("n1"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Node(n1) after its removal: %v, want ErrNotFound", err)
	}
	if n := tf.indexEntries("n1"); n != 0 {
		t.Fatalf("n1's lease index holds %d entries after its removal", n)
	}
	if tk := tf.mustTask(a); tk.GetState() != warrenv1.TaskState_TASK_STATE_PENDING || tk.GetLastFailedNode() != "n1" {
		t.Fatalf("n1's task after the removal: %v", tk)
	}

	// A second remove (a retry, a typo) finds nothing and writes nothing.
	r := tf.apply(removeOp("n1"))[0]
	if connect.Code(r.GetCode()) != connect.CodeNotFound || !strings.Contains(r.GetMessage(), `node "n1" not found`) {
		t.Fatalf("second remove: %v %s, want not_found", connect.Code(r.GetCode()), r.GetMessage())
	}
	if len(removed) != 1 {
		t.Fatalf("nodeRemoved called for a refused remove: %v", removed)
	}

	// The id registers again as a new node.
	t1 := t0.Add(time.Hour)
	n := tf.ok(&fsmv1.RegisterNode{Node: &warrenv1.Node{
		Id: "n1", Drivers: []string{DefaultDriver}, Capacity: &warrenv1.Resources{MilliCpu: 2 * DefaultTaskMilliCPU, MemoryBytes: 2 * DefaultTaskMemoryBytes},
	}, Time: timestamppb.New(t1)})[0].GetNode()
	if n.GetStatus() != warrenv1.NodeStatus_NODE_STATUS_READY || !n.GetEligible() || n.GetDrainDeadline() != nil ||
		n.GetStatusReason() != "" || !n.GetRegisteredAt().AsTime().Equal(t1) || n.GetTaskCount() != 0 || n.GetAllocated().GetMilliCpu() != 0 {
		t.Fatalf("n1 registered after its removal: %v, want a new ready, eligible node registered at %v", n, t1)
	}
	if errs := tf.plan(at(a, "n1")); errs[0] != "" {
		t.Fatalf("placement on the new n1: %s", errs[0])
	}
}

// Only a down node is removed: a ready or draining one runs (or may run)
// tasks, and its daemon would keep its session. The refusal says what to
// do, and leaves the node as it was. An unknown node is not_found.
func TestRemoveNodeRefusesANodeThatIsNotDown(t *testing.T) {
	tf := newTestFSM(t)
	tf.registerNode("n1", 2)
	tf.registerNode("n2", 2)
	tf.ok(&fsmv1.NodeOp{Id: "n1", Op: fsmv1.NodeOp_OP_CORDON, Time: timestamppb.New(t0)})
	tf.ok(&fsmv1.NodeOp{Id: "n2", Op: fsmv1.NodeOp_OP_DRAIN, DrainDeadline: timestamppb.New(t0.Add(time.Hour)), Time: timestamppb.New(t0)})
	for id, want := range map[string]string{
		"n1": "node n1 is ready: only a down node can be removed; drain it and stop it first",
		"n2": "node n2 is draining: only a down node can be removed; stop its daemon once its tasks have moved off",
	} {
		before := tf.mustNode(id)
		r := tf.apply(removeOp(id))[0]
		if connect.Code(r.GetCode()) != connect.CodeFailedPrecondition || !strings.Contains(r.GetMessage(), want) {
			t.Errorf("remove %s: %v %q, want failed_precondition %q", id, connect.Code(r.GetCode()), r.GetMessage(), want)
		}
		if after := tf.mustNode(id); !proto.Equal(before, after) {
			t.Errorf("a refused remove changed %s: %v, then %v", id, before, after)
		}
	}
	r := tf.apply(removeOp("ghost"))[0]
	if connect.Code(r.GetCode()) != connect.CodeNotFound || !strings.Contains(r.GetMessage(), `node "ghost" not found`) {
		t.Fatalf("remove of an unknown node: %v %s, want not_found", connect.Code(r.GetCode()), r.GetMessage())
	}
}

// A down node whose lease index still names an unfinished task (a down
// requeues them all, so only a replica out of step has one) is not
// removed: the task would be left leased to a node that no longer exists.
// The refusal counts and names them. Entries of finished or missing
// tasks are stale and go with the node.
func TestRemoveNodeRefusesWhileItHoldsLeases(t *testing.T) {
	tf := newTestFSM(t)
	tf.registerNode("n1", 4)
	a, b := tf.create("").GetId(), tf.create("").GetId()
	tf.plan(at(a, "n1"), at(b, "n1"))
	tf.ok(&fsmv1.AppendEvents{TaskId: b, LeaseEpoch: 1, Events: []*warrenv1.EventInput{stateEvent("running"), stateEvent("succeeded")}, Time: timestamppb.New(t0)})
	tf.ok(&fsmv1.NodeOp{Id: "n1", Op: fsmv1.NodeOp_OP_DOWN, Reason: "no heartbeat", Time: timestamppb.New(t0)})
	// The index of a replica out of step: a (pending again) still
	// there, b (finished) and a task that does not exist.
	for _, id := range []string{a, b, "01J0000000000000000000GONE"} {
		if err := tf.db.Set(keyNodeTask("n1", id), nil, pebble.Sync); err != nil {
			t.Fatal(err)
		}
	}
	r := tf.apply(removeOp("n1"))[0]
	if want := "node n1 still holds 1 lease of unfinished tasks (" + a + ")"; connect.Code(r.GetCode()) != connect.CodeFailedPrecondition || !strings.Contains(r.GetMessage(), want) {
		t.Fatalf("remove of a node holding a lease: %v %q, want failed_precondition %q", connect.Code(r.GetCode()), r.GetMessage(), want)
	}
	if n := tf.indexEntries("n1"); n != 3 {
		t.Fatalf("a refused remove left %d index entries, want the 3 it found", n)
	}
	tf.mustNode("n1")

	tf.ok(&fsmv1.CancelTask{TaskId: a, Time: timestamppb.New(t0)}) // pending: it ends at once
	tf.ok(removeOp("n1"))
	if n := tf.indexEntries("n1"); n != 0 {
		t.Fatalf("the removal left %d stale index entries", n)
	}
	if tk := tf.mustTask(b); tk.GetState() != warrenv1.TaskState_TASK_STATE_SUCCEEDED || tk.GetLease().GetNode() != "n1" {
		t.Fatalf("a finished task after its node's removal: %v (it keeps where it ran)", tk)
	}
}

// Within one batch, a removed node reads as not found and its record is
// deleted at the end, unless a later command registers the id again.
func TestRemoveNodeWithinABatch(t *testing.T) {
	tf := newTestFSM(t)
	tf.registerNode("n1", 2)
	tf.registerNode("n2", 2)
	down := func(id string) *fsmv1.NodeOp {
		return &fsmv1.NodeOp{Id: id, Op: fsmv1.NodeOp_OP_DOWN, Time: timestamppb.New(t0)}
	}
	cordon := &fsmv1.NodeOp{Id: "n1", Op: fsmv1.NodeOp_OP_CORDON, Time: timestamppb.New(t0)}
	res := tf.apply(down("n1"), removeOp("n1"), cordon, down("n2"), removeOp("n2"),
		&fsmv1.RegisterNode{Node: &warrenv1.Node{Id: "n2", Drivers: []string{"sim"}, Capacity: &warrenv1.Resources{MilliCpu: 1000, MemoryBytes: 1 << 30}}, Time: timestamppb.New(t0)})
	for i, want := range []connect.Code{0, 0, connect.CodeNotFound, 0, 0, 0} {
		if got := connect.Code(res[i].GetCode()); got != want {
			t.Errorf("command %d: %v %s, want %v", i, got, res[i].GetMessage(), want)
		}
	}
	nodes, err := tf.fsm.Nodes()
	if err != nil || len(nodes) != 1 || nodes[0].GetId() != "n2" || nodes[0].GetStatus() != warrenv1.NodeStatus_NODE_STATUS_READY || !nodes[0].GetEligible() {
		t.Fatalf("Nodes() = %v, %v; want n2 alone, registered again ready", nodes, err)
	}
	tf.reopen() // what was committed, not a cache
	if _, err := tf.fsm.Node("n1"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("n1 after the batch and a reopen: %v", err)
	}
}

// indexEntries counts the entries of node's lease index.
func (tf *testFSM) indexEntries(node string) int {
	tf.t.Helper()
	prefix := keyNodeTasks(node)
	it, err := tf.db.NewIter(&pebble.IterOptions{LowerBound: prefix, UpperBound: prefixEnd(prefix)})
	if err != nil {
		tf.t.Fatal(err)
	}
	defer it.Close()
	n := 0
	for ok := it.First(); ok; ok = it.Next() {
		n++
	}
	return n
}

// RemoveNode through the API: the id is checked, the FSM's refusals come
// back with their codes, and a removal on the leader drops its in-memory
// view of the node (FSM.nodeRemoved is wired to sessions.forget).
func TestRemoveNodeAPI(t *testing.T) {
	n := startSingle(t)
	cc := warrenv1connect.NewClusterServiceClient(http.DefaultClient, n.url)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := cc.RegisterNode(ctx, connect.NewRequest(&warrenv1.RegisterNodeRequest{Node: &warrenv1.Node{
		Id: "node-a", Drivers: []string{"sim"}, Capacity: &warrenv1.Resources{MilliCpu: 4000, MemoryBytes: 8 << 30},
	}})); err != nil {
		t.Fatal(err)
	}
	remove := func(id string) (*warrenv1.Node, error) {
		resp, err := cc.RemoveNode(ctx, connect.NewRequest(&warrenv1.NodeRequest{Id: id}))
		if err != nil {
			return nil, err
		}
		return resp.Msg.GetNode(), nil
	}
	for id, want := range map[string]connect.Code{"Node A": connect.CodeInvalidArgument, "node-a": connect.CodeFailedPrecondition, "node-b": connect.CodeNotFound} {
		if _, err := remove(id); connect.CodeOf(err) != want {
			t.Errorf("remove %q: %v, want %v", id, err, want)
		}
	}
	if _, _, err := n.srv.proposeLocal(ctx, &fsmv1.NodeOp{Id: "node-a", Op: fsmv1.NodeOp_OP_DOWN, Reason: "test", Time: timestamppb.Now()}); err != nil {
		t.Fatal(err)
	}
	n.srv.sess.gossip("node-a", true, time.Now())
	got, err := remove("node-a")
	if err != nil || got.GetId() != "node-a" || got.GetStatus() != warrenv1.NodeStatus_NODE_STATUS_DOWN {
		t.Fatalf("remove of the down node: %v, %v", got, err)
	}
	list, err := cc.ListNodes(ctx, connect.NewRequest(&warrenv1.ListNodesRequest{}))
	if err != nil || len(list.Msg.GetNodes()) != 0 {
		t.Fatalf("ListNodes after the removal: %v, %v; want none", list.Msg.GetNodes(), err)
	}
	n.srv.sess.mu.Lock()
	_, dead := n.srv.sess.gossipDead["node-a"]
	n.srv.sess.mu.Unlock()
	if dead {
		t.Fatal("the leader kept memberlist's verdict on the removed node")
	}
}
