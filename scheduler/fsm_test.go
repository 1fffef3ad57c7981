package scheduler

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/cockroachdb/pebble/v2"
	"github.com/hashicorp/raft"
	"github.com/oklog/ulid/v2"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	fsmv1 "github.com/warrenhq/warren/api/gen/warren/fsm/v1"
	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
	"github.com/warrenhq/warren/raftlog"
)

var discard = slog.New(slog.NewTextHandler(io.Discard, nil))

// testFSM is an FSM over a real Pebble directory with a raft index counter.
type testFSM struct {
	t     testing.TB
	dir   string
	db    *pebble.DB
	fsm   *FSM
	index uint64
}

func newTestFSM(t testing.TB) *testFSM {
	t.Helper()
	tf := &testFSM{t: t, dir: t.TempDir()}
	tf.open()
	t.Cleanup(func() { tf.db.Close() })
	return tf
}

func (tf *testFSM) open() {
	db, err := raftlog.Open(filepath.Join(tf.dir, "db"))
	if err != nil {
		tf.t.Fatal(err)
	}
	f, err := NewFSM(db, filepath.Join(tf.dir, "tmp"), discard)
	if err != nil {
		tf.t.Fatal(err)
	}
	tf.db, tf.fsm = db, f
}

func (tf *testFSM) reopen() {
	tf.db.Close()
	tf.open()
}

var t0 = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

// apply applies commands as one batch entry at the next index.
func (tf *testFSM) apply(msgs ...proto.Message) []*fsmv1.Result {
	tf.t.Helper()
	tf.index++
	return tf.applyAt(tf.index, msgs...)
}

func (tf *testFSM) applyAt(index uint64, msgs ...proto.Message) []*fsmv1.Result {
	tf.t.Helper()
	cmds := make([][]byte, len(msgs))
	for i, m := range msgs {
		b, err := EncodeCommand(m)
		if err != nil {
			tf.t.Fatal(err)
		}
		cmds[i] = b
	}
	out := tf.fsm.Apply(&raft.Log{Index: index, Term: 1, Type: raft.LogCommand, Data: encodeBatch(cmds)})
	if out == nil {
		return nil
	}
	return out.([]*fsmv1.Result)
}

func (tf *testFSM) ok(msgs ...proto.Message) []*fsmv1.Result {
	tf.t.Helper()
	res := tf.apply(msgs...)
	for i, r := range res {
		if r.GetCode() != 0 {
			tf.t.Fatalf("command %d refused: %s %s", i, connect.Code(r.GetCode()), r.GetMessage())
		}
	}
	return res
}

func (tf *testFSM) create(reqID string) *warrenv1.Task {
	tf.t.Helper()
	return tf.ok(&fsmv1.CreateTask{Id: ulid.Make().String(), Tenant: "default", RequestId: reqID, Spec: testSpec(), Time: timestamppb.New(t0)})[0].GetTask()
}

func testSpec() *warrenv1.TaskSpec {
	return &warrenv1.TaskSpec{Repo: "https://example.com/r.git", Base: "main", IssueTitle: "fix it"}
}

func logEvent(msg string) *warrenv1.EventInput {
	return &warrenv1.EventInput{Kind: KindLog, Payload: []byte(fmt.Sprintf(`{"msg":%q}`, msg))}
}

func stateEvent(to string) *warrenv1.EventInput {
	return &warrenv1.EventInput{Kind: KindStateChanged, Payload: []byte(fmt.Sprintf(`{"to":%q}`, to))}
}

func (tf *testFSM) events(id string) []*warrenv1.Event {
	tf.t.Helper()
	evs, err := tf.fsm.Events(id, 0, 1<<20)
	if err != nil {
		tf.t.Fatal(err)
	}
	return evs
}

func kindsOf(evs []*warrenv1.Event) string {
	var ks []string
	for _, e := range evs {
		ks = append(ks, fmt.Sprintf("%d:%s", e.GetSeq(), e.GetKind()))
	}
	return strings.Join(ks, " ")
}

func TestCreateIsIdempotentOnRequestID(t *testing.T) {
	tf := newTestFSM(t)
	a := tf.create("req-1")
	res := tf.ok(&fsmv1.CreateTask{Id: ulid.Make().String(), Tenant: "default", RequestId: "req-1", Spec: testSpec(), Time: timestamppb.New(t0)})
	if res[0].GetTask().GetId() != a.GetId() || res[0].GetCreated() {
		t.Fatalf("retry created %s (created=%v), want the first task %s", res[0].GetTask().GetId(), res[0].GetCreated(), a.GetId())
	}
	// The key again with another spec is a mistake, not a retry: refused,
	// naming the key and the task it made.
	other := testSpec()
	other.IssueTitle = "another issue"
	res = tf.apply(&fsmv1.CreateTask{Id: ulid.Make().String(), Tenant: "default", RequestId: "req-1", Spec: other, Time: timestamppb.New(t0)})
	if connect.Code(res[0].GetCode()) != connect.CodeAlreadyExists || !strings.Contains(res[0].GetMessage(), `request_id "req-1": task `+a.GetId()) {
		t.Fatalf("the key again with another spec: %v, want already_exists naming it", res[0])
	}
	// Another tenant's identical key is a different task.
	res = tf.ok(&fsmv1.CreateTask{Id: ulid.Make().String(), Tenant: "other", RequestId: "req-1", Spec: testSpec(), Time: timestamppb.New(t0)})
	if res[0].GetTask().GetId() == a.GetId() || !res[0].GetCreated() {
		t.Fatal("request ids must be scoped by tenant")
	}
	if got := kindsOf(tf.events(a.GetId())); got != "1:task_created" {
		t.Fatalf("events = %s", got)
	}
}

