package scheduler

import (
	"bytes"
	"fmt"
	"io"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	fsmv1 "github.com/warrenhq/warren/api/gen/warren/fsm/v1"
	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
)

func plainAppend(id, req string, evs ...*warrenv1.EventInput) *fsmv1.AppendEvents {
	return &fsmv1.AppendEvents{TaskId: id, RequestId: req, Events: evs, Time: timestamppb.New(t0)}
}

func (tf *testFSM) wantSeqs(m *fsmv1.AppendEvents, want string) {
	tf.t.Helper()
	if r := tf.ok(m)[0]; seqs(r) != want {
		tf.t.Fatalf("append %q to %s: %s, want %s", m.GetRequestId(), m.GetTaskId(), seqs(r), want)
	}
}

func TestPlainAppendIsExactlyOnceWithoutARecord(t *testing.T) {
	tf := newTestFSM(t)
	id := tf.create("").GetId()
	tf.wantSeqs(plainAppend(id, "a", logEvent("1"), logEvent("2")), "2..3")
	tf.wantSeqs(plainAppend(id, "b", logEvent("3")), "4..4")
	tf.ok(&fsmv1.SendMessage{TaskId: id, Text: "hi", Time: timestamppb.New(t0)}) // 5
	tf.wantSeqs(plainAppend(id, "c", logEvent("4")), "6..6")
	// Retries, the oldest behind other events, get their first seqs back.
	tf.wantSeqs(plainAppend(id, "a", logEvent("1"), logEvent("2")), "2..3")
	tf.wantSeqs(plainAppend(id, "b", logEvent("3")), "4..4")
	// The same request id on another task is another request.
	other := tf.create("").GetId()
	tf.wantSeqs(plainAppend(other, "a", logEvent("x")), "2..2")

	for _, e := range tf.events(id) {
		want := map[uint64]string{2: "a", 3: "a", 4: "b", 6: "c"}[e.GetSeq()]
		if e.GetRequestId() != want {
			t.Fatalf("event %d carries request id %q, want %q", e.GetSeq(), e.GetRequestId(), want)
		}
	}
	for _, req := range []string{"a", "b", "c"} {
		if _, closer, err := tf.db.Get(keyIdem("append/"+id, req)); err == nil {
			closer.Close()
			t.Fatalf("append %s left an idempotency record", req)
		}
	}

	// After a restart the FSM remembers nothing; the events answer.
	tf.reopen()
	tf.wantSeqs(plainAppend(id, "b", logEvent("3")), "4..4")
	tf.wantSeqs(plainAppend(id, "d", logEvent("5")), "7..7")
	tf.wantSeqs(plainAppend(id, "d", logEvent("5")), "7..7")
	// Two retries of one request in one batch, and a new one between.
	res := tf.ok(plainAppend(id, "e", logEvent("6")), plainAppend(id, "f", logEvent("7")), plainAppend(id, "e", logEvent("6")))
	if got := seqs(res[0]) + " " + seqs(res[1]) + " " + seqs(res[2]); got != "8..8 9..9 8..8" {
		t.Fatalf("one batch: %s", got)
	}
	// A refused append is not remembered: its retry is applied.
	bad := plainAppend(id, "g", &warrenv1.EventInput{Kind: KindTaskCreated})
	if r := tf.apply(bad)[0]; r.GetCode() == 0 {
		t.Fatal("a server kind was appended")
	}
	tf.wantSeqs(plainAppend(id, "g", logEvent("8")), "10..10")
	if got := len(tf.events(id)); got != 10 {
		t.Fatalf("%d events, want 10", got)
	}
}

func TestPlainAppendRetryAfterTheTaskEnded(t *testing.T) {
	tf := newTestFSM(t)
	id := tf.create("").GetId()
	tf.ok(&fsmv1.GrantLease{TaskId: id, Node: "n1", Time: timestamppb.New(t0)}) // 2: placed, epoch 1
	end := plainAppend(id, "end", stateEvent("running"), stateEvent("succeeded"))
	end.LeaseEpoch = 1
	tf.wantSeqs(end, "3..4")
	for i := 0; i < 2; i++ {
		tf.wantSeqs(end, "3..4")
		// Not a retry: the writer hears that the task ended.
		late := plainAppend(id, "late", logEvent("x"))
		late.LeaseEpoch = 1
		if r := tf.apply(late)[0]; connect.Code(r.GetCode()) != connect.CodeFailedPrecondition || !strings.Contains(r.GetMessage(), "is succeeded") {
			t.Fatalf("append to an ended task: %v %q", connect.Code(r.GetCode()), r.GetMessage())
		}
		tf.reopen() // and again from the events alone
	}
}

