package actor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
)

// Sentinel errors. Errors returned by this package wrap them with the
// actor's ID; test with errors.Is.
var (
	// ErrStopped: the actor (or the System) is stopped or stopping. Sends
	// to it fail, and requests still queued when it stopped get it.
	ErrStopped = errors.New("actor stopped")
	// ErrMailboxFull: Send found the mailbox at capacity; the message was
	// not queued.
	ErrMailboxFull = errors.New("mailbox full")
	// ErrNoReply: the behaviour returned from a Request's message without
	// replying and without calling Context.Defer.
	ErrNoReply = errors.New("actor did not reply")
	// ErrNameTaken: a live sibling already has this name.
	ErrNameTaken = errors.New("actor name taken")
)

// Config configures a System. The zero value is usable.
type Config struct {
	// Logger receives panics, restarts and escalations, always with the
	// key "actor" holding the actor's ID. Nil discards them.
	Logger *slog.Logger
	// Clock drives timers, backoff, restart windows and Request
	// deadlines. Nil means RealClock().
	Clock Clock
	// OnEscalate is called when a top-level actor (spawned with
	// System.Spawn) failed more often than its RestartPolicy allows. The
	// actor has been stopped; err is the last failure. It runs on the
	// failing actor's goroutine and must not block. The failure is logged
	// whether or not OnEscalate is set.
	OnEscalate func(ref *Ref, err error)
}

// System is a tree of actors under one root supervisor. All methods are
// safe for concurrent use.
type System struct {
	log        *slog.Logger
	clock      Clock
	onEscalate func(*Ref, error)
	root       *Ref
	names      atomic.Uint64 // for generated names
	wg         sync.WaitGroup
	m          counters
}

// counters are the System-wide metrics.
type counters struct {
	actors, active, depth                          atomic.Int64
	received, rejected, panics, restarts, escalate atomic.Uint64
}

// NewSystem returns a running System with no actors.
func NewSystem(cfg Config) *System {
	s := &System{log: cfg.Logger, clock: cfg.Clock, onEscalate: cfg.OnEscalate}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.clock == nil {
		s.clock = RealClock()
	}
	s.root = &Ref{sys: s, policy: &defaultPolicy}
	s.root.ctx.self = s.root
	return s
}

// Clock returns the system's clock.
func (s *System) Clock() Clock { return s.clock }

// Spawn starts a top-level actor supervised by the root. See Context.Spawn
// for name and newBehavior; when it escalates, the root stops it, logs it
// and calls Config.OnEscalate.
func (s *System) Spawn(name string, newBehavior func() Behavior, opts ...Option) (*Ref, error) {
	return s.root.spawn(name, newBehavior, opts)
}

// Shutdown stops every actor and waits until all have terminated (their
// Stopped hooks ran and their goroutines are gone) or ctx is done. Spawn
// fails with ErrStopped once Shutdown has begun. Calling it again waits
// again.
func (s *System) Shutdown(ctx context.Context) error {
	root := s.root
	root.mu.Lock()
	if !root.stopping {
		root.stopping = true
		kids := root.takeChildren()
		root.mu.Unlock()
		stopAll(kids)
		root.finishSelf()
	} else {
		root.mu.Unlock()
	}
	select {
	case <-root.Done():
		s.wg.Wait()
		return nil
	case <-ctx.Done():
		return fmt.Errorf("actor system shutdown: %w", ctx.Err())
	}
}

// Option configures one actor at Spawn.
type Option func(*spawnOptions)

type spawnOptions struct {
	mailbox int
	policy  *RestartPolicy
}

// DefaultMailbox is the mailbox capacity of an actor spawned without
// WithMailbox.
const DefaultMailbox = 64

// WithMailbox sets the mailbox capacity (n >= 1). The buffer grows lazily up
// to n, so a large capacity costs nothing until used.
func WithMailbox(n int) Option { return func(o *spawnOptions) { o.mailbox = n } }

// WithPolicy sets the restart policy applied when the actor fails. Without
// it an actor gets DefaultPolicy().
func WithPolicy(p RestartPolicy) Option { return func(o *spawnOptions) { o.policy = &p } }

// spawn creates a child of p.
func (p *Ref) spawn(name string, newBehavior func() Behavior, opts []Option) (*Ref, error) {
	s := p.sys
	o := spawnOptions{mailbox: DefaultMailbox, policy: &defaultPolicy}
	for _, opt := range opts {
		opt(&o)
	}
	if name == "" {
		name = "$" + strconv.FormatUint(s.names.Add(1), 10)
	}
	switch {
	case newBehavior == nil:
		return nil, fmt.Errorf("spawn %s/%s: nil behaviour factory", p.id, name)
	case strings.Contains(name, "/"):
		return nil, fmt.Errorf("spawn %q under %q: name contains '/'", name, p.id)
	case o.mailbox < 1 || o.mailbox > 1<<30:
		return nil, fmt.Errorf("spawn %s/%s: mailbox capacity %d out of range", p.id, name, o.mailbox)
	}
	r := &Ref{
		sys:         s,
		parent:      p,
		id:          p.id + "/" + name,
		newBehavior: newBehavior,
		policy:      o.policy,
		cap:         int32(o.mailbox),
	}
	r.ctx.self = r
	b, err := r.newIncarnation()
	if err != nil {
		return nil, fmt.Errorf("spawn %s: %w", r.id, err)
	}
	r.behavior = b
	if _, ok := b.(Starter); ok {
		r.startPending = true
		r.running = true
	}

	p.mu.Lock()
	switch {
	case p.stopping:
		p.mu.Unlock()
		return nil, fmt.Errorf("spawn %s: supervisor %w", r.id, ErrStopped)
	case p.children[name] != nil:
		p.mu.Unlock()
		return nil, fmt.Errorf("spawn %s: %w", r.id, ErrNameTaken)
	}
	if p.children == nil {
		p.children = make(map[string]*Ref)
	}
	p.children[name] = r
	p.live++
	r.pinc = p.inc
	p.mu.Unlock()

	s.m.actors.Add(1)
	if r.running {
		r.start()
	}
	return r, nil
}

// takeChildren empties r's set of children and returns them. r.mu is held.
func (r *Ref) takeChildren() []*Ref {
	if len(r.children) == 0 {
		return nil
	}
	kids := make([]*Ref, 0, len(r.children))
	for _, k := range r.children {
		kids = append(kids, k)
	}
	r.children = nil
	return kids
}

func stopAll(refs []*Ref) {
	for _, k := range refs {
		k.Stop()
	}
}
