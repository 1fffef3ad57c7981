package actor

import (
	"context"
	"sync"
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
	c := &clockCtx{parent: parent, done: make(chan struct{})}
	stop := context.AfterFunc(parent, func() { c.end(parent.Err()) })
	if d <= 0 {
		c.end(context.DeadlineExceeded)
		return c, func() { stop(); c.end(context.Canceled) }
	}
	t := clock.AfterFunc(d, func() { c.end(context.DeadlineExceeded) })
	return c, func() {
		t.Stop()
		stop()
		c.end(context.Canceled)
	}
}

// clockCtx is a context ended by its parent, its clock's deadline or its
// cancel, whichever comes first, with the matching Err. It is a context of
// its own, not a wrapper: contexts derived from it take its Err
// (DeadlineExceeded once the clock passes the deadline), where a wrapper's
// children saw the Canceled of the context inside it.
type clockCtx struct {
	parent context.Context
	done   chan struct{}
	mu     sync.Mutex
	err    error
}

func (c *clockCtx) Deadline() (time.Time, bool) { return c.parent.Deadline() }
func (c *clockCtx) Done() <-chan struct{}       { return c.done }
func (c *clockCtx) Value(key any) any           { return c.parent.Value(key) }

func (c *clockCtx) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

func (c *clockCtx) end(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err == nil {
		c.err = err
		close(c.done)
	}
}
