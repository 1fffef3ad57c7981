package scheduler

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/warrenhq/warren/api"
	fsmv1 "github.com/warrenhq/warren/api/gen/warren/fsm/v1"
	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
	"github.com/warrenhq/warren/api/gen/warren/v1/warrenv1connect"
)

// A follower's group commit joins unrelated callers' commands into one
// Propose call. The leader answers each command it refuses (one that does
// not decode, or that validateForwarded refuses) in that command's own
// result, and applies the others, in order, with one result each: a bad
// command no longer fails every write that shared its batch.
func TestProposeRefusesOnlyTheBadCommandsOfAForwardedBatch(t *testing.T) {
	n := startSingle(t)
	id := createVia(t, n, 1).GetId()
	ts := timestamppb.New(t0)
	enc := func(m proto.Message) []byte {
		b, err := EncodeCommand(m)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	cmds := [][]byte{
		enc(&fsmv1.SendMessage{TaskId: id, Text: "first", RequestId: "m1", Time: ts}),
		enc(&fsmv1.NodeOp{Id: "n1", Op: fsmv1.NodeOp_OP_DOWN, Reason: "heartbeat", Time: ts}), // the leader's own verdict only
		{0xff, 0xff, 0xff}, // not a command
		enc(&fsmv1.SendMessage{TaskId: id, Text: "second", RequestId: "m2", Time: ts}),
	}
	cl := warrenv1connect.NewClusterServiceClient(http.DefaultClient, n.url)
	resp, err := cl.Propose(context.Background(), connect.NewRequest(&warrenv1.ProposeRequest{Commands: cmds}))
	if err != nil {
		t.Fatalf("a batch with two bad commands failed as a whole: %v", err)
	}
	if got := len(resp.Msg.GetResults()); got != len(cmds) {
		t.Fatalf("%d results for %d commands", got, len(cmds))
	}
	want := []connect.Code{0, connect.CodeInvalidArgument, connect.CodeInvalidArgument, 0}
	for i, b := range resp.Msg.GetResults() {
		var r fsmv1.Result
		if err := proto.Unmarshal(b, &r); err != nil {
			t.Fatal(err)
		}
		if connect.Code(r.GetCode()) != want[i] {
			t.Errorf("command %d: result %v, want code %d", i, &r, want[i])
		}
		if want[i] == 0 && r.GetFirstSeq() == 0 {
			t.Errorf("command %d: applied but no seq in its result %v", i, &r)
		}
		if want[i] != 0 && r.GetMessage() == "" {
			t.Errorf("command %d: refused without a message", i)
		}
	}
	evs, err := n.srv.FSM().Events(id, 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	var texts []string
	for _, e := range evs {
		if e.GetKind() == KindMessage {
			texts = append(texts, string(e.GetPayload()))
		}
	}
	if len(texts) != 2 || !strings.Contains(texts[0], "first") || !strings.Contains(texts[1], "second") {
		t.Fatalf("messages applied: %q, want first then second", texts)
	}

	// A batch of refused commands only: nothing to apply, and still an
	// answer per command rather than a failed call.
	resp, err = cl.Propose(context.Background(), connect.NewRequest(&warrenv1.ProposeRequest{Commands: cmds[1:3]}))
	if err != nil || len(resp.Msg.GetResults()) != 2 {
		t.Fatalf("a batch of bad commands only: %v, %v", resp, err)
	}
}

// syncBuffer is an io.Writer safe for the concurrent writes of a logger.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// A down is the leader's own verdict, and a leader refuses a forwarded
// one. declareDown on a server that stopped leading during its liveness
// round (here: a follower) proposes on this server only, so it fails with
// not-leader, and never forwards its downs into a batch with other
// callers' writes.
func TestDeclareDownIsNotForwardedByAServerThatStoppedLeading(t *testing.T) {
	logs := map[string]*syncBuffer{"s1": {}, "s2": {}, "s3": {}}
	nodes := startCluster(t, 0, func(c *Config) {
		c.Logger = slog.New(slog.NewTextHandler(logs[c.ID], &slog.HandlerOptions{Level: slog.LevelDebug}))
	})
	f := followerOf(nodes)
	f.srv.declareDown([]*fsmv1.NodeOp{{Id: "n1", Op: fsmv1.NodeOp_OP_DOWN, Reason: "heartbeat", Time: timestamppb.New(t0)}})
	got := logs[f.srv.ID()].String()
	if strings.Contains(got, "operator's op") {
		t.Fatalf("the follower forwarded its down to the leader, which refused it:\n%s", got)
	}
	var line string
	for _, l := range strings.Split(got, "\n") {
		if strings.Contains(l, "declare nodes down") {
			line = l
		}
	}
	if !strings.Contains(line, "not the leader") {
		t.Fatalf("declareDown on a follower: logged %q, want a not-leader failure", line)
	}
}

// Writers append to a task under its lease; the lease grant (and a plan)
// is what moves a task to placed, with a node holding it. A writer's
// state_changed to placed is refused, whether the task was never placed
// (epoch 0, no node) or was given back (pending again, no node): it would
// leave the task placed on no node, which placement skips (not pending)
// and no node's loss requeues.
func TestAppendRefusesAWritersStateChangeToPlaced(t *testing.T) {
	tf := newTestFSM(t)
	tf.registerNode("n1", 4)
	fresh := tf.create("").GetId()
	given := tf.create("").GetId()
	if errs := tf.plan(at(given, "n1")); errs[0] != "" {
		t.Fatal(errs[0])
	}
	tf.ok(&fsmv1.AppendEvents{TaskId: given, LeaseEpoch: 1, RequestId: "back",
		Events: []*warrenv1.EventInput{stateEvent("pending")}, Time: timestamppb.New(t0)})
	for _, id := range []string{fresh, given} {
		epoch := tf.mustTask(id).GetLease().GetEpoch()
		r := tf.apply(&fsmv1.AppendEvents{TaskId: id, LeaseEpoch: epoch, RequestId: "w",
			Events: []*warrenv1.EventInput{stateEvent("placed")}, Time: timestamppb.New(t0)})[0]
		if connect.Code(r.GetCode()) != connect.CodeFailedPrecondition {
			t.Errorf("task %s: a writer's state_changed to placed got %v, want failed_precondition", id, r)
		}
		tk := tf.mustTask(id)
		if tk.GetState() != warrenv1.TaskState_TASK_STATE_PENDING {
			t.Errorf("task %s is %s after the refused append, want pending", id, StateName(tk.GetState()))
		}
		// Placement still takes it.
		if errs := tf.plan(at(id, "n1")); errs[0] != "" {
			t.Errorf("task %s: placement after the refused append: %s", id, errs[0])
		}
	}
}

// A parked event lets the lease go and leaves the task waiting_approval
// until a decision; a state change after it in the same append is
// refused, and nothing of that append is written. A parked event alone,
// or after the append's own move to waiting_approval, still parks.
func TestAppendRefusesAStateChangeAfterParked(t *testing.T) {
	tf := newTestFSM(t)
	tf.registerNode("n1", 4)
	park := &warrenv1.EventInput{Kind: KindParked, Payload: []byte(`{"reason":"grace over"}`)}
	for _, to := range []string{"running", "pending", "failed", "waiting_approval"} {
		id := tf.waitingTask()
		before := tf.mustTask(id)
		r := tf.apply(&fsmv1.AppendEvents{TaskId: id, LeaseEpoch: 1, RequestId: "p-" + to,
			Events: []*warrenv1.EventInput{park, stateEvent(to)}, Time: timestamppb.New(t0)})[0]
		if connect.Code(r.GetCode()) != connect.CodeFailedPrecondition {
			t.Errorf("[parked, state_changed %s]: %v, want failed_precondition", to, r)
		}
		after := tf.mustTask(id)
		if after.GetParked() || after.GetState() != before.GetState() || after.GetNextSeq() != before.GetNextSeq() || after.GetLease().GetNode() != "n1" {
			t.Errorf("[parked, state_changed %s] wrote something: task %s parked=%v seq %d lease %v", to, StateName(after.GetState()), after.GetParked(), after.GetNextSeq(), after.GetLease())
		}
		// The parked event alone still parks.
		tf.ok(&fsmv1.AppendEvents{TaskId: id, LeaseEpoch: 1, RequestId: "park",
			Events: []*warrenv1.EventInput{park}, Time: timestamppb.New(t0)})
		if tk := tf.mustTask(id); !tk.GetParked() || tk.GetState() != warrenv1.TaskState_TASK_STATE_WAITING_APPROVAL {
			t.Errorf("a lone parked event: task %s parked=%v", StateName(tk.GetState()), tk.GetParked())
		}
	}
}

// A restore that fails after it began to replace the state (here: the
// copy, through restoreCopyHook) leaves the state anywhere between the old
// one and the snapshot's. The FSM then forgets its applied index, so the
// next restore raft tries (an older snapshot, at start) is applied in full
// instead of skipped as older than the local state, and reads fail
// (restores stays odd) until one succeeds.
func TestFailedRestoreLetsAnOlderSnapshotRestoreInFull(t *testing.T) {
	src := newTestFSM(t)
	a := src.create("a").GetId()
	src.create("x")
	old := snapshotBytes(t, src.fsm) // at index 2
	for range 3 {
		src.create("")
	}
	newer := snapshotBytes(t, src.fsm) // at index 5

	dst := newTestFSM(t)
	for range 3 {
		dst.create("") // applied 3: above the older snapshot, below the newer
	}
	restoreCopyHook = func() error { return errors.New("disk full (injected)") }
	err := dst.fsm.Restore(io.NopCloser(bytes.NewReader(newer)))
	restoreCopyHook = nil
	if err == nil {
		t.Fatal("the restore with a failing copy succeeded")
	}
	if got := dst.fsm.Applied(); got != 0 {
		t.Errorf("after a failed restore the applied index is %d, want 0", got)
	}
	if dst.fsm.restores.Load()%2 != 1 {
		t.Error("after a failed restore reads are served again (restores is even)")
	}
	// Nor is the partial state snapshotted (its applied index 0, any
	// server would restore it in full and serve it), nor applied to.
	if _, err := dst.fsm.Snapshot(); err == nil {
		t.Error("a snapshot of the state a failed restore left was taken")
	}
	func() {
		defer func() {
			if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), "restart the server") {
				t.Errorf("an entry applied on the state a failed restore left: recovered %v", r)
			}
		}()
		dst.create("")
	}()
	if err := dst.fsm.Restore(io.NopCloser(bytes.NewReader(old))); err != nil {
		t.Fatalf("restore of the older snapshot: %v", err)
	}
	if got := dst.fsm.Applied(); got != 2 {
		t.Errorf("after the older snapshot the applied index is %d, want 2", got)
	}
	if dst.fsm.restores.Load()%2 != 0 {
		t.Error("after a restore that succeeded, reads still fail (restores is odd)")
	}
	if _, err := dst.fsm.Task(a); err != nil {
		t.Fatalf("task %s of the older snapshot: %v", a, err)
	}
	dst.create("") // applied again once a restore succeeded
	if _, err := dst.fsm.Snapshot(); err != nil {
		t.Errorf("a snapshot after a restore succeeded: %v", err)
	}
	// A restore that fails before it replaces anything leaves all as it was.
	before := dst.fsm.Applied()
	if err := dst.fsm.Restore(io.NopCloser(strings.NewReader("not a tar archive"))); err == nil {
		t.Fatal("restore of garbage succeeded")
	}
	if dst.fsm.Applied() != before || dst.fsm.restores.Load()%2 != 0 {
		t.Errorf("a restore refused before replacing anything: applied %d, restores %d", dst.fsm.Applied(), dst.fsm.restores.Load())
	}
}