func TestAppendAssignsGaplessSeqsAndIsIdempotent(t *testing.T) {
	tf := newTestFSM(t)
	task := tf.create("")
	r := tf.ok(&fsmv1.AppendEvents{TaskId: task.GetId(), Events: []*warrenv1.EventInput{logEvent("a"), logEvent("b")}, RequestId: "x", Time: timestamppb.New(t0)})[0]
	if r.GetFirstSeq() != 2 || r.GetLastSeq() != 3 {
		t.Fatalf("seqs %d..%d, want 2..3", r.GetFirstSeq(), r.GetLastSeq())
	}
	// Same request id: nothing new, same answer.
	r = tf.ok(&fsmv1.AppendEvents{TaskId: task.GetId(), Events: []*warrenv1.EventInput{logEvent("a"), logEvent("b")}, RequestId: "x", Time: timestamppb.New(t0)})[0]
	if r.GetFirstSeq() != 2 || r.GetLastSeq() != 3 {
		t.Fatalf("retry seqs %d..%d, want 2..3", r.GetFirstSeq(), r.GetLastSeq())
	}
	tf.ok(&fsmv1.SendMessage{TaskId: task.GetId(), Text: "hi", Time: timestamppb.New(t0)})
	if got := kindsOf(tf.events(task.GetId())); got != "1:task_created 2:log 3:log 4:message" {
		t.Fatalf("events = %s", got)
	}
	got, _ := tf.fsm.Task(task.GetId())
	if got.GetNextSeq() != 5 {
		t.Fatalf("next_seq = %d, want 5", got.GetNextSeq())
	}
	evs, _ := tf.fsm.Events(task.GetId(), 2, 1)
	if len(evs) != 1 || evs[0].GetSeq() != 3 || evs[0].GetTaskId() != task.GetId() {
		t.Fatalf("Events(after=2, limit=1) = %v", evs)
	}
}

func TestPositionedAppendIsExactlyOnceWithoutARecord(t *testing.T) {
	tf := newTestFSM(t)
	task := tf.create("")
	id := task.GetId()
	at := func(want uint64, req string, evs ...*warrenv1.EventInput) *fsmv1.AppendEvents {
		return &fsmv1.AppendEvents{TaskId: id, ExpectedSeq: want, RequestId: req, Events: evs, Time: timestamppb.New(t0)}
	}

	if r := tf.ok(at(2, "p1", logEvent("a"), logEvent("b")))[0]; seqs(r) != "2..3" {
		t.Fatalf("first append: %s, want 2..3", seqs(r))
	}
	// A retry in the same entry, in a later entry, and after a newer
	// append: the same seqs, nothing written.
	res := tf.ok(at(2, "p1", logEvent("a"), logEvent("b")), at(4, "p2", logEvent("c")), at(2, "p1", logEvent("a"), logEvent("b")))
	if seqs(res[0]) != "2..3" || seqs(res[1]) != "4..4" || seqs(res[2]) != "2..3" {
		t.Fatalf("retries and next append: %s %s %s", seqs(res[0]), seqs(res[1]), seqs(res[2]))
	}
	tf.reopen()
	if r := tf.ok(at(4, "p2", logEvent("c")))[0]; seqs(r) != "4..4" {
		t.Fatalf("retry after a restart: %s, want 4..4", seqs(r))
	}
	// The wrong position is refused and writes nothing: behind (with
	// another request id, or none, or inside the events of the append
	// whose id it reuses) and ahead.
	for _, m := range []*fsmv1.AppendEvents{at(4, "p3", logEvent("d")), at(2, "", logEvent("d")), at(3, "p1", logEvent("d")), at(9, "p3", logEvent("d"))} {
		r := tf.apply(m)[0]
		if connect.Code(r.GetCode()) != connect.CodeFailedPrecondition || !strings.Contains(r.GetMessage(), ErrSeqMismatch.Error()) || !strings.Contains(r.GetMessage(), "is at seq 5") {
			t.Fatalf("expected_seq %d: %v %q", m.GetExpectedSeq(), connect.Code(r.GetCode()), r.GetMessage())
		}
	}
	evs := tf.events(id)
	if got := kindsOf(evs); got != "1:task_created 2:log 3:log 4:log" {
		t.Fatalf("events = %s", got)
	}
	for _, e := range evs {
		want := map[uint64]string{2: "p1", 3: "p1", 4: "p2"}[e.GetSeq()]
		if e.GetRequestId() != want {
			t.Fatalf("event %d carries request id %q, want %q", e.GetSeq(), e.GetRequestId(), want)
		}
	}
	// No idempotency record was kept for them.
	for _, req := range []string{"p1", "p2"} {
		if _, closer, err := tf.db.Get(keyIdem("append/"+id, req)); err == nil {
			closer.Close()
			t.Fatalf("append %s left an idempotency record", req)
		}
	}

	// An append that reuses the request id of the events just before it is
	// refused: its events would join theirs, and a retry of the earlier
	// append would get both.
	other := tf.create("").GetId()
	tf.ok(&fsmv1.AppendEvents{TaskId: other, ExpectedSeq: 2, RequestId: "dup", Events: []*warrenv1.EventInput{logEvent("d")}, Time: timestamppb.New(t0)})
	if r := tf.apply(&fsmv1.AppendEvents{TaskId: other, ExpectedSeq: 3, RequestId: "dup", Events: []*warrenv1.EventInput{logEvent("e")}, Time: timestamppb.New(t0)})[0]; connect.Code(r.GetCode()) != connect.CodeAlreadyExists {
		t.Fatalf("append reusing the id just before it: %v %q", connect.Code(r.GetCode()), r.GetMessage())
	}
	tf.reopen() // the same answer from the log, without the FSM's memory
	if r := tf.apply(&fsmv1.AppendEvents{TaskId: other, ExpectedSeq: 3, RequestId: "dup", Events: []*warrenv1.EventInput{logEvent("e")}, Time: timestamppb.New(t0)})[0]; connect.Code(r.GetCode()) != connect.CodeAlreadyExists {
		t.Fatalf("after a restart: %v %q", connect.Code(r.GetCode()), r.GetMessage())
	}
	if r := tf.ok(&fsmv1.AppendEvents{TaskId: other, ExpectedSeq: 2, RequestId: "dup", Events: []*warrenv1.EventInput{logEvent("d")}, Time: timestamppb.New(t0)})[0]; seqs(r) != "2..2" {
		t.Fatalf("retry of the first: %s, want 2..2", seqs(r))
	}

	// A retry of the append that ended the task still gets its seqs, and
	// the events the FSM added for it count as its own.
	tf.ok(&fsmv1.GrantLease{TaskId: id, Node: "n1", Time: timestamppb.New(t0)}) // 5: state_changed to placed
	end := &fsmv1.AppendEvents{TaskId: id, LeaseEpoch: 1, ExpectedSeq: 6, RequestId: "end", Events: []*warrenv1.EventInput{stateEvent("running"), stateEvent("succeeded")}, Time: timestamppb.New(t0)}
	if r := tf.ok(end)[0]; seqs(r) != "6..7" {
		t.Fatalf("ending append: %s, want 6..7", seqs(r))
	}
	if r := tf.ok(end)[0]; seqs(r) != "6..7" {
		t.Fatalf("retry of the ending append: %s, want 6..7", seqs(r))
	}
	// Not a retry, and the task ended: the writer hears that it ended, not
	// that the seq moved; likewise a writer whose lease is gone.
	for _, exp := range []uint64{8, 6} {
		end.RequestId, end.ExpectedSeq = "after-end", exp
		if r := tf.apply(end)[0]; connect.Code(r.GetCode()) != connect.CodeFailedPrecondition || !strings.Contains(r.GetMessage(), "is succeeded") {
			t.Fatalf("append at %d to an ended task: %v %q", exp, connect.Code(r.GetCode()), r.GetMessage())
		}
	}
	live := tf.create("").GetId()
	tf.ok(&fsmv1.GrantLease{TaskId: live, Node: "n1", Time: timestamppb.New(t0)}) // epoch 1, next seq 3
	stale := &fsmv1.AppendEvents{TaskId: live, LeaseEpoch: 0, ExpectedSeq: 2, RequestId: "old-owner", Events: []*warrenv1.EventInput{logEvent("x")}, Time: timestamppb.New(t0)}
	if r := tf.apply(stale)[0]; connect.Code(r.GetCode()) != connect.CodeFailedPrecondition || !strings.Contains(r.GetMessage(), ErrStaleEpoch.Error()) {
		t.Fatalf("stale owner at an old seq: %v %q", connect.Code(r.GetCode()), r.GetMessage())
	}
}

