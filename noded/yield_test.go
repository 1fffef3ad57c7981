package noded

import (
	"log/slog"
	"sync/atomic"
	"testing"

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
