package noded

import (
	"context"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warrenhq/warren/actor"
	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
)

// A request to give a task back is the actor's shared state, not a message
// (which a full mailbox would refuse, and an actor restarted after a panic
// would not have): stopTask records it for the actor's next step, keeps
// the first reason, and ignores requests for an older lease.
func TestYieldRequestIsRecorded(t *testing.T) {
	ref := &taskRef{epoch: 2, yield: new(atomic.Pointer[yieldRequest])}
	d := &Daemon{actors: map[string]*taskRef{"t": ref}}
	stop := func(epoch uint64, reason string) {
		d.stopTask(&warrenv1.StopTask{TaskId: "t", Epoch: epoch, Reason: reason, Yield: true})
	}
	got := func() string {
		if p := ref.yield.Load(); p != nil {
			return p.why
		}
		return ""
	}
	stop(1, "an older lease")
	if g := got(); g != "" {
		t.Fatalf("a yield for an older epoch was recorded: %q", g)
	}
	stop(2, "node draining")
	stop(2, "something else")
	if g := got(); g != "node draining" {
		t.Fatalf("yield reason %q, want the first one", g)
	}
	if d.actors["t"] != ref {
		t.Fatal("a yield removed the task's actor")
	}

	other := &taskRef{epoch: 1, yield: new(atomic.Pointer[yieldRequest])}
	d.actors["u"] = other
	d.stopTask(&warrenv1.StopTask{TaskId: "u", Epoch: 1, Yield: true})
	if p := other.yield.Load(); p == nil || p.why != "asked to yield" {
		t.Fatalf("a yield without a reason recorded %v", p)
	}
}

// KeepTask withdraws a recorded request for the same lease only, and
// counts what it withdrew.
func TestKeepTaskWithdrawsYield(t *testing.T) {
	ref := &taskRef{epoch: 3, yield: new(atomic.Pointer[yieldRequest])}
	d := &Daemon{actors: map[string]*taskRef{"t": ref}, log: slog.New(slog.DiscardHandler)}
	d.stopTask(&warrenv1.StopTask{TaskId: "t", Epoch: 3, Reason: "node draining", Yield: true})
	d.keepTask(&warrenv1.KeepTask{TaskId: "t", Epoch: 2})
	if ref.yield.Load() == nil {
		t.Fatal("a KeepTask for an older lease withdrew the request")
	}
	d.keepTask(&warrenv1.KeepTask{TaskId: "gone", Epoch: 3})
	d.keepTask(&warrenv1.KeepTask{TaskId: "t", Epoch: 3})
	if p := ref.yield.Load(); p != nil {
		t.Fatalf("request %+v still recorded after KeepTask", *p)
	}
	d.keepTask(&warrenv1.KeepTask{TaskId: "t", Epoch: 3}) // nothing left to withdraw
	if st := d.stats; st.YieldAsked != 1 || st.YieldWithdrawn != 1 {
		t.Fatalf("stats %+v, want one request asked and one withdrawn", st)
	}
	// Asked again after the withdrawal (a second drain): recorded again.
	d.stopTask(&warrenv1.StopTask{TaskId: "t", Epoch: 3, Reason: "drained again", Yield: true})
	if p := ref.yield.Load(); p == nil || p.why != "drained again" {
		t.Fatalf("second request recorded as %v", p)
	}

	// Once the actor takes it, the request stays: its append may have
	// landed, so the task is on its way out under this epoch.
	a := &taskActor{yield: ref.yield}
	if y := a.takeYield(); y == nil || y.why != "drained again" {
		t.Fatalf("taken request %v", y)
	}
	d.keepTask(&warrenv1.KeepTask{TaskId: "t", Epoch: 3})
	if y := a.takeYield(); y == nil || !y.taken || y.why != "drained again" {
		t.Fatalf("after KeepTask the actor finds %v, want the taken request", y)
	}
	if d.stats.YieldWithdrawn != 1 {
		t.Fatalf("a taken request counted as withdrawn: %+v", d.stats)
	}
}

// A request that comes before the task's actor under its epoch (the
// leader saw the placement applied before its StartTask reached the node)
// is kept for that actor; one for an older lease is not handed to a newer
// one; KeepTask and the session's end withdraw kept requests too.
func TestEarlyYieldRequestIsKept(t *testing.T) {
	d := &Daemon{actors: map[string]*taskRef{}, log: slog.New(slog.DiscardHandler)}
	yield := func(id string, epoch uint64) {
		d.stopTask(&warrenv1.StopTask{TaskId: id, Epoch: epoch, Reason: "node draining", Yield: true})
	}
	yield("t", 2)
	yield("t", 2) // asked again: one request
	if y := d.takeEarly("t", 1); y != nil {
		t.Fatalf("an older lease's actor got %+v", *y)
	}
	if y := d.takeEarly("t", 2); y == nil || y.why != "node draining" || y.taken {
		t.Fatalf("the lease's actor got %v", y)
	}
	if y := d.takeEarly("t", 2); y != nil {
		t.Fatal("a request was handed out twice")
	}

	// An actor under an older epoch runs: the request waits for the new one.
	old := &taskRef{epoch: 1, yield: new(atomic.Pointer[yieldRequest])}
	d.actors["u"] = old
	yield("u", 2)
	if old.yield.Load() != nil {
		t.Fatal("the older lease's actor got the newer lease's request")
	}
	if y := d.takeEarly("u", 3); y != nil {
		t.Fatalf("a newer lease's actor got an older lease's request: %+v", *y)
	}

	yield("v", 1)
	d.keepTask(&warrenv1.KeepTask{TaskId: "v", Epoch: 1})
	if y := d.takeEarly("v", 1); y != nil {
		t.Fatal("KeepTask did not withdraw a request kept for its actor")
	}
	yield("w", 1)
	d.dropYields()
	if y := d.takeEarly("w", 1); y != nil {
		t.Fatal("the session's end did not drop a request kept for its actor")
	}
	if st := d.stats; st.YieldAsked != 4 || st.YieldWithdrawn != 2 {
		t.Fatalf("stats %+v, want 4 asked (t, u, v, w) and 2 withdrawn (v, w)", st)
	}
}

// startTask hands a request that came before its StartTask to the actor
// it spawns (the actor does nothing here: its context is done).
func TestStartTaskHandsEarlyRequestToItsActor(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // the actor does nothing: Receive returns on a done ctx
	sys := actor.NewSystem(actor.Config{})
	defer func() {
		sctx, c := context.WithTimeout(context.Background(), 5*time.Second)
		defer c()
		_ = sys.Shutdown(sctx)
	}()
	d := &Daemon{actors: map[string]*taskRef{}, log: slog.New(slog.DiscardHandler), sys: sys, ctx: ctx}
	d.stopTask(&warrenv1.StopTask{TaskId: "t", Epoch: 2, Reason: "node draining", Yield: true})
	d.startTask(&warrenv1.StartTask{TaskId: "t", Epoch: 2})
	ref := d.actors["t"]
	if ref == nil {
		t.Fatal("no actor spawned")
	}
	if y := ref.yield.Load(); y == nil || y.why != "node draining" || y.taken {
		t.Fatalf("the actor of epoch 2 got %v, want the early request", y)
	}
	if len(d.early) != 0 {
		t.Fatalf("early request not consumed: %v", d.early)
	}
}