func TestPositionedAppendStampsTheEventsItCauses(t *testing.T) {
	tf := newTestFSM(t)
	id := tf.create("").GetId()
	tf.ok(&fsmv1.GrantLease{TaskId: id, Node: "n1", Time: timestamppb.New(t0)})
	tf.ok(&fsmv1.CancelTask{TaskId: id, Time: timestamppb.New(t0)})
	next := func() uint64 {
		got, _ := tf.fsm.Task(id)
		return got.GetNextSeq()
	}
	// Parking for approval while a cancel is pending makes the FSM add a
	// state_changed to cancelled: it belongs to the append, so its retry
	// returns it too.
	first := next()
	park := &fsmv1.AppendEvents{TaskId: id, LeaseEpoch: 1, ExpectedSeq: first, RequestId: "park", Time: timestamppb.New(t0), Events: []*warrenv1.EventInput{
		stateEvent("running"), stateEvent("waiting_approval"),
		{Kind: KindApprovalRequested, Payload: []byte(`{"tool_call_id":"c1"}`)},
		{Kind: KindParked, Payload: []byte(`{}`)},
	}}
	r := tf.ok(park)[0]
	if r.GetLastSeq() != next()-1 || r.GetLastSeq() != first+4 {
		t.Fatalf("parking append: %d..%d, next seq %d; want %d..%d", r.GetFirstSeq(), r.GetLastSeq(), next(), first, first+4)
	}
	if r2 := tf.ok(park)[0]; r2.GetFirstSeq() != first || r2.GetLastSeq() != r.GetLastSeq() {
		t.Fatalf("retry: %d..%d, want %d..%d", r2.GetFirstSeq(), r2.GetLastSeq(), first, r.GetLastSeq())
	}
	got, _ := tf.fsm.Task(id)
	if got.GetState() != warrenv1.TaskState_TASK_STATE_CANCELLED {
		t.Fatalf("state = %v, want cancelled", got.GetState())
	}
}

func TestAppendFencedByLeaseEpoch(t *testing.T) {
	tf := newTestFSM(t)
	task := tf.create("")
	lease := tf.ok(&fsmv1.GrantLease{TaskId: task.GetId(), Node: "n1", Time: timestamppb.New(t0)})[0].GetTask().GetLease()
	if lease.GetEpoch() != 1 || lease.GetNode() != "n1" {
		t.Fatalf("lease = %v", lease)
	}
	r := tf.apply(&fsmv1.AppendEvents{TaskId: task.GetId(), LeaseEpoch: 0, Events: []*warrenv1.EventInput{logEvent("late")}, Time: timestamppb.New(t0)})[0]
	if connect.Code(r.GetCode()) != connect.CodeFailedPrecondition || !strings.Contains(r.GetMessage(), ErrStaleEpoch.Error()) {
		t.Fatalf("stale append: %v %q", connect.Code(r.GetCode()), r.GetMessage())
	}
	tf.ok(&fsmv1.AppendEvents{TaskId: task.GetId(), LeaseEpoch: 1, Events: []*warrenv1.EventInput{stateEvent("running"), logEvent("ok")}, Time: timestamppb.New(t0)})
	if got := kindsOf(tf.events(task.GetId())); got != "1:task_created 2:state_changed 3:state_changed 4:log" {
		t.Fatalf("events = %s", got)
	}
	got, _ := tf.fsm.Task(task.GetId())
	if got.GetState() != warrenv1.TaskState_TASK_STATE_RUNNING {
		t.Fatalf("state = %v", got.GetState())
	}
}

