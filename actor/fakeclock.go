package actor

import (
	"container/heap"
	"context"
	"sync"
	"time"
)

// FakeClock is a Clock for tests whose time moves only when Advance is
// called. Callbacks run synchronously inside Advance, in deadline order
// (ties in the order they were set), with Now returning their deadline, so
// a test never sleeps. A callback may set new timers; those that fall due
// before the end of the same Advance run in it too.
//
// FakeClock is safe for concurrent use, but only one goroutine should call
// Advance at a time.
type FakeClock struct {
	mu      sync.Mutex
	now     time.Time
	seq     uint64
	timers  fakeHeap
	changed chan struct{} // closed when a timer is added; nil when unwatched
}

// NewFakeClock returns a FakeClock reading start.
func NewFakeClock(start time.Time) *FakeClock { return &FakeClock{now: start} }

// Now returns the clock's current time.
func (c *FakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// AfterFunc arms a timer that calls f during the Advance that reaches
// Now()+d. A timer with d <= 0 fires at the next Advance, even Advance(0).
func (c *FakeClock) AfterFunc(d time.Duration, f func()) Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seq++
	t := &fakeTimer{c: c, when: c.now.Add(max(d, 0)), seq: c.seq, f: f}
	heap.Push(&c.timers, t)
	if c.changed != nil {
		close(c.changed)
		c.changed = nil
	}
	return t
}

// Advance moves the clock forward by d, firing every timer that falls due.
func (c *FakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	end := c.now.Add(d)
	for len(c.timers) > 0 && !c.timers[0].when.After(end) {
		t := heap.Pop(&c.timers).(*fakeTimer)
		if t.when.After(c.now) {
			c.now = t.when
		}
		c.mu.Unlock()
		t.f()
		c.mu.Lock()
	}
	if end.After(c.now) {
		c.now = end
	}
	c.mu.Unlock()
}

// Pending returns the number of armed timers.
func (c *FakeClock) Pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.timers)
}

// WaitForTimers blocks until at least n timers are armed or ctx is done. It
// lets a test wait for a timer that another goroutine arms before it calls
// Advance.
func (c *FakeClock) WaitForTimers(ctx context.Context, n int) error {
	for {
		c.mu.Lock()
		if len(c.timers) >= n {
			c.mu.Unlock()
			return nil
		}
		if c.changed == nil {
			c.changed = make(chan struct{})
		}
		ch := c.changed
		c.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

type fakeTimer struct {
	c     *FakeClock
	when  time.Time
	seq   uint64
	f     func()
	index int // in c.timers; -1 once fired or stopped
}

func (t *fakeTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	if t.index < 0 {
		return false
	}
	heap.Remove(&t.c.timers, t.index)
	return true
}

type fakeHeap []*fakeTimer

func (h fakeHeap) Len() int { return len(h) }

func (h fakeHeap) Less(i, j int) bool {
	if h[i].when.Equal(h[j].when) {
		return h[i].seq < h[j].seq
	}
	return h[i].when.Before(h[j].when)
}

func (h fakeHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index = i
	h[j].index = j
}

func (h *fakeHeap) Push(x any) {
	t := x.(*fakeTimer)
	t.index = len(*h)
	*h = append(*h, t)
}

func (h *fakeHeap) Pop() any {
	old := *h
	t := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	t.index = -1
	return t
}
