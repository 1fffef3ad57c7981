package actor

import (
	"log/slog"
	"sync"
	"time"
)

// Context is what a behaviour sees of the runtime while it handles a
// message (or runs Started or Stopped). It is valid only on the actor's
// goroutine and only until the call returns; keep c.Self() or a Replier
// instead of c.
type Context struct {
	self  *Ref
	reply *reply // the current Request, until answered or deferred
}

// Self returns the actor's own Ref.
func (c *Context) Self() *Ref { return c.self }

// Logger returns the system's logger with the actor's ID under "actor".
func (c *Context) Logger() *slog.Logger { return c.self.sys.log.With("actor", c.self.id) }

// Now returns the time on the system's Clock.
func (c *Context) Now() time.Time { return c.self.sys.clock.Now() }

// Reply answers the Request being handled with v. It does nothing for a
// message sent with Send, or if the request was answered or deferred
// already.
func (c *Context) Reply(v any) {
	if rp := c.reply; rp != nil {
		c.reply = nil
		rp.send(v, nil)
	}
}

// ReplyError answers the Request being handled with err, which Request
// returns as is. Like Reply it does nothing if there is no request to
// answer.
func (c *Context) ReplyError(err error) {
	if rp := c.reply; rp != nil {
		c.reply = nil
		rp.send(nil, err)
	}
}

// Defer takes over the answer to the Request being handled, so that the
// behaviour can reply later (after a timer, or another actor's answer),
// from any goroutine. The zero Replier (returned for a Send, or when the
// request was already answered or deferred) ignores replies.
func (c *Context) Defer() Replier {
	rp := c.reply
	c.reply = nil
	return Replier{rp}
}

// Replier answers one Request; only its first answer counts.
type Replier struct{ r *reply }

// Reply answers with v and reports whether this was the first answer.
func (r Replier) Reply(v any) bool { return r.r != nil && r.r.send(v, nil) }

// ReplyError answers with err and reports whether this was the first
// answer.
func (r Replier) ReplyError(err error) bool { return r.r != nil && r.r.send(nil, err) }

// Spawn starts a child of this actor under its supervision. name must be
// unique among the actor's live children and contain no '/'; "" picks one.
// newBehavior is called now and again on every restart. When the child
// escalates, this actor fails with an *EscalationError. Children are
// stopped when this actor stops or restarts.
func (c *Context) Spawn(name string, newBehavior func() Behavior, opts ...Option) (*Ref, error) {
	return c.self.spawn(name, newBehavior, opts)
}

// Stop stops this actor once the current call returns; see Ref.Stop.
func (c *Context) Stop() { c.self.Stop() }

// After delivers msg to this actor once d has passed on the system's Clock,
// even if the mailbox is full. The timer belongs to the current
// incarnation: it is dropped if the actor restarts or stops first.
func (c *Context) After(d time.Duration, msg any) Timer { return c.timer(d, 0, msg) }

// Every delivers msg to this actor every d on the system's Clock, until the
// timer is stopped or the incarnation ends. A tick is skipped while the
// mailbox is full. It panics if d <= 0.
func (c *Context) Every(d time.Duration, msg any) Timer {
	if d <= 0 {
		panic("actor: non-positive interval for Context.Every")
	}
	return c.timer(d, d, msg)
}

func (c *Context) timer(d, every time.Duration, msg any) Timer {
	r := c.self
	r.mu.Lock()
	inc := r.inc
	r.mu.Unlock()
	t := &actorTimer{ref: r, inc: inc, msg: msg, every: every}
	t.mu.Lock()
	t.t = r.sys.clock.AfterFunc(d, t.fire)
	t.mu.Unlock()
	return t
}

// actorTimer is a timer set from a Context.
type actorTimer struct {
	ref   *Ref
	inc   uint32
	msg   any
	every time.Duration // 0 for a one-shot timer

	mu      sync.Mutex
	t       Timer
	stopped bool
}

func (t *actorTimer) Stop() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.stopped {
		return false
	}
	t.stopped = true
	t.t.Stop()
	return true
}

func (t *actorTimer) fire() {
	t.mu.Lock()
	if t.stopped {
		t.mu.Unlock()
		return
	}
	if t.every == 0 {
		t.stopped = true
	}
	t.mu.Unlock()
	alive := t.ref.deliverTimer(t.inc, t.msg, t.every > 0)
	if t.every == 0 {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if !alive {
		t.stopped = true
	}
	if !t.stopped {
		t.t = t.ref.sys.clock.AfterFunc(t.every, t.fire)
	}
}

// deliverTimer queues a timer's message for incarnation inc. It reports
// whether that incarnation is still alive.
func (r *Ref) deliverTimer(inc uint32, msg any, periodic bool) bool {
	r.mu.Lock()
	if r.stopping || r.inc != inc {
		r.mu.Unlock()
		return false
	}
	if periodic && r.box.n >= r.cap {
		r.mu.Unlock()
		return true
	}
	start := r.push(envelope{msg: msg, timer: true, inc: inc})
	r.mu.Unlock()
	if start {
		r.start()
	}
	return true
}