func TestRefusedCommandLeavesNoTrace(t *testing.T) {
	tf := newTestFSM(t)
	task := tf.create("")
	// The second event is an illegal transition: the whole append is refused.
	r := tf.apply(&fsmv1.AppendEvents{TaskId: task.GetId(), Events: []*warrenv1.EventInput{logEvent("a"), stateEvent("succeeded")}, RequestId: "r", Time: timestamppb.New(t0)})[0]
	if connect.Code(r.GetCode()) != connect.CodeFailedPrecondition {
		t.Fatalf("code = %v %s", connect.Code(r.GetCode()), r.GetMessage())
	}
	if got := kindsOf(tf.events(task.GetId())); got != "1:task_created" {
		t.Fatalf("events = %s", got)
	}
	// A refusal is not recorded under the request id: a fixed retry works.
	tf.ok(&fsmv1.AppendEvents{TaskId: task.GetId(), Events: []*warrenv1.EventInput{logEvent("a")}, RequestId: "r", Time: timestamppb.New(t0)})
}

func TestBatchResultsAreIndependent(t *testing.T) {
	tf := newTestFSM(t)
	task := tf.create("")
	res := tf.apply(
		&fsmv1.SendMessage{TaskId: task.GetId(), Text: "one", Time: timestamppb.New(t0)},
		&fsmv1.SendMessage{TaskId: ulid.Make().String(), Text: "nobody", Time: timestamppb.New(t0)},
		&fsmv1.SendMessage{TaskId: task.GetId(), Text: "two", Time: timestamppb.New(t0)},
	)
	if res[0].GetFirstSeq() != 2 || connect.Code(res[1].GetCode()) != connect.CodeNotFound || res[2].GetFirstSeq() != 3 {
		t.Fatalf("results = %v", res)
	}
}

func TestApprovalFlow(t *testing.T) {
	tf := newTestFSM(t)
	task := tf.create("")
	r := tf.apply(&fsmv1.Decide{TaskId: task.GetId(), ToolCallId: "call-1", Approved: true, Time: timestamppb.New(t0)})[0]
	if connect.Code(r.GetCode()) != connect.CodeFailedPrecondition {
		t.Fatalf("approve with nothing pending: %v", connect.Code(r.GetCode()))
	}
	tf.ok(&fsmv1.AppendEvents{TaskId: task.GetId(), Events: []*warrenv1.EventInput{{Kind: KindApprovalRequested, Payload: []byte(`{"tool_call_id":"call-1","command":"rm -rf build"}`)}}, Time: timestamppb.New(t0)})
	got, _ := tf.fsm.Task(task.GetId())
	if len(got.GetPendingApprovals()) != 1 {
		t.Fatalf("pending = %v", got.GetPendingApprovals())
	}
	tf.ok(&fsmv1.Decide{TaskId: task.GetId(), ToolCallId: "call-1", Approved: false, Comment: "no", Time: timestamppb.New(t0)})
	got, _ = tf.fsm.Task(task.GetId())
	if len(got.GetPendingApprovals()) != 0 {
		t.Fatalf("pending after decision = %v", got.GetPendingApprovals())
	}
	evs := tf.events(task.GetId())
	if last := evs[len(evs)-1]; last.GetKind() != KindApprovalDecided || !bytes.Contains(last.GetPayload(), []byte(`"approved":false`)) {
		t.Fatalf("last event = %v %s", last.GetKind(), last.GetPayload())
	}
	// Deciding twice is refused.
	if r := tf.apply(&fsmv1.Decide{TaskId: task.GetId(), ToolCallId: "call-1", Approved: true, Time: timestamppb.New(t0)})[0]; r.GetCode() == 0 {
		t.Fatal("second decision accepted")
	}
}

func TestCancelPendingEndsTask(t *testing.T) {
	tf := newTestFSM(t)
	task := tf.create("")
	r := tf.ok(&fsmv1.CancelTask{TaskId: task.GetId(), Reason: "stop", Time: timestamppb.New(t0)})[0]
	if r.GetTask().GetState() != warrenv1.TaskState_TASK_STATE_CANCELLED {
		t.Fatalf("state = %v", r.GetTask().GetState())
	}
	if got := kindsOf(tf.events(task.GetId())); got != "1:task_created 2:cancel_requested 3:state_changed" {
		t.Fatalf("events = %s", got)
	}
	// Terminal: no more writes, but a second cancel is a no-op success.
	if r := tf.apply(&fsmv1.SendMessage{TaskId: task.GetId(), Text: "late", Time: timestamppb.New(t0)})[0]; connect.Code(r.GetCode()) != connect.CodeFailedPrecondition {
		t.Fatalf("message to a cancelled task: %v", connect.Code(r.GetCode()))
	}
	tf.ok(&fsmv1.CancelTask{TaskId: task.GetId(), Time: timestamppb.New(t0)})
	if got := kindsOf(tf.events(task.GetId())); got != "1:task_created 2:cancel_requested 3:state_changed" {
		t.Fatalf("events after second cancel = %s", got)
	}
}

func TestCancelRunningAsksTheNode(t *testing.T) {
	tf := newTestFSM(t)
	task := tf.create("")
	tf.ok(&fsmv1.GrantLease{TaskId: task.GetId(), Node: "n1", Time: timestamppb.New(t0)})
	r := tf.ok(&fsmv1.CancelTask{TaskId: task.GetId(), Time: timestamppb.New(t0)})[0]
	if r.GetTask().GetState() != warrenv1.TaskState_TASK_STATE_PLACED || !r.GetTask().GetCancelRequested() {
		t.Fatalf("task = %v", r.GetTask())
	}
	tf.ok(&fsmv1.AppendEvents{TaskId: task.GetId(), LeaseEpoch: 1, Events: []*warrenv1.EventInput{stateEvent("cancelled")}, Time: timestamppb.New(t0)})
}

func TestApplyIsIdempotentOnIndexAcrossRestart(t *testing.T) {
	tf := newTestFSM(t)
	task := tf.create("")
	tf.ok(&fsmv1.SendMessage{TaskId: task.GetId(), Text: "m", Time: timestamppb.New(t0)})
	applied := tf.fsm.Applied()
	tf.reopen()
	if tf.fsm.Applied() != applied {
		t.Fatalf("applied after reopen = %d, want %d", tf.fsm.Applied(), applied)
	}
	// Raft replays an old entry after a restart: it must be skipped.
	if res := tf.applyAt(applied, &fsmv1.SendMessage{TaskId: task.GetId(), Text: "m", Time: timestamppb.New(t0)}); res != nil {
		t.Fatalf("replayed entry applied: %v", res)
	}
	if got := kindsOf(tf.events(task.GetId())); got != "1:task_created 2:message" {
		t.Fatalf("events = %s", got)
	}
}

