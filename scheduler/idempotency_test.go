package scheduler

import (
	"strings"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	fsmv1 "github.com/warrenhq/warren/api/gen/warren/fsm/v1"
	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
)

func askApproval(tf *testFSM, task *warrenv1.Task, ids ...string) {
	tf.t.Helper()
	var evs []*warrenv1.EventInput
	for _, id := range ids {
		evs = append(evs, &warrenv1.EventInput{Kind: KindApprovalRequested, Payload: []byte(`{"tool_call_id":"` + id + `"}`)})
	}
	tf.ok(&fsmv1.AppendEvents{TaskId: task.GetId(), Events: evs, Time: timestamppb.New(t0)})
}

// A request id reused for a decision on another tool call is refused
// (already_exists), as CreateTask refuses one reused for another spec: it
// answered success with the first decision's seq, and call-2 stayed
// pending while its caller believed it decided.
func TestDecideRequestIDReusedForAnotherToolCall(t *testing.T) {
	tf := newTestFSM(t)
	task := tf.create("")
	askApproval(tf, task, "call-1", "call-2")
	first := tf.ok(&fsmv1.Decide{TaskId: task.GetId(), ToolCallId: "call-1", Approved: true, RequestId: "r1", Time: timestamppb.New(t0)})[0]
	r := tf.apply(&fsmv1.Decide{TaskId: task.GetId(), ToolCallId: "call-2", Approved: true, RequestId: "r1", Time: timestamppb.New(t0)})[0]
	if connect.Code(r.GetCode()) != connect.CodeAlreadyExists || !strings.Contains(r.GetMessage(), `request_id "r1"`) {
		t.Fatalf("decision on call-2 under request id r1: code %d %q (the call-1 decision's seq %d)", r.GetCode(), r.GetMessage(), first.GetFirstSeq())
	}
	// The same decision again is still the first one's answer.
	again := tf.ok(&fsmv1.Decide{TaskId: task.GetId(), ToolCallId: "call-1", Approved: true, RequestId: "r1", Time: timestamppb.New(t0)})[0]
	if again.GetFirstSeq() != first.GetFirstSeq() {
		t.Fatalf("a retried decision: seq %d, want %d", again.GetFirstSeq(), first.GetFirstSeq())
	}
}

// A Reject sent with the request id of an earlier Approve of the same
// call is refused: it answered success, telling its caller the rejection
// was recorded while the log said approved.
func TestRejectWithTheRequestIDOfAnApprove(t *testing.T) {
	tf := newTestFSM(t)
	task := tf.create("")
	askApproval(tf, task, "call-1")
	tf.ok(&fsmv1.Decide{TaskId: task.GetId(), ToolCallId: "call-1", Approved: true, RequestId: "r1", Time: timestamppb.New(t0)})
	r := tf.apply(&fsmv1.Decide{TaskId: task.GetId(), ToolCallId: "call-1", Approved: false, Comment: "no", RequestId: "r1", Time: timestamppb.New(t0)})[0]
	if r.GetCode() == 0 {
		t.Fatalf("reject under the request id of an approve answered success (seq %d); the log holds an approval", r.GetFirstSeq())
	}
	if c := connect.Code(r.GetCode()); c != connect.CodeAlreadyExists {
		t.Fatalf("code %v", c)
	}
}

// SendMessage: a request id reused with another text is refused (it
// answered success with the first message's seq, and the second text was
// never recorded).
func TestSendMessageRequestIDReusedWithAnotherText(t *testing.T) {
	tf := newTestFSM(t)
	task := tf.create("")
	tf.ok(&fsmv1.SendMessage{TaskId: task.GetId(), Text: "look at a.go", RequestId: "m1", Time: timestamppb.New(t0)})
	r := tf.apply(&fsmv1.SendMessage{TaskId: task.GetId(), Text: "stop, revert everything", RequestId: "m1", Time: timestamppb.New(t0)})[0]
	if connect.Code(r.GetCode()) != connect.CodeAlreadyExists {
		t.Fatalf("another text under a used request id: code %d %q (%s)", r.GetCode(), r.GetMessage(), kindsOf(tf.events(task.GetId())))
	}
}
