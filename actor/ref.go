package actor

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
)

// Ref is the handle of a spawned actor. Its methods are safe for concurrent
// use. A Ref stays valid after the actor stops: sends to it then fail with
// ErrStopped.
type Ref struct {
	// Set at spawn, then read-only.
	sys         *System
	parent      *Ref // nil for the root
	id          string
	newBehavior func() Behavior
	policy      *RestartPolicy
	cap         int32
	pinc        uint32 // parent's incarnation when r was spawned

	mu sync.Mutex
	// Guarded by mu.
	box          mailbox
	behavior     Behavior // nil between incarnations
	inc          uint32   // incarnation, bumped on every restart
	running      bool     // a goroutine owns the actor (run is active)
	stopping     bool     // Stop was called or the actor escalated
	restarting   bool     // waiting for the backoff timer
	startPending bool     // Started must run before the next message
	selfDone     bool     // terminate finished; waiting for children
	finished     bool     // terminated with all children
	live         int32    // children not yet terminated
	failure      error    // an escalation from a child, to handle next
	children     map[string]*Ref
	space        chan struct{} // closed when mailbox space frees; nil if nobody waits
	done         chan struct{} // created lazily by Done
	sup          *supervision  // restart history, allocated on first failure
	stats        refStats

	ctx Context // used only by the goroutine that owns the actor
}

type refStats struct {
	received uint64
	rejected uint32
	panics   uint32
	restarts uint32
	maxDepth int32
}

// envelope is one queued message.
type envelope struct {
	msg   any
	reply *reply // nil for Send
	// timer is set for a timer's message, queued for incarnation inc: a
	// later incarnation never receives it, though it was queued before
	// the restart.
	timer bool
	inc   uint32
}

// ID returns the actor's path: its parent's ID, "/", its name.
func (r *Ref) ID() string { return r.id }

// String returns ID().
func (r *Ref) String() string { return r.id }

// Send queues msg without blocking. It fails with ErrMailboxFull if the
// mailbox is at capacity (msg is dropped, the actor's Rejected count
// rises) and with ErrStopped once the actor is stopping. A nil error means
// msg is queued, not that it will be handled: Stop discards queued
// messages.
func (r *Ref) Send(msg any) error {
	return r.enqueue(nil, envelope{msg: msg}, false)
}

// SendContext queues msg, waiting for space while the mailbox is full until
// ctx is done. It fails with ErrStopped once the actor is stopping. Calling
// it on the actor's own Ref from Receive with a full mailbox waits for ctx.
func (r *Ref) SendContext(ctx context.Context, msg any) error {
	return r.enqueue(ctx, envelope{msg: msg}, true)
}

// Request sends msg and waits for the behaviour's reply (Context.Reply,
// Context.ReplyError or a deferred Replier). While the mailbox is full it
// waits for space. It returns the behaviour's value and error, or:
//   - ctx.Err(), wrapped, once ctx is done (use WithTimeout for a deadline
//     on the System's Clock);
//   - ErrStopped if the actor stops before handling msg;
//   - ErrNoReply if the behaviour returned without replying or deferring;
//   - a *PanicError if the behaviour panicked on msg.
//
// A reply that comes after Request gave up is discarded. Requesting from an
// actor to itself deadlocks until ctx is done.
func (r *Ref) Request(ctx context.Context, msg any) (any, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("request to %s: %w", r.id, err)
	}
	rp := &reply{ch: make(chan result, 1)}
	if err := r.enqueue(ctx, envelope{msg: msg, reply: rp}, true); err != nil {
		return nil, err
	}
	select {
	case res := <-rp.ch:
		return res.v, res.err
	case <-ctx.Done():
		return nil, fmt.Errorf("request to %s: %w", r.id, ctx.Err())
	}
}

// enqueue puts env in the mailbox. With block it waits for space until ctx
// is done.
func (r *Ref) enqueue(ctx context.Context, env envelope, block bool) error {
	for {
		r.mu.Lock()
		if r.stopping {
			r.mu.Unlock()
			return fmt.Errorf("send to %s: %w", r.id, ErrStopped)
		}
		if r.box.n < r.cap {
			start := r.push(env)
			r.mu.Unlock()
			if start {
				r.start()
			}
			return nil
		}
		if !block {
			r.stats.rejected++
			r.mu.Unlock()
			r.sys.m.rejected.Add(1)
			return fmt.Errorf("send to %s: %w", r.id, ErrMailboxFull)
		}
		if r.space == nil {
			r.space = make(chan struct{})
		}
		space := r.space
		r.mu.Unlock()
		select {
		case <-space:
		case <-ctx.Done():
			return fmt.Errorf("send to %s: %w", r.id, ctx.Err())
		}
	}
}

// push queues env, ignoring capacity, and reports whether the caller must
// start a goroutine for the actor. r.mu is held.
func (r *Ref) push(env envelope) (start bool) {
	r.box.push(env, r.cap)
	r.sys.m.depth.Add(1)
	r.stats.maxDepth = max(r.stats.maxDepth, r.box.n)
	if r.running || r.restarting {
		return false
	}
	r.running = true
	return true
}

// start runs the actor on a new goroutine. The caller set r.running.
func (r *Ref) start() {
	r.sys.wg.Add(1)
	r.sys.m.active.Add(1)
	go r.run()
}

// Stop stops the actor and, recursively, its children. It does not wait:
// afterwards sends fail with ErrStopped, queued messages are discarded
// (queued requests get ErrStopped), and no further message is delivered,
// except one the actor had already taken from its mailbox. Its name is
// free for a new sibling at once. Done is closed when the actor and all
// its children have terminated. Stopping a stopped actor does nothing; an
// actor may stop itself from Receive.
func (r *Ref) Stop() {
	r.mu.Lock()
	if r.stopping {
		r.mu.Unlock()
		return
	}
	r.stopping = true
	start := !r.running
	if start {
		r.running = true
		if r.restarting {
			r.restarting = false
			r.sup.timer.Stop()
		}
	}
	r.mu.Unlock()
	r.detach()
	if start {
		r.start()
	}
}

// detach frees r's name in its parent.
func (r *Ref) detach() {
	p := r.parent
	name := r.id[len(p.id)+1:]
	p.mu.Lock()
	if p.children[name] == r {
		delete(p.children, name)
	}
	p.mu.Unlock()
}

// Done returns a channel closed once the actor has terminated: it was
// stopped (or escalated), its Stopped hook returned, its behaviour will
// never run again and all its children have terminated too.
func (r *Ref) Done() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.done == nil {
		r.done = make(chan struct{})
		if r.finished {
			close(r.done)
		}
	}
	return r.done
}

// reply is where a Request waits for its answer.
type reply struct {
	sent atomic.Bool
	ch   chan result // buffered 1
}

type result struct {
	v   any
	err error
}

// send delivers the first answer; later ones are dropped.
func (rp *reply) send(v any, err error) bool {
	if !rp.sent.CompareAndSwap(false, true) {
		return false
	}
	rp.ch <- result{v, err}
	return true
}