// Nothing follows the event that ends a task: streams end on it. The FSM
// refuses such an append whole, and the API refuses it before proposing,
// naming the event, along with the other shapes the FSM refuses whatever
// the task's state.
func TestAppendRefusesEventsAfterTheTerminalOne(t *testing.T) {
	tf := newTestFSM(t)
	task := tf.create("")
	tf.ok(&fsmv1.GrantLease{TaskId: task.GetId(), Node: "n1", Time: timestamppb.New(t0)})
	r := tf.apply(&fsmv1.AppendEvents{TaskId: task.GetId(), LeaseEpoch: 1, Time: timestamppb.New(t0),
		Events: []*warrenv1.EventInput{stateEvent("running"), stateEvent("succeeded"), logEvent("after the end")}})[0]
	if connect.Code(r.GetCode()) != connect.CodeFailedPrecondition {
		t.Fatalf("an append with an event after its terminal state_changed: %v, want failed_precondition", r)
	}
	if got := tf.mustTask(task.GetId()); got.GetState() != warrenv1.TaskState_TASK_STATE_PLACED {
		t.Errorf("task is %s after the refused append, want placed", StateName(got.GetState()))
	}
	for _, c := range []struct {
		evs  []*warrenv1.EventInput
		want string
	}{
		{[]*warrenv1.EventInput{stateEvent("failed"), logEvent("x")}, "events[1]: follows events[0], which ends the task"},
		{[]*warrenv1.EventInput{stateEvent("placed")}, "events[0].payload.to: placed is set by a lease grant"},
		{[]*warrenv1.EventInput{{Kind: KindParked}, stateEvent("running")}, "events[1]: a state change may not follow parked"},
		{[]*warrenv1.EventInput{logEvent("x"), {Kind: KindPayloadPart, Payload: []byte(`{}`)}}, "events[1]: a payload_part must be followed, in the same append, by the event it is part of"},
	} {
		err := validateAppend(&warrenv1.AppendEventsRequest{TaskId: task.GetId(), RequestId: "r", Events: c.evs})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("validateAppend: %v, want %q", err, c.want)
		}
	}
	if err := validateAppend(&warrenv1.AppendEventsRequest{TaskId: task.GetId(), RequestId: "r",
		Events: []*warrenv1.EventInput{logEvent("x"), stateEvent("succeeded")}}); err != nil {
		t.Errorf("a terminal state_changed last: %v", err)
	}
	// An event too large for one, split: its parts, then itself.
	split, err := api.SplitPayload(KindToolCall, []byte(`{"tool_call_id":"t1","input":"`+strings.Repeat("x", 100<<10)+`"}`))
	if err != nil || len(split) != 4 {
		t.Fatalf("split into %d events: %v", len(split), err)
	}
	if err := validateAppend(&warrenv1.AppendEventsRequest{TaskId: task.GetId(), RequestId: "r", Events: split}); err != nil {
		t.Errorf("a split event: %v", err)
	}
	if r := tf.apply(&fsmv1.AppendEvents{TaskId: task.GetId(), LeaseEpoch: 1, Time: timestamppb.New(t0), Events: split})[0]; r.GetCode() != 0 {
		t.Errorf("the FSM refused a split event: %v", r)
	}
	if r := tf.apply(&fsmv1.AppendEvents{TaskId: task.GetId(), LeaseEpoch: 1, Time: timestamppb.New(t0), Events: split[:3]})[0]; connect.Code(r.GetCode()) != connect.CodeFailedPrecondition {
		t.Errorf("the FSM took parts without their event: %v", r)
	}
}

// A restore that fails midway wakes the streams waiting for a task's next
// event: they read again, are refused (the state is unusable) and end, so
// their clients go to another server. Before, nothing woke them, and they
// sent nothing and never ended while restores kept failing.
func TestFailedRestoreWakesWaitingStreams(t *testing.T) {
	src := newTestFSM(t)
	for range 3 {
		src.create("")
	}
	newer := snapshotBytes(t, src.fsm)
	dst := newTestFSM(t)
	id := dst.create("").GetId()
	wake, release := dst.fsm.WatchTask(id)
	defer release()
	restoreCopyHook = func() error { return errors.New("disk full (injected)") }
	err := dst.fsm.Restore(io.NopCloser(bytes.NewReader(newer)))
	restoreCopyHook = nil
	if err == nil {
		t.Fatal("the restore with a failing copy succeeded")
	}
	select {
	case <-wake:
	case <-time.After(2 * time.Second):
		t.Fatal("a stream waiting on the task was not woken by the failed restore")
	}
}