func TestRequestIDsSurviveRestart(t *testing.T) {
	tf := newTestFSM(t)
	task := tf.create("")
	tf.ok(&fsmv1.SendMessage{TaskId: task.GetId(), Text: "m", RequestId: "once", Time: timestamppb.New(t0)})
	tf.reopen()
	r := tf.ok(&fsmv1.SendMessage{TaskId: task.GetId(), Text: "m", RequestId: "once", Time: timestamppb.New(t0)})[0]
	if r.GetFirstSeq() != 2 {
		t.Fatalf("retry after restart got seq %d, want the recorded 2", r.GetFirstSeq())
	}
	if got := kindsOf(tf.events(task.GetId())); got != "1:task_created 2:message" {
		t.Fatalf("events = %s", got)
	}
}

func TestUnknownCommandFailsLoudly(t *testing.T) {
	tf := newTestFSM(t)
	defer func() {
		if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), "unknown command type") {
			t.Fatalf("recover() = %v, want an unknown-command panic", r)
		}
	}()
	tf.fsm.Apply(&raft.Log{Index: 1, Type: raft.LogCommand, Data: []byte{0x7e, 1, 2}})
}

func TestIgnorableUnknownCommandIsSkipped(t *testing.T) {
	tf := newTestFSM(t)
	inner := []byte{byte(FlagIgnorable | 0x7e), 1, 2, 3}
	out := tf.fsm.Apply(&raft.Log{Index: 1, Type: raft.LogCommand, Data: encodeBatch([][]byte{inner})}).([]*fsmv1.Result)
	if len(out) != 1 || out[0].GetCode() != 0 {
		t.Fatalf("results = %v", out)
	}
	if tf.fsm.Applied() != 1 {
		t.Fatalf("applied = %d", tf.fsm.Applied())
	}
}

func TestListTasksPagesAndFilters(t *testing.T) {
	tf := newTestFSM(t)
	var ids []string
	for i := 0; i < 7; i++ {
		ids = append(ids, tf.create("").GetId())
	}
	tf.ok(&fsmv1.CancelTask{TaskId: ids[2], Time: timestamppb.New(t0)}, &fsmv1.CancelTask{TaskId: ids[5], Time: timestamppb.New(t0)})
	if got, _ := listPages(t, tf.fsm, 3, 0); strings.Join(got, ",") != strings.Join(ids, ",") {
		t.Fatalf("listed %v, want %v", got, ids)
	}
	cancelled, next, err := tf.fsm.ListTasks(warrenv1.TaskState_TASK_STATE_CANCELLED, "", 10, 0)
	if err != nil || next != "" || len(cancelled) != 2 || cancelled[0].GetId() != ids[2] || cancelled[1].GetId() != ids[5] {
		t.Fatalf("cancelled = %v next=%q err=%v", cancelled, next, err)
	}
	pending, _, _ := tf.fsm.ListTasks(warrenv1.TaskState_TASK_STATE_PENDING, "", 10, 0)
	if len(pending) != 5 {
		t.Fatalf("pending = %d, want 5", len(pending))
	}
}

// listPages pages through every task, limit and maxBytes a page, and
// returns their ids and how many each page held.
func listPages(t *testing.T, f *FSM, limit, maxBytes int) (ids []string, pages []int) {
	t.Helper()
	after := ""
	for {
		tasks, next, err := f.ListTasks(warrenv1.TaskState_TASK_STATE_UNSPECIFIED, after, limit, maxBytes)
		if err != nil {
			t.Fatal(err)
		}
		pages = append(pages, len(tasks))
		for _, tk := range tasks {
			ids = append(ids, tk.GetId())
		}
		if next == "" {
			return ids, pages
		}
		after = next
		if len(pages) > 100 {
			t.Fatal("paging does not end")
		}
	}
}

// A page of large tasks ends at the byte budget, with a token that goes
// on from its last task, and always holds one task.
func TestListTasksPageBytes(t *testing.T) {
	tf := newTestFSM(t)
	var ids []string
	for range 9 {
		spec := testSpec()
		spec.IssueBody = strings.Repeat("b", 100<<10)
		ids = append(ids, tf.ok(&fsmv1.CreateTask{Id: ulid.Make().String(), Tenant: "default", Spec: spec, Time: timestamppb.New(t0)})[0].GetTask().GetId())
	}
	got, pages := listPages(t, tf.fsm, 1000, 250<<10)
	if fmt.Sprint(pages) != "[2 2 2 2 1]" {
		t.Fatalf("pages of %v tasks of ~100 KiB under a 250 KiB budget, want [2 2 2 2 1]", pages)
	}
	if strings.Join(got, ",") != strings.Join(ids, ",") {
		t.Fatalf("listed %v, want %v", got, ids)
	}
	if tasks, _, _ := tf.fsm.ListTasks(warrenv1.TaskState_TASK_STATE_UNSPECIFIED, "", 1000, 1); len(tasks) != 1 {
		t.Fatalf("a budget below one task gave %d tasks, want 1", len(tasks))
	}
}

// snapshotBytes persists a snapshot of f into memory.
func snapshotBytes(t *testing.T, f *FSM) []byte {
	t.Helper()
	snap, err := f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	defer snap.Release()
	sink := &memSink{}
	if err := snap.Persist(sink); err != nil {
		t.Fatal(err)
	}
	return sink.Bytes()
}

type memSink struct{ bytes.Buffer }

func (*memSink) ID() string    { return "mem" }
func (*memSink) Cancel() error { return nil }
func (*memSink) Close() error  { return nil }

