package actor

import (
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"pgregory.net/rapid"
)

type seqMsg struct{ sender, i int }

type getLog struct{}

// Messages from one sender arrive in the order sent, whatever mix of Send,
// SendContext and Request it uses and whatever other senders do.
func TestPropOrderPerSender(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		s := newTestSystem(rt, Config{})
		ctx := bounded(rt)
		capacity := rapid.IntRange(1, 8).Draw(rt, "capacity")
		ops := rapid.SliceOfN(rapid.IntRange(0, 2), 0, 60).Draw(rt, "ops")
		others := rapid.IntRange(0, 3).Draw(rt, "others")
		perOther := rapid.IntRange(0, 40).Draw(rt, "perOther")

		var got []seqMsg // owned by the actor
		ref := mustSpawn(rt, s, "orderly", func() Behavior {
			return BehaviorFunc(func(c *Context, msg any) {
				switch m := msg.(type) {
				case seqMsg:
					got = append(got, m)
					c.Reply(nil)
				case getLog:
					c.Reply(slices.Clone(got))
				}
			})
		}, WithMailbox(capacity))

		var wg sync.WaitGroup
		errs := make(chan error, others)
		for o := 1; o <= others; o++ {
			wg.Go(func() {
				for i := range perOther {
					if err := ref.SendContext(ctx, seqMsg{o, i}); err != nil {
						errs <- err
						return
					}
				}
			})
		}
		var want []int // what sender 0 got through
		for i, op := range ops {
			m := seqMsg{0, i}
			var err error
			switch op {
			case 0:
				if err = ref.Send(m); errors.Is(err, ErrMailboxFull) {
					continue
				}
			case 1:
				err = ref.SendContext(ctx, m)
			case 2:
				_, err = ref.Request(ctx, m)
			}
			if err != nil {
				rt.Fatalf("op %d (%d): %v", i, op, err)
			}
			want = append(want, i)
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			rt.Fatalf("other sender: %v", err)
		}
		v, err := ref.Request(ctx, getLog{})
		if err != nil {
			rt.Fatalf("get log: %v", err)
		}
		bySender := make(map[int][]int)
		for _, m := range v.([]seqMsg) {
			bySender[m.sender] = append(bySender[m.sender], m.i)
		}
		if !slices.Equal(bySender[0], want) {
			rt.Fatalf("sender 0: got %v, want %v", bySender[0], want)
		}
		for o := 1; o <= others; o++ {
			if len(bySender[o]) != perOther {
				rt.Fatalf("sender %d: got %d messages, want %d", o, len(bySender[o]), perOther)
			}
			for i, n := range bySender[o] {
				if n != i {
					rt.Fatalf("sender %d: got %v, out of order", o, bySender[o])
				}
			}
		}
	})
}

// stopWatcher counts what its actor is asked to do.
type stopWatcher struct {
	calls, afterStop, stopped *atomic.Int64
	stopReturned              *atomic.Bool
}

func (w stopWatcher) Receive(c *Context, msg any) {
	w.calls.Add(1)
	if w.stopReturned.Load() {
		w.afterStop.Add(1)
	}
	if msg == "stop" {
		c.Stop()
	}
	c.Reply(msg)
}

func (w stopWatcher) Stopped(*Context) { w.stopped.Add(1) }

// A stopped actor receives nothing: every kind of send fails with
// ErrStopped, queued requests are answered with ErrStopped, the behaviour
// starts at most the one message it had already dequeued after Stop
// returns, none after Done, and Stopped runs once.
func TestPropStoppedReceivesNothing(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		s := newTestSystem(rt, Config{})
		ctx := bounded(rt)
		var calls, afterStop, stopped atomic.Int64
		var stopReturned atomic.Bool
		ref := mustSpawn(rt, s, "mortal", func() Behavior {
			return stopWatcher{&calls, &afterStop, &stopped, &stopReturned}
		}, WithMailbox(128))

		before := rapid.IntRange(0, 30).Draw(rt, "before")
		requesters := rapid.IntRange(0, 4).Draw(rt, "requesters")
		selfStop := rapid.Bool().Draw(rt, "selfStop")
		after := rapid.IntRange(1, 10).Draw(rt, "after")

		for i := range before {
			if err := ref.Send(i); err != nil {
				rt.Fatalf("send %d before stop: %v", i, err)
			}
		}
		var wg sync.WaitGroup
		bad := make(chan error, requesters)
		for i := range requesters {
			wg.Go(func() {
				_, err := ref.Request(ctx, -1-i)
				if err != nil && !errors.Is(err, ErrStopped) {
					bad <- err
				}
			})
		}
		if selfStop {
			if _, err := ref.Request(ctx, "stop"); err != nil && !errors.Is(err, ErrStopped) {
				rt.Fatalf("request stop: %v", err)
			}
		} else {
			ref.Stop()
		}
		stopReturned.Store(true)

		check := func(when string) {
			for i := range after {
				if err := ref.Send(i); !errors.Is(err, ErrStopped) {
					rt.Fatalf("%s: Send = %v, want ErrStopped", when, err)
				}
				if err := ref.SendContext(ctx, i); !errors.Is(err, ErrStopped) {
					rt.Fatalf("%s: SendContext = %v, want ErrStopped", when, err)
				}
				if _, err := ref.Request(ctx, i); !errors.Is(err, ErrStopped) {
					rt.Fatalf("%s: Request = %v, want ErrStopped", when, err)
				}
			}
		}
		check("after Stop")
		wg.Wait()
		close(bad)
		for err := range bad {
			rt.Fatalf("queued request: %v, want a reply or ErrStopped", err)
		}
		waitDone(rt, ref)
		n := calls.Load()
		check("after Done")
		if got := calls.Load(); got != n {
			rt.Fatalf("behaviour ran %d times after Done", got-n)
		}
		limit := int64(1)
		if selfStop {
			limit = 0
		}
		if got := afterStop.Load(); got > limit {
			rt.Fatalf("behaviour started %d messages after Stop returned, want <= %d", got, limit)
		}
		if most := int64(before + requesters + 1); n > most {
			rt.Fatalf("behaviour ran %d times, more than the %d messages sent", n, most)
		}
		if got := stopped.Load(); got != 1 {
			rt.Fatalf("Stopped ran %d times, want 1", got)
		}
		if st := ref.Stats(); !st.Stopped || st.Mailbox != 0 {
			rt.Fatalf("stats after stop: %+v", st)
		}
	})
}