// Appends applied before events carried request ids left a record, which
// is still honoured.
func TestPlainAppendHonoursAnOldRecord(t *testing.T) {
	tf := newTestFSM(t)
	id := tf.create("").GetId()
	tf.wantSeqs(&fsmv1.AppendEvents{TaskId: id, Events: []*warrenv1.EventInput{logEvent("1")}, Time: timestamppb.New(t0)}, "2..2")
	v, err := proto.Marshal(&fsmv1.Result{FirstSeq: 2, LastSeq: 2})
	if err != nil {
		t.Fatal(err)
	}
	if err := tf.db.Set(keyIdem("append/"+id, "old"), v, nil); err != nil {
		t.Fatal(err)
	}
	tf.reopen()
	tf.wantSeqs(plainAppend(id, "old", logEvent("1")), "2..2")
	if got := len(tf.events(id)); got != 2 {
		t.Fatalf("%d events, want 2", got)
	}
}

// The FSM keeps the request ids of at most maxEndedReqSets ended tasks.
func TestEndedTasksRequestIDsAreBounded(t *testing.T) {
	tf := newTestFSM(t)
	live := tf.create("").GetId()
	tf.ok(plainAppend(live, "l", logEvent("x")))
	var ended []string
	for i := 0; i < maxEndedReqSets+6; i++ {
		id := tf.create("").GetId()
		tf.ok(plainAppend(id, "r", logEvent("x")))
		tf.ok(&fsmv1.CancelTask{TaskId: id, Time: timestamppb.New(t0)})
		ended = append(ended, id)
	}
	if n := len(tf.fsm.reqs.tasks); n != maxEndedReqSets+1 {
		t.Fatalf("%d tasks' request ids kept, want %d", n, maxEndedReqSets+1)
	}
	if _, ok := tf.fsm.reqs.tasks[live]; !ok {
		t.Fatal("the live task's request ids were dropped")
	}
	// A dropped set is read again from the events when needed.
	r := tf.apply(plainAppend(ended[0], "r", logEvent("x")))[0]
	if seqs(r) != "2..2" {
		t.Fatalf("retry on an ended task whose ids were dropped: %s (%q)", seqs(r), r.GetMessage())
	}
}

// A snapshot that replaces the state also replaces what the FSM remembers
// of it: a request the snapshot's history holds is recognised.
func TestRestoreResetsRequestIDs(t *testing.T) {
	src := newTestFSM(t)
	id := src.create("").GetId()
	early := snapshotBytes(t, src.fsm)
	src.wantSeqs(plainAppend(id, "b", logEvent("b")), "2..2")
	src.ok(&fsmv1.SendMessage{TaskId: id, Text: "later", Time: timestamppb.New(t0)})
	late := snapshotBytes(t, src.fsm)

	dst := newTestFSM(t)
	if err := dst.fsm.Restore(io.NopCloser(bytes.NewReader(early))); err != nil {
		t.Fatal(err)
	}
	dst.index = dst.fsm.Applied()
	dst.wantSeqs(plainAppend(id, "a", logEvent("a")), "2..2") // loads the task's ids: "a"
	if dst.fsm.Applied() >= src.fsm.Applied() {
		t.Fatalf("test setup: dst at %d, src at %d", dst.fsm.Applied(), src.fsm.Applied())
	}
	if err := dst.fsm.Restore(io.NopCloser(bytes.NewReader(late))); err != nil {
		t.Fatal(err)
	}
	dst.index = dst.fsm.Applied()
	dst.wantSeqs(plainAppend(id, "b", logEvent("b")), "2..2")
	if got := kindsOf(dst.events(id)); got != "1:task_created 2:log 3:message" {
		t.Fatalf("events = %s", got)
	}
}

func BenchmarkFindAppend(b *testing.B) {
	for _, n := range []int{100, 10000} {
		b.Run(fmt.Sprintf("events=%d", n), func(b *testing.B) {
			tf := newTestFSM(b)
			id := tf.create("").GetId()
			for i := 0; i < n; i += 100 {
				var ms []proto.Message
				for j := 0; j < 100; j++ {
					ms = append(ms, plainAppend(id, fmt.Sprintf("r%d", i+j), logEvent("x")))
				}
				tf.ok(ms...)
			}
			tf.reopen()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				// After a restart: the first append builds the task's set.
				tf.fsm.reqs.reset()
				tf.ok(plainAppend(id, fmt.Sprintf("new%d", i), logEvent("x")))
			}
		})
	}
}

func seqs(r *fsmv1.Result) string { return fmt.Sprintf("%d..%d", r.GetFirstSeq(), r.GetLastSeq()) }