func TestSnapshotRestoresIntoFreshFSM(t *testing.T) {
	src := newTestFSM(t)
	var ids []string
	for i := 0; i < 20; i++ {
		id := src.create(fmt.Sprintf("r%d", i)).GetId()
		ids = append(ids, id)
		src.ok(&fsmv1.SendMessage{TaskId: id, Text: strings.Repeat("x", i*100), Time: timestamppb.New(t0)})
	}
	src.ok(&fsmv1.CancelTask{TaskId: ids[3], Time: timestamppb.New(t0)})
	data := snapshotBytes(t, src.fsm)

	dst := newTestFSM(t)
	stale := dst.create("will be replaced")
	if err := dst.fsm.Restore(io.NopCloser(bytes.NewReader(data))); err != nil {
		t.Fatal(err)
	}
	if dst.fsm.Applied() != src.fsm.Applied() {
		t.Fatalf("applied = %d, want %d", dst.fsm.Applied(), src.fsm.Applied())
	}
	if _, err := dst.fsm.Task(stale.GetId()); err == nil {
		t.Fatal("state from before the restore survived it")
	}
	// Nor does the applier's cache of live tasks keep it.
	dst.index = src.fsm.Applied()
	if r := dst.apply(&fsmv1.AppendEvents{TaskId: stale.GetId(), Events: []*warrenv1.EventInput{logEvent("late")},
		Time: timestamppb.New(t0)})[0]; connect.Code(r.GetCode()) != connect.CodeNotFound {
		t.Fatalf("append to a task the restore removed: code %d %q, want not found", r.GetCode(), r.GetMessage())
	}
	for _, id := range ids {
		a, _ := src.fsm.Task(id)
		b, err := dst.fsm.Task(id)
		if err != nil || !proto.Equal(a, b) {
			t.Fatalf("task %s differs after restore: %v", id, err)
		}
		if kindsOf(src.events(id)) != kindsOf(dst.events(id)) {
			t.Fatalf("events of %s differ", id)
		}
	}
	// The idempotency records came along: a retried create finds its task.
	r := dst.ok(&fsmv1.CreateTask{Id: ulid.Make().String(), Tenant: "default", RequestId: "r7", Spec: testSpec(), Time: timestamppb.New(t0)})[0]
	if r.GetCreated() || r.GetTask().GetId() != ids[7] {
		t.Fatalf("retried create after restore: created=%v id=%s", r.GetCreated(), r.GetTask().GetId())
	}
	// The state survives a reopen.
	dst.reopen()
	if _, err := dst.fsm.Task(ids[19]); err != nil {
		t.Fatal(err)
	}
}

func TestRestoreSkipsOlderSnapshot(t *testing.T) {
	tf := newTestFSM(t)
	a := tf.create("")
	old := snapshotBytes(t, tf.fsm)
	b := tf.create("")
	if err := tf.fsm.Restore(io.NopCloser(bytes.NewReader(old))); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{a.GetId(), b.GetId()} {
		if _, err := tf.fsm.Task(id); err != nil {
			t.Fatalf("task %s lost to an older snapshot: %v", id, err)
		}
	}
}

// A snapshot's archive starts with its applied index, and a restore at
// or below the local one stops there, without unpacking the rest (raft
// restores the newest snapshot at every start).
func TestRestoreSkipsAnOlderSnapshotWithoutUnpackingIt(t *testing.T) {
	tf := newTestFSM(t)
	tf.create("")
	data := snapshotBytes(t, tf.fsm)
	tr := tar.NewReader(bytes.NewReader(data))
	if h, err := tr.Next(); err != nil || h.Name != appliedEntry {
		t.Fatalf("the archive's first entry: %v %v", h, err)
	}
	// Its index entry, then anything but a checkpoint.
	head := append(data[:1024:1024], []byte(strings.Repeat("not a tar entry ", 64))...)
	if err := tf.fsm.Restore(io.NopCloser(bytes.NewReader(head))); err != nil {
		t.Fatalf("a snapshot at the local index was not skipped: %v", err)
	}
	if err := newTestFSM(t).fsm.Restore(io.NopCloser(bytes.NewReader(head))); err == nil {
		t.Fatal("a fresh FSM restored a broken archive")
	}
}

func TestRestoreRejectsMalformedArchive(t *testing.T) {
	tf := newTestFSM(t)
	if err := tf.fsm.Restore(io.NopCloser(strings.NewReader("not a tar archive at all"))); err == nil {
		t.Fatal("restore of garbage succeeded")
	}
}

// The FSM itself refuses a create whose id is not a canonical ULID, so no
// command in the log can put one task's events among another's keys (the
// id of one task plus 8 bytes did, and a command on that task after a
// restart panicked the FSM).
func TestCreateRefusesNonCanonicalIDs(t *testing.T) {
	tf := newTestFSM(t)
	victim := tf.create("victim")
	tf.ok(&fsmv1.SendMessage{TaskId: victim.GetId(), Text: "hi", RequestId: "m1", Time: timestamppb.New(t0)})
	for _, id := range []string{"", victim.GetId() + "\x00\x00\x00\x00\x00\x00\x00\x07", strings.ToLower(ulid.Make().String()), "x"} {
		res := tf.apply(&fsmv1.CreateTask{Id: id, Tenant: "default", RequestId: "r-" + id, Spec: testSpec(), Time: timestamppb.New(t0)})
		if connect.Code(res[0].GetCode()) != connect.CodeInvalidArgument {
			t.Fatalf("create with id %q: %v, want invalid_argument", id, res[0])
		}
	}
	tf.reopen()
	tf.ok(&fsmv1.SendMessage{TaskId: victim.GetId(), Text: "again", RequestId: "m2", Time: timestamppb.New(t0)})
	if _, err := tf.fsm.Task(victim.GetId()); err != nil {
		t.Fatal(err)
	}
}