// A crashing actor restarts at most MaxRestarts times within Window (a
// sliding window, on the fake clock), waiting out its backoff, and then
// stops and escalates to its supervisor (the root: Config.OnEscalate).
func TestPropRestartLimitThenEscalate(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		fc := NewFakeClock(fakeStart)
		var escalated atomic.Int64
		var escalatedRef atomic.Pointer[Ref]
		s := newTestSystem(rt, Config{Clock: fc, OnEscalate: func(r *Ref, err error) {
			var pe *PanicError
			if !errors.As(err, &pe) {
				panic("escalated error is not a *PanicError")
			}
			escalatedRef.Store(r)
			escalated.Add(1)
		}})
		ctx := bounded(rt)
		minBackoff := rapid.SampledFrom([]time.Duration{0, 100 * time.Millisecond, time.Second}).Draw(rt, "minBackoff")
		pol := RestartPolicy{
			MaxRestarts: rapid.IntRange(0, 4).Draw(rt, "maxRestarts"),
			Window:      time.Duration(rapid.IntRange(0, 10).Draw(rt, "windowSeconds")) * time.Second,
			Backoff:     Backoff{Min: minBackoff, Max: 4 * minBackoff},
		}
		var made atomic.Int64
		ref := mustSpawn(rt, s, "crashy", func() Behavior {
			made.Add(1)
			return BehaviorFunc(func(c *Context, msg any) {
				if msg == "crash" {
					panic("boom")
				}
				c.Reply(msg)
			})
		}, WithPolicy(pol))

		var history []time.Time // the model's restarts within the window
		restarts, stopped := 0, false
		crashes := rapid.IntRange(0, 10).Draw(rt, "crashes")
		for i := range crashes {
			fc.Advance(time.Duration(rapid.IntRange(0, 12).Draw(rt, "gapSeconds")) * time.Second)
			now := fc.Now()
			_, err := ref.Request(ctx, "crash")
			if stopped {
				if !errors.Is(err, ErrStopped) {
					rt.Fatalf("crash %d after escalation: %v, want ErrStopped", i, err)
				}
				continue
			}
			var pe *PanicError
			if !errors.As(err, &pe) || pe.Actor != ref.ID() || pe.Value != "boom" {
				rt.Fatalf("crash %d: %v, want a *PanicError from %s", i, err, ref.ID())
			}
			if pol.Window > 0 {
				history = slices.DeleteFunc(history, func(t time.Time) bool { return !t.After(now.Add(-pol.Window)) })
			}
			if len(history) >= pol.MaxRestarts {
				stopped = true
				continue
			}
			history = append(history, now)
			restarts++
			if d := pol.Backoff.Delay(len(history)); d > 0 {
				fc.Advance(d)
			}
		}

		if stopped {
			waitDone(rt, ref)
			if escalated.Load() != 1 || escalatedRef.Load() != ref {
				rt.Fatalf("escalations = %d, want 1 for %s", escalated.Load(), ref.ID())
			}
		} else {
			if v, err := ref.Request(ctx, "ping"); err != nil || v != "ping" {
				rt.Fatalf("ping after %d restarts: %v, %v", restarts, v, err)
			}
			if escalated.Load() != 0 {
				rt.Fatalf("escalated without exceeding the policy")
			}
		}
		st := ref.Stats()
		if st.Restarts != uint64(restarts) || st.Stopped != stopped {
			rt.Fatalf("stats %+v, want %d restarts, stopped %v", st, restarts, stopped)
		}
		if got := made.Load(); got != int64(1+restarts) {
			rt.Fatalf("factory called %d times, want %d", got, 1+restarts)
		}
	})
}
