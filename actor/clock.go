package actor

import (
	"context"
	"time"
)

// Clock is the source of time for an actor system: timers set with
// Context.After and Context.Every, restart backoff, restart windows and the
// deadlines of Request all read it. Implementations must be safe for
// concurrent use.
//
// The runtime needs only callbacks, so Clock has no NewTimer or NewTicker.
type Clock interface {
	// Now returns the current time.
	Now() time.Time
	// AfterFunc calls f, on a goroutine of the clock's choosing, once d has
	// elapsed, unless the returned Timer is stopped first.
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a pending callback of a Clock, or a timer set by an actor.
type Timer interface {
	// Stop prevents the timer from firing. It reports whether it did so:
	// false means the timer already fired or was already stopped.
	Stop() bool
}

// RealClock returns the Clock of package time.
func RealClock() Clock { return realClock{} }

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

func (realClock) AfterFunc(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }

// WithTimeout is context.WithTimeout measured on clock: the returned
// context is done once d has passed on clock, and its Err is then
// context.DeadlineExceeded. With a FakeClock that happens when the test
// advances the clock; with RealClock it is context.WithTimeout. A context
// on another clock reports no deadline of its own from Deadline, since
// callers compare deadlines with time.Now.
func WithTimeout(parent context.Context, clock Clock, d time.Duration) (context.Context, context.CancelFunc) {
	if _, ok := clock.(realClock); ok {
		return context.WithTimeout(parent, d)
	}
	ctx, cancel := context.WithCancelCause(parent)
	if d <= 0 {
		cancel(context.DeadlineExceeded)
		return clockCtx{ctx}, func() { cancel(context.Canceled) }
	}
	t := clock.AfterFunc(d, func() { cancel(context.DeadlineExceeded) })
	return clockCtx{ctx}, func() {
		t.Stop()
		cancel(context.Canceled)
	}
}

// clockCtx reports the deadline cause of its cancellation as its Err.
type clockCtx struct{ context.Context }

func (c clockCtx) Err() error {
	err := c.Context.Err()
	if err == context.Canceled && context.Cause(c.Context) == context.DeadlineExceeded {
		return context.DeadlineExceeded
	}
	return err
}
