package actor

import (
	"fmt"
	"math"
	"time"
)

// RestartPolicy is how a supervisor treats a failing child: a panic in its
// behaviour (Receive, Started or the factory) or an escalation from one of
// its own children.
//
// A failure restarts the actor if it restarted fewer than MaxRestarts
// times within the last Window: its children are stopped, the old
// behaviour's Stopped hook runs, and after Backoff a fresh behaviour from
// the factory (and its Started hook) takes over the same mailbox and Ref.
// Messages keep queuing during the backoff. Otherwise the actor stops and
// the failure escalates to its supervisor: a parent actor treats it as its
// own failure (an *EscalationError) under its own policy; the root logs it
// and calls Config.OnEscalate.
type RestartPolicy struct {
	// MaxRestarts is the number of restarts allowed within Window; 0
	// escalates on the first failure.
	MaxRestarts int
	// Window is the sliding period over which restarts are counted; 0
	// counts every restart since spawn.
	Window time.Duration
	// Backoff delays each restart.
	Backoff Backoff
}

// Backoff is an exponential delay: Min before the first restart in the
// window, doubling for each further one, at most Max. There is no jitter.
type Backoff struct {
	Min time.Duration // 0 restarts at once
	Max time.Duration // 0 means no cap
}

// Delay returns the delay before restart number attempt (1-based) within
// the window.
func (b Backoff) Delay(attempt int) time.Duration {
	if b.Min <= 0 {
		return 0
	}
	d := b.Min
	for i := 1; i < attempt; i++ {
		if b.Max > 0 && d >= b.Max || d > math.MaxInt64/2 { // doubling would overflow
			break
		}
		d *= 2
	}
	if b.Max > 0 && d > b.Max {
		d = b.Max
	}
	return d
}

var defaultPolicy = RestartPolicy{
	MaxRestarts: 3,
	Window:      time.Minute,
	Backoff:     Backoff{Min: 10 * time.Millisecond, Max: time.Second},
}

// DefaultPolicy returns the policy of actors spawned without WithPolicy:
// 3 restarts per minute, backoff from 10ms doubling to at most 1s.
func DefaultPolicy() RestartPolicy { return defaultPolicy }

// supervision is an actor's restart history, allocated on first failure.
type supervision struct {
	restarts []time.Time // within the window, oldest first
	timer    Timer       // backoff timer while restarting
}

// fail applies r's policy to a failure of its current incarnation. It runs
// on the goroutine that owns r and reports whether that goroutine still
// owns it (false while a restart backoff is pending).
func (r *Ref) fail(err error) bool {
	s := r.sys
	p := r.policy
	now := s.clock.Now()
	r.mu.Lock()
	if r.stopping {
		r.mu.Unlock()
		return true // run will terminate
	}
	if r.sup == nil {
		r.sup = &supervision{}
	}
	sv := r.sup
	if p.Window > 0 {
		cut := now.Add(-p.Window)
		i := 0
		for i < len(sv.restarts) && !sv.restarts[i].After(cut) {
			i++
		}
		sv.restarts = append(sv.restarts[:0], sv.restarts[i:]...)
	}
	if len(sv.restarts) >= p.MaxRestarts {
		r.stopping = true
		r.mu.Unlock()
		r.detach()
		s.m.escalate.Add(1)
		r.parent.escalate(r, err)
		return true // run will terminate
	}
	sv.restarts = append(sv.restarts, now)
	attempt := len(sv.restarts)
	r.stats.restarts++
	r.inc++
	old := r.behavior
	r.behavior = nil
	r.startPending = false
	kids := r.takeChildren()
	r.mu.Unlock()
	s.m.restarts.Add(1)

	delay := p.Backoff.Delay(attempt)
	s.log.Warn("actor restarting", "actor", r.id, "attempt", attempt, "backoff", delay, "err", err)
	stopAll(kids)
	if old != nil {
		r.callStopped(old)
		// What the old behaviour's Stopped started belongs to it, not to
		// the next: its timers (armed under the incarnation just begun)
		// are voided by another one, its children stopped.
		r.mu.Lock()
		r.inc++
		late := r.takeChildren()
		r.mu.Unlock()
		stopAll(late)
	}
	if delay <= 0 {
		return true // run installs a new behaviour
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopping {
		return true
	}
	r.restarting = true
	r.running = false
	inc := r.inc
	sv.timer = s.clock.AfterFunc(delay, func() { r.endBackoff(inc) })
	return false
}

// endBackoff resumes r after the backoff of incarnation inc.
func (r *Ref) endBackoff(inc uint32) {
	r.mu.Lock()
	if r.stopping || !r.restarting || r.inc != inc {
		r.mu.Unlock()
		return
	}
	r.restarting = false
	r.running = true
	r.mu.Unlock()
	r.start()
}

// escalate handles child's failure after child gave up restarting and
// stopped.
func (p *Ref) escalate(child *Ref, err error) {
	s := p.sys
	if p.parent == nil {
		s.log.Error("actor failed too often and was stopped", "actor", child.id, "err", err)
		if s.onEscalate != nil {
			s.onEscalate(child, err)
		}
		return
	}
	p.mu.Lock()
	if p.stopping || p.inc != child.pinc || p.failure != nil {
		p.mu.Unlock()
		return // p is going away or restarting already
	}
	p.failure = &EscalationError{Actor: child.id, Err: err}
	start := !p.running && !p.restarting
	if start {
		p.running = true
	}
	p.mu.Unlock()
	s.log.Error("actor failed too often; escalating to its supervisor", "actor", child.id, "supervisor", p.id, "err", err)
	if start {
		p.start()
	}
}

// PanicError is a panic recovered from a behaviour. A Request whose message
// caused it returns it.
type PanicError struct {
	Actor string // ID of the actor that panicked
	Value any    // the value passed to panic
	Stack []byte // the panicking goroutine's stack
}

func (e *PanicError) Error() string {
	return fmt.Sprintf("actor %s panicked: %v", e.Actor, e.Value)
}

// EscalationError is the failure a supervisor receives when its child
// Actor stopped after failing more often than its policy allows.
type EscalationError struct {
	Actor string // ID of the child that gave up
	Err   error  // the child's last failure
}

func (e *EscalationError) Error() string {
	return fmt.Sprintf("child %s escalated: %v", e.Actor, e.Err)
}

func (e *EscalationError) Unwrap() error { return e.Err }
