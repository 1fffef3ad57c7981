package actor

import (
	"context"
	"errors"
	"testing"
	"time"
)

// ticker is a behaviour that sets timers when it starts and counts ticks.
type ticker struct {
	after, every time.Duration
	ticks        *[]int // ticks seen, by incarnation number; owned by the actor
	incarnation  int
	everyTimer   Timer
}

func (tk *ticker) Started(c *Context) {
	if tk.after > 0 {
		c.After(tk.after, "tick")
	}
	if tk.every > 0 {
		tk.everyTimer = c.Every(tk.every, "tick")
	}
}

func (tk *ticker) Receive(c *Context, msg any) {
	switch msg {
	case "tick":
		*tk.ticks = append(*tk.ticks, tk.incarnation)
	case "count":
		c.Reply(len(*tk.ticks))
	case "ticks":
		c.Reply(append([]int(nil), *tk.ticks...))
	case "stop ticker":
		c.Reply(tk.everyTimer.Stop())
	case "crash":
		panic("crash")
	}
}

func newTicker(after, every time.Duration) func() Behavior {
	var ticks []int
	n := 0
	return func() Behavior {
		n++
		return &ticker{after: after, every: every, ticks: &ticks, incarnation: n}
	}
}

func count(t *testing.T, ctx context.Context, r *Ref) int {
	t.Helper()
	v, err := r.Request(ctx, "count")
	if err != nil {
		t.Fatalf("count: %v", err)
	}
	return v.(int)
}

func TestAfterFiresOnFakeClock(t *testing.T) {
	fc := NewFakeClock(fakeStart)
	s := newTestSystem(t, Config{Clock: fc})
	ctx := bounded(t)
	ref := mustSpawn(t, s, "once", newTicker(5*time.Second, 0))
	// Started runs before the first message, so the timer is armed once
	// count returns; each Advance queues the tick before count.
	for _, step := range []struct {
		advance time.Duration
		want    int
	}{{0, 0}, {4 * time.Second, 0}, {time.Second, 1}, {time.Hour, 1}} {
		fc.Advance(step.advance)
		if got := count(t, ctx, ref); got != step.want {
			t.Fatalf("after %v more: %d ticks, want %d", step.advance, got, step.want)
		}
	}
	if n := fc.Pending(); n != 0 {
		t.Fatalf("%d timers pending after a one-shot fired", n)
	}
}

func TestEveryFiresUntilStopped(t *testing.T) {
	fc := NewFakeClock(fakeStart)
	s := newTestSystem(t, Config{Clock: fc})
	ctx := bounded(t)
	ref := mustSpawn(t, s, "periodic", newTicker(0, 2*time.Second))
	if got := count(t, ctx, ref); got != 0 {
		t.Fatalf("%d ticks before time moved", got)
	}
	for i := 1; i <= 3; i++ {
		fc.Advance(2 * time.Second)
		if got := count(t, ctx, ref); got != i {
			t.Fatalf("tick %d: count %d", i, got)
		}
	}
	fc.Advance(7 * time.Second) // three more due at +2, +4, +6 within one Advance
	if got := count(t, ctx, ref); got != 6 {
		t.Fatalf("after 7s more: count %d, want 6", got)
	}
	if v, err := ref.Request(ctx, "stop ticker"); err != nil || v != true {
		t.Fatalf("stop ticker = %v, %v", v, err)
	}
	fc.Advance(time.Minute)
	if got := count(t, ctx, ref); got != 6 {
		t.Fatalf("ticks after Stop: count %d, want 6", got)
	}
}

// Timers belong to an incarnation: a restart or a stop drops them.
func TestTimersEndWithIncarnation(t *testing.T) {
	fc := NewFakeClock(fakeStart)
	s := newTestSystem(t, Config{Clock: fc})
	ctx := bounded(t)
	ref := mustSpawn(t, s, "forgetful", newTicker(time.Second, 3*time.Second),
		WithPolicy(RestartPolicy{MaxRestarts: 1}))
	if _, err := ref.Request(ctx, "crash"); err == nil {
		t.Fatal("crash did not fail")
	}
	count(t, ctx, ref) // incarnation 2 has started and armed its timers
	fc.Advance(3 * time.Second)
	v, err := ref.Request(ctx, "ticks")
	if err != nil {
		t.Fatal(err)
	}
	// Incarnation 1's After and Every fall due too, but are dropped.
	if got := v.([]int); len(got) != 2 || got[0] != 2 || got[1] != 2 {
		t.Fatalf("ticks by incarnation %v, want [2 2]", got)
	}
	ref.Stop()
	waitDone(t, ref)
	fc.Advance(time.Minute) // the Every of incarnation 2 fires into a stopped actor
	if n := fc.Pending(); n != 0 {
		t.Fatalf("%d timers still armed after the actor stopped", n)
	}
}

func TestWithTimeout(t *testing.T) {
	fc := NewFakeClock(fakeStart)
	ctx, cancel := WithTimeout(context.Background(), fc, time.Second)
	defer cancel()
	if _, ok := ctx.Deadline(); ok {
		t.Fatal("fake-clock context reports a wall-clock deadline")
	}
	fc.Advance(999 * time.Millisecond)
	if err := ctx.Err(); err != nil {
		t.Fatalf("done early: %v", err)
	}
	fc.Advance(time.Millisecond)
	<-ctx.Done()
	if err := ctx.Err(); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Err = %v, want DeadlineExceeded", err)
	}
	child, cancelChild := context.WithCancel(ctx)
	defer cancelChild()
	if err := child.Err(); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("child Err = %v, want DeadlineExceeded", err)
	}

	ctx2, cancel2 := WithTimeout(context.Background(), fc, time.Second)
	cancel2()
	if err := ctx2.Err(); !errors.Is(err, context.Canceled) || fc.Pending() != 0 {
		t.Fatalf("cancelled: Err = %v, %d timers pending", err, fc.Pending())
	}

	rctx, cancel3 := WithTimeout(context.Background(), RealClock(), time.Hour)
	defer cancel3()
	if _, ok := rctx.Deadline(); !ok {
		t.Fatal("real-clock context has no deadline")
	}
}