// A snapshot stream cut short at any archive entry's end (no trailer) is
// refused, and the local state is left as it was (Pebble's marker files
// come last, so a cut checkpoint does not open), or, cut after the last
// entry, restored whole.
func TestRestoreOfACutStreamKeepsTheState(t *testing.T) {
	src := newTestFSM(t)
	var ids []string
	for i := 0; i < 30; i++ {
		id := src.create(fmt.Sprintf("r%d", i)).GetId()
		src.ok(&fsmv1.SendMessage{TaskId: id, Text: "hello", Time: timestamppb.New(t0)})
		ids = append(ids, id)
	}
	data := snapshotBytes(t, src.fsm)
	r := bytes.NewReader(data)
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.Copy(io.Discard, tr); err != nil {
			t.Fatal(err)
		}
		cut := data[:len(data)-r.Len()] // up to the end of h's data
		dst := newTestFSM(t)
		mine := dst.create("mine").GetId()
		rerr := dst.fsm.Restore(io.NopCloser(bytes.NewReader(cut)))
		if rerr == nil {
			for _, id := range ids {
				if _, err := dst.fsm.Task(id); err != nil {
					t.Fatalf("restore of a stream cut after %s: no error, but task %s is missing: %v", h.Name, id, err)
				}
			}
		} else if _, err := dst.fsm.Task(mine); err != nil {
			t.Fatalf("restore of a stream cut after %s refused (%v), but the local task is gone: %v", h.Name, rerr, err)
		}
	}
}

// What a crash leaves in the FSM's tmp directory (a checkpoint whose
// snapshot was never released, a restore's copy) is removed when the FSM
// opens again: a checkpoint's hard links would keep sstables on the disk
// for good.
func TestCrashLeftoversInTmpAreRemoved(t *testing.T) {
	tf := newTestFSM(t)
	tf.create("a")
	if _, err := tf.fsm.Snapshot(); err != nil { // never released: the crash
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(tf.dir, "tmp", "restore-1", "db"), 0o700); err != nil {
		t.Fatal(err)
	}
	tf.reopen()
	if left, _ := os.ReadDir(filepath.Join(tf.dir, "tmp")); len(left) > 0 {
		t.Fatalf("after reopen, %d entries left in tmp (%s ...)", len(left), left[0].Name())
	}
	snap, err := tf.fsm.Snapshot()
	if err != nil {
		t.Fatalf("snapshot after the clean-up: %v", err)
	}
	snap.Release()
}

// A live task's cached record is the batch's working copy, so a command
// that changed it without putting it would leave the cache ahead of Pebble.
// The invariants build catches that at the end of the batch.
func TestInvariantsCatchACachedTaskChangedWithoutPut(t *testing.T) {
	if !invariants {
		t.Skip("needs -tags invariants")
	}
	tf := newTestFSM(t)
	task := tf.create("c1")
	tf.ok(&fsmv1.SendMessage{TaskId: task.GetId(), Text: "hi", RequestId: "m1", Time: timestamppb.New(t0)}) // now cached
	b := tf.db.NewIndexedBatch()
	defer b.Close()
	a := &applier{b: b, idem: tf.fsm.idem, live: tf.fsm.live, lastReq: tf.fsm.lastReq, touched: map[string]struct{}{}, tasks: map[string]*cachedTask{}, nodes: map[string]*cachedNode{}}
	w, r := a.task(task.GetId())
	if r != nil {
		t.Fatal(r.GetMessage())
	}
	if w != tf.fsm.live[task.GetId()] {
		t.Fatal("the working copy is not the cached record")
	}
	w.UpdatedAt = nil // a bug: changed, not put
	defer func() {
		if p := recover(); p == nil || !strings.Contains(fmt.Sprint(p), "did not put it") {
			t.Fatalf("flushTasks after an unput change: %v, want the invariant's panic", p)
		}
	}()
	a.flushTasks()
}

// Plain appends do not rewrite the task's record (bumpTask): every read of
// it must still see the next seq and the update time its events give, and
// appends after a restart, or on a replica restored from a snapshot, must
// go on at that seq.
func TestPlainAppendsLeaveTheRecordButReadsCatchUp(t *testing.T) {
	tf := newTestFSM(t)
	task := tf.create("")
	id := task.GetId()
	stored := func() *warrenv1.Task {
		t.Helper()
		var rec warrenv1.Task
		if err := tf.fsm.getProto(keyTask(id), &rec); err != nil {
			t.Fatal(err)
		}
		return &rec
	}
	for i := 1; i <= 3; i++ {
		tf.ok(&fsmv1.AppendEvents{TaskId: id, Events: []*warrenv1.EventInput{logEvent("a"), logEvent("b")}, Time: timestamppb.New(t0.Add(time.Duration(i) * time.Second))})
	}
	tf.ok(&fsmv1.SendMessage{TaskId: id, Text: "steer", Time: timestamppb.New(t0.Add(4 * time.Second))})
	if rec := stored(); rec.GetNextSeq() != 2 {
		t.Fatalf("stored record's next_seq = %d: plain appends rewrote it (want the create's 2)", rec.GetNextSeq())
	}
	check := func(what string, wantNext uint64, wantUpdated time.Time) {
		t.Helper()
		got, err := tf.fsm.Task(id)
		if err != nil {
			t.Fatal(err)
		}
		if got.GetNextSeq() != wantNext || !got.GetUpdatedAt().AsTime().Equal(wantUpdated) {
			t.Fatalf("%s: next_seq %d updated_at %v, want %d %v", what, got.GetNextSeq(), got.GetUpdatedAt().AsTime(), wantNext, wantUpdated)
		}
		list, _, err := tf.fsm.ListTasks(warrenv1.TaskState_TASK_STATE_UNSPECIFIED, "", 10, 0)
		if err != nil || len(list) != 1 || !proto.Equal(list[0], got) {
			t.Fatalf("%s: ListTasks = %v, %v; want the task GetTask reads", what, list, err)
		}
	}
	check("after plain appends", 9, t0.Add(4*time.Second))

	// After a restart the FSM has no cached record: it reads the stored
	// one and catches up, and the next append lands at seq 9.
	tf.reopen()
	check("after a restart", 9, t0.Add(4*time.Second))
	r := tf.ok(&fsmv1.AppendEvents{TaskId: id, Events: []*warrenv1.EventInput{logEvent("c")}, Time: timestamppb.New(t0.Add(5 * time.Second))})[0]
	if r.GetFirstSeq() != 9 || r.GetLastSeq() != 9 {
		t.Fatalf("append after a restart got seqs %d..%d, want 9..9", r.GetFirstSeq(), r.GetLastSeq())
	}
	// The update time is the last event's, as it always was, even when that
	// is stamped earlier (a new leader whose clock is behind).
	tf.ok(&fsmv1.AppendEvents{TaskId: id, Events: []*warrenv1.EventInput{logEvent("d")}, Time: timestamppb.New(t0)})
	check("after an event stamped earlier", 11, t0)

	// A state change rewrites the record; appends after it leave it again.
	tf.ok(&fsmv1.AppendEvents{TaskId: id, Events: []*warrenv1.EventInput{stateEvent("cancelled")}, Time: timestamppb.New(t0.Add(6 * time.Second))})
	if rec := stored(); rec.GetNextSeq() != 12 || rec.GetState() != warrenv1.TaskState_TASK_STATE_CANCELLED {
		t.Fatalf("stored record after a state change: next_seq %d state %v, want 12 cancelled", rec.GetNextSeq(), rec.GetState())
	}
	check("after a state change", 12, t0.Add(6*time.Second))

	// A replica restored from a snapshot reads the same.
	other := newTestFSM(t)
	if err := other.fsm.Restore(io.NopCloser(bytes.NewReader(snapshotBytes(t, tf.fsm)))); err != nil {
		t.Fatal(err)
	}
	a, _ := tf.fsm.Task(id)
	b, err := other.fsm.Task(id)
	if err != nil || !proto.Equal(a, b) {
		t.Fatalf("restored replica reads %v (%v), want %v", b, err, a)
	}
	if kindsOf(other.events(id)) != kindsOf(tf.events(id)) {
		t.Fatal("restored replica's events differ")
	}
}

