package scheduler

import (
	"fmt"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"google.golang.org/protobuf/types/known/timestamppb"

	fsmv1 "github.com/warrenhq/warren/api/gen/warren/fsm/v1"
)

// idemKeys counts the idempotency records on the replica.
func (tf *testFSM) idemKeys() int {
	tf.t.Helper()
	it, err := tf.db.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixIdem}, UpperBound: []byte{prefixIdem + 1}})
	if err != nil {
		tf.t.Fatal(err)
	}
	defer it.Close()
	n := 0
	for it.First(); it.Valid(); it.Next() {
		n++
	}
	return n
}

// Cancelling a task already cancelled changes nothing, and leaves no
// idempotency record: each such request (the server names one that comes
// without an id) kept a key on every replica for good, so a loop of them
// grew every replica's store and memory without limit.
func TestARepeatedCancelLeavesNoRecord(t *testing.T) {
	tf := newTestFSM(t)
	id := tf.create("").GetId()
	before := tf.idemKeys()
	tf.ok(&fsmv1.CancelTask{TaskId: id, RequestId: "srv-first", Time: timestamppb.New(t0)})
	after := tf.idemKeys()
	if after != before+1 {
		t.Fatalf("the cancel that cancelled left %d records, want 1", after-before)
	}
	for i := range 200 {
		r := tf.ok(&fsmv1.CancelTask{TaskId: id, RequestId: fmt.Sprint("srv-", i), Time: timestamppb.New(t0)})[0]
		if r.GetTask().GetId() != id {
			t.Fatalf("repeat %d answered %v", i, r)
		}
	}
	if n := tf.idemKeys(); n != after {
		t.Fatalf("200 cancels of a cancelled task left %d more records, want 0", n-after)
	}
	// The first request's retry is still answered from its record.
	if r := tf.ok(&fsmv1.CancelTask{TaskId: id, RequestId: "srv-first", Time: timestamppb.New(t0)})[0]; r.GetFirstSeq() == 0 {
		t.Errorf("the first cancel's retry: %v, want its recorded events", r)
	}
}
