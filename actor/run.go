package actor

import (
	"errors"
	"fmt"
	"runtime/debug"
)

// run is the body of an actor's goroutine. It owns the actor while
// r.running is set and exits when the mailbox is empty, when a restart
// backoff begins, or after terminating the actor.
func (r *Ref) run() {
	defer func() {
		r.sys.m.active.Add(-1)
		r.sys.wg.Done()
	}()
	for {
		r.mu.Lock()
		switch {
		case r.stopping:
			r.mu.Unlock()
			r.terminate()
			return
		case r.failure != nil:
			err := r.failure
			r.failure = nil
			r.mu.Unlock()
			if !r.fail(err) {
				return
			}
			continue
		case r.behavior == nil:
			r.mu.Unlock()
			if !r.incarnate() {
				return
			}
			continue
		case r.startPending:
			r.startPending = false
			b := r.behavior
			r.mu.Unlock()
			if err := r.callStarted(b); err != nil && !r.fail(err) {
				return
			}
			continue
		case r.box.n == 0:
			r.running = false
			r.box.idle()
			r.mu.Unlock()
			return
		}
		env := r.box.pop()
		if r.space != nil {
			close(r.space)
			r.space = nil
		}
		if env.timer && env.inc != r.inc {
			// Queued by a timer of an incarnation that has since been
			// replaced: dropped, as it would have been had it fired later.
			r.mu.Unlock()
			r.sys.m.depth.Add(-1)
			continue
		}
		r.stats.received++
		b := r.behavior
		r.mu.Unlock()
		r.sys.m.depth.Add(-1)
		r.sys.m.received.Add(1)
		if !r.deliver(b, env) {
			return
		}
	}
}

// deliver hands env to b and answers env's request if b did not. It
// reports whether the goroutine still owns the actor.
func (r *Ref) deliver(b Behavior, env envelope) bool {
	perr := r.receive(b, env)
	rp := r.ctx.reply
	r.ctx.reply = nil
	if perr != nil {
		owned := r.fail(perr)
		if rp != nil {
			rp.send(nil, perr)
		}
		return owned
	}
	if rp != nil {
		rp.send(nil, fmt.Errorf("request to %s: %w", r.id, ErrNoReply))
	}
	return true
}

func (r *Ref) receive(b Behavior, env envelope) (perr *PanicError) {
	defer func() {
		if v := recover(); v != nil {
			perr = r.panicked(v, "receive")
		}
	}()
	r.ctx.reply = env.reply
	b.Receive(&r.ctx, env.msg)
	return nil
}

func (r *Ref) callStarted(b Behavior) (perr error) {
	s, ok := b.(Starter)
	if !ok {
		return nil
	}
	defer func() {
		if v := recover(); v != nil {
			perr = r.panicked(v, "started")
		}
	}()
	s.Started(&r.ctx)
	return nil
}

func (r *Ref) callStopped(b Behavior) {
	s, ok := b.(Stopper)
	if !ok {
		return
	}
	defer func() {
		if v := recover(); v != nil {
			r.panicked(v, "stopped")
		}
	}()
	s.Stopped(&r.ctx)
}

// newIncarnation calls the behaviour factory, turning a panic or a nil
// behaviour into an error.
func (r *Ref) newIncarnation() (b Behavior, err error) {
	defer func() {
		if v := recover(); v != nil {
			err = r.panicked(v, "factory")
		}
	}()
	if b = r.newBehavior(); b == nil {
		return nil, errors.New("behaviour factory returned nil")
	}
	return b, nil
}

// incarnate installs a fresh behaviour after a restart. It reports whether
// the goroutine still owns the actor.
func (r *Ref) incarnate() bool {
	b, err := r.newIncarnation()
	if err != nil {
		return r.fail(err)
	}
	_, starter := b.(Starter)
	r.mu.Lock()
	r.behavior = b
	r.startPending = starter
	r.mu.Unlock()
	return true
}

// panicked logs a recovered panic under the actor's ID and counts it.
func (r *Ref) panicked(v any, where string) *PanicError {
	stack := debug.Stack()
	r.mu.Lock()
	r.stats.panics++
	r.mu.Unlock()
	r.sys.m.panics.Add(1)
	r.sys.log.Error("actor panicked", "actor", r.id, "in", where, "panic", fmt.Sprint(v), "stack", string(stack))
	return &PanicError{Actor: r.id, Value: v, Stack: stack}
}

// terminate ends a stopping actor on its goroutine: queued requests get
// ErrStopped, children are stopped, the Stopped hook runs.
func (r *Ref) terminate() {
	r.mu.Lock()
	queued := r.box.n
	replies := r.box.drain()
	if r.space != nil {
		close(r.space)
		r.space = nil
	}
	kids := r.takeChildren()
	b := r.behavior
	r.behavior = nil
	r.startPending = false
	r.mu.Unlock()
	r.sys.m.depth.Add(-int64(queued))
	for _, rp := range replies {
		rp.send(nil, fmt.Errorf("request to %s: %w", r.id, ErrStopped))
	}
	stopAll(kids)
	if b != nil {
		r.callStopped(b)
	}
	r.finishSelf()
}

// finishSelf records that r itself is done and finalizes it if its
// children are too.
func (r *Ref) finishSelf() {
	r.mu.Lock()
	r.selfDone = true
	fin := r.live == 0
	r.mu.Unlock()
	if fin {
		r.finalize()
	}
}

// finalize marks r terminated, closes Done and tells the parent.
func (r *Ref) finalize() {
	for r != nil {
		p := r.parent
		if p != nil {
			r.sys.m.actors.Add(-1) // before Done, so Metrics agrees with it
		}
		r.mu.Lock()
		r.finished = true
		if r.done != nil {
			close(r.done)
		}
		r.mu.Unlock()
		if p == nil {
			return
		}
		p.mu.Lock()
		p.live--
		fin := p.selfDone && p.live == 0
		p.mu.Unlock()
		if !fin {
			return
		}
		r = p
	}
}