// A page of tasks filtered by state holds only tasks in that state, even
// while tasks change state as it is read: the index and the records are
// read from one snapshot (each record was read afresh, so a task cancelled
// meanwhile was listed as cancelled under the pending filter).
func TestListTasksByStateWhileTasksChange(t *testing.T) {
	tf := newTestFSM(t)
	var ids []string
	for i := 0; i < 300; i++ {
		ids = append(ids, tf.create(fmt.Sprintf("r%d", i)).GetId())
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for _, id := range ids {
			tf.apply(&fsmv1.CancelTask{TaskId: id, Time: timestamppb.New(t0)})
		}
	}()
	defer func() { <-done }() // the store stays open until the cancels end
	for running := true; running; {
		select {
		case <-done:
			running = false
		default:
		}
		tasks, _, err := tf.fsm.ListTasks(warrenv1.TaskState_TASK_STATE_PENDING, "", 1000, 0)
		if err != nil {
			t.Error(err)
			return
		}
		for _, task := range tasks {
			if task.GetState() != warrenv1.TaskState_TASK_STATE_PENDING {
				t.Errorf("task %s listed under pending is %v", task.GetId(), task.GetState())
				return
			}
		}
	}
}

// A cancel, a message and a decision are each answered once per request
// id, and the record kept for that (for good, on every replica) holds the
// task's id and next seq, not the task: a task with a spec of a megabyte
// cancelled again and again does not grow the store by a megabyte a time.
func TestIdempotencyRecordsHoldNoTask(t *testing.T) {
	tf := newTestFSM(t)
	spec := testSpec()
	spec.ModelScript = strings.Repeat("x", 1<<20)
	task := tf.ok(&fsmv1.CreateTask{Id: ulid.Make().String(), Tenant: "default", Spec: spec, Time: timestamppb.New(t0)})[0].GetTask()
	first := tf.ok(&fsmv1.CancelTask{TaskId: task.GetId(), RequestId: "c1", Time: timestamppb.New(t0)})[0]
	if first.GetTask().GetSpec().GetModelScript() != spec.ModelScript {
		t.Fatal("the first cancel's answer lacks the task")
	}
	for i := range 5 {
		tf.ok(&fsmv1.CancelTask{TaskId: task.GetId(), RequestId: fmt.Sprintf("again-%d", i), Time: timestamppb.New(t0)})
	}
	again := tf.ok(&fsmv1.CancelTask{TaskId: task.GetId(), RequestId: "c1", Time: timestamppb.New(t0)})[0]
	if again.GetTask().GetId() != task.GetId() || again.GetTask().GetNextSeq() != first.GetTask().GetNextSeq() {
		t.Errorf("the repeat's answer: %v, want the task's id and next seq %d", again.GetTask(), first.GetTask().GetNextSeq())
	}
	v, closer, err := tf.db.Get(keyIdem("cancel/"+task.GetId(), "c1"))
	if err != nil {
		t.Fatalf("the record of c1: %v", err)
	}
	if len(v) > 1024 {
		t.Errorf("the cancel's record takes %d bytes", len(v))
	}
	closer.Close()
	// The cancels of the task already cancelled changed nothing, and
	// leave no record (TestARepeatedCancelLeavesNoRecord).
	for i := range 5 {
		if _, _, err := tf.db.Get(keyIdem("cancel/"+task.GetId(), fmt.Sprintf("again-%d", i))); err == nil {
			t.Errorf("again-%d, a cancel that changed nothing, left a record", i)
		}
	}
}

// A call asked about twice (in one append or two) waits for one decision:
// a second entry in pending_approvals would have kept the task waiting for
// good after it.
func TestApprovalAskedTwiceNeedsOneDecision(t *testing.T) {
	tf := newTestFSM(t)
	task := tf.create("")
	ask := &warrenv1.EventInput{Kind: KindApprovalRequested, Payload: []byte(`{"tool_call_id":"call-1"}`)}
	tf.ok(&fsmv1.AppendEvents{TaskId: task.GetId(), Events: []*warrenv1.EventInput{ask, ask}, Time: timestamppb.New(t0)})
	tf.ok(&fsmv1.AppendEvents{TaskId: task.GetId(), Events: []*warrenv1.EventInput{ask}, Time: timestamppb.New(t0)})
	if got := tf.mustTask(task.GetId()).GetPendingApprovals(); len(got) != 1 {
		t.Fatalf("pending = %v, want [call-1]", got)
	}
	tf.ok(&fsmv1.Decide{TaskId: task.GetId(), ToolCallId: "call-1", Approved: true, Time: timestamppb.New(t0)})
	if got := tf.mustTask(task.GetId()).GetPendingApprovals(); len(got) != 0 {
		t.Fatalf("pending after the decision = %v", got)
	}
}
