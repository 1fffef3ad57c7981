package scheduler

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	fsmv1 "github.com/warrenhq/warren/api/gen/warren/fsm/v1"
	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
)

// poolMessages returns the pool messages the leader sent f so far.
func (f *fakeNode) poolMessages() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.pools)
}

// A node's session carries the cluster's pool targets when it opens, and
// then each target recorded while it is open: `warren pool set` records a
// target after its direct calls to the nodes, so a node whose session
// opened in between got the older target from the session, after the
// direct call's newer one, and kept it until its next session. Only the
// changed targets are sent again, never the complete set (which would
// zero the node's own `--node` targets).
func TestSessionsGetPoolTargetsRecordedWhileOpen(t *testing.T) {
	n, url, hc := leadingServer(t, 10*time.Second)
	ctx := context.Background()
	if _, err := (taskAPI{n.srv}).write(ctx, &fsmv1.SetPool{Template: "py", Target: 2}); err != nil {
		t.Fatal(err)
	}
	f := openFakeNode(t, url, hc, "n1")
	waitFor(t, "the session's targets", 5*time.Second, func() bool { return len(f.poolMessages()) == 2 })
	for _, w := range []struct {
		pool *fsmv1.SetPool
		want []string
	}{
		{&fsmv1.SetPool{Template: "py", Target: 3}, []string{"py=2", "set:py=2", "py=3 resend"}},
		{&fsmv1.SetPool{Template: "go", Target: 1}, []string{"py=2", "set:py=2", "py=3 resend", "go=1 resend"}},
		{&fsmv1.SetPool{Template: "go", Target: 0}, nil},                                                                       // removed: nothing to send
		{&fsmv1.SetPool{Template: "go", Target: 4}, []string{"py=2", "set:py=2", "py=3 resend", "go=1 resend", "go=4 resend"}}, // again
	} {
		if _, err := (taskAPI{n.srv}).write(ctx, w.pool); err != nil {
			t.Fatal(err)
		}
		if w.want == nil {
			continue
		}
		waitFor(t, fmt.Sprintf("the session to carry %v", w.want), 5*time.Second, func() bool {
			return slices.Equal(f.poolMessages(), w.want)
		})
	}
	time.Sleep(200 * time.Millisecond) // nothing more comes
	if got := f.poolMessages(); len(got) != 5 {
		t.Errorf("pool messages %v: want only the 5 above", got)
	}
}

// A node down applied late (its proposal gave up on a slow commit, and the
// node's heartbeats came back meanwhile, so no round proposed it again)
// cuts the node's session at the next liveness round: the node says hello
// again and is ready, instead of heartbeating on, DOWN, with no tasks, for
// good.
func TestALateDownCutsTheNodesSession(t *testing.T) {
	n, url, hc := leadingServer(t, 10*time.Second)
	f := openFakeNode(t, url, hc, "n1")
	f.report(t, nil) // attached and heard
	res, _, err := n.srv.proposeLocal(context.Background(), &fsmv1.NodeOp{Id: "n1", Op: fsmv1.NodeOp_OP_DOWN, Reason: "late", Time: timestamppb.Now()})
	if err != nil || resultErr(res) != nil {
		t.Fatal(err, res)
	}
	waitFor(t, "the down node's session to be cut", 10*time.Second, func() bool { return n.srv.sess.get("n1") == nil })
}

// A node that runs more actors than a session's queue holds gets every
// stop of its reconcile, and keeps its session: the reconcile used to go
// through the queue, so such a node's own hello cut its session, again at
// every reconnect.
func TestAReconcileLargerThanTheQueueKeepsTheSession(t *testing.T) {
	old := sessionQueue
	sessionQueue = 4
	t.Cleanup(func() { sessionQueue = old })
	n, url, hc := leadingServer(t, 10*time.Second)
	var running []*warrenv1.RunningTask
	for i := range 20 {
		running = append(running, &warrenv1.RunningTask{TaskId: fmt.Sprintf("gone-%02d", i), Epoch: 1})
	}
	f := openFakeNodeFrom(t, url, hc, fakeHello{id: "n1", tasks: 8, beating: true, running: running})
	f.report(t, nil) // attached and heard
	waitFor(t, "20 stops", 5*time.Second, func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		return len(f.stops) == 20
	})
	if n.srv.sess.get("n1") == nil {
		t.Fatal("the session was cut by its reconcile")
	}
}

// A drain of a node holding more tasks than a session's queue holds asks
// it to give every one back, on the same session: the requests went
// through the queue all at once, so such a drain cut the node's session,
// and again at every round after its reconnect (found by helper-124's
// review). They go a part per liveness round now, leaving the queue room.
func TestADrainLargerThanTheQueueKeepsTheSession(t *testing.T) {
	old := sessionQueue
	sessionQueue = 4
	t.Cleanup(func() { sessionQueue = old })
	n, url, hc := leadingServer(t, 10*time.Second)
	f := openSizedFakeNode(t, url, hc, "n1", 12, "py")
	f.report(t, nil)    // attached and heard
	for i := range 12 { // one at a time: each placement's start goes through the queue too
		if node, _ := placedOn(t, n, createTask(t, n, fmt.Sprintf("t%02d", i), "py")); node != "n1" {
			t.Fatalf("task %d placed on %q", i, node)
		}
	}
	sess := n.srv.sess.get("n1")
	res, _, err := n.srv.proposeLocal(context.Background(), &fsmv1.NodeOp{Id: "n1", Op: fsmv1.NodeOp_OP_DRAIN, Reason: "operator",
		DrainDeadline: timestamppb.New(time.Now().Add(time.Hour)), Time: timestamppb.Now()})
	if err != nil || resultErr(res) != nil {
		t.Fatal(err, res)
	}
	waitFor(t, "12 requests to give a task back", 10*time.Second, func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		return len(f.stops) == 12
	})
	if got := n.srv.sess.get("n1"); got != sess {
		t.Fatal("the drain cut the node's session")
	}
}
