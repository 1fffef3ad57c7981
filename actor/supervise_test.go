package actor

import (
	"encoding/json"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// crashy panics on "crash" and otherwise replies with its message.
func crashy() Behavior {
	return BehaviorFunc(func(c *Context, msg any) {
		if msg == "crash" {
			panic("boom")
		}
		c.Reply(msg)
	})
}

// supervisor spawns "kid" whenever it starts and answers "kid" with it.
type supervisor struct {
	kidPolicy RestartPolicy
	kid       *Ref
}

func (p *supervisor) Started(c *Context) {
	kid, err := c.Spawn("kid", crashy, WithPolicy(p.kidPolicy))
	if err != nil {
		panic(err)
	}
	p.kid = kid
}

func (p *supervisor) Receive(c *Context, msg any) { c.Reply(p.kid) }

func logRecords(t *testing.T, buf *syncBuffer) []map[string]any {
	t.Helper()
	var recs []map[string]any
	for line := range strings.Lines(buf.String()) {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		recs = append(recs, rec)
	}
	return recs
}

func TestPanicLogIncludesActorID(t *testing.T) {
	var buf syncBuffer
	s := newTestSystem(t, Config{Logger: slog.New(slog.NewJSONHandler(&buf, nil))})
	ctx := bounded(t)
	pool := mustSpawn(t, s, "pool", func() Behavior { return &supervisor{kidPolicy: DefaultPolicy()} })
	v, err := pool.Request(ctx, "kid")
	if err != nil {
		t.Fatal(err)
	}
	kid := v.(*Ref)
	if kid.ID() != "/pool/kid" {
		t.Fatalf("kid ID %q", kid.ID())
	}
	if _, err := kid.Request(ctx, "crash"); err == nil {
		t.Fatal("crash did not fail")
	}
	var panicked, restarting bool
	for _, rec := range logRecords(t, &buf) {
		switch rec["msg"] {
		case "actor panicked":
			panicked = true
			if rec["level"] != "ERROR" || rec["actor"] != "/pool/kid" || rec["panic"] != "boom" ||
				!strings.Contains(rec["stack"].(string), "panic") {
				t.Errorf("panic record %v", rec)
			}
		case "actor restarting":
			restarting = true
			if rec["actor"] != "/pool/kid" || rec["attempt"] != 1.0 {
				t.Errorf("restart record %v", rec)
			}
		}
	}
	if !panicked || !restarting {
		t.Fatalf("missing records (panicked %v, restarting %v) in\n%s", panicked, restarting, buf.String())
	}
}

type escalation struct {
	ref *Ref
	err error
}

// A child that gives up fails its parent, whose own policy restarts it
// (with fresh children) and, when exhausted, escalates to the root.
func TestEscalationReachesParentThenRoot(t *testing.T) {
	escalated := make(chan escalation, 1)
	s := newTestSystem(t, Config{OnEscalate: func(r *Ref, err error) { escalated <- escalation{r, err} }})
	ctx := bounded(t)
	var made atomic.Int64
	sup := mustSpawn(t, s, "sup", func() Behavior {
		made.Add(1)
		return &supervisor{kidPolicy: RestartPolicy{MaxRestarts: 0}}
	}, WithPolicy(RestartPolicy{MaxRestarts: 1, Window: time.Hour}))
	kid := func() *Ref {
		v, err := sup.Request(ctx, "kid")
		if err != nil {
			t.Fatalf("ask for kid: %v", err)
		}
		return v.(*Ref)
	}

	kid1 := kid()
	if _, err := kid1.Request(ctx, "crash"); err == nil {
		t.Fatal("crash did not fail")
	}
	waitDone(t, kid1)
	kid2 := kid() // queued behind the escalation: the restarted parent answers
	if kid2 == kid1 || kid2.ID() != "/sup/kid" {
		t.Fatalf("after restart kid is %p %s, was %p", kid2, kid2.ID(), kid1)
	}
	if st := sup.Stats(); st.Restarts != 1 || made.Load() != 2 {
		t.Fatalf("parent restarts %d, incarnations %d; want 1, 2", st.Restarts, made.Load())
	}

	if _, err := kid2.Request(ctx, "crash"); err == nil {
		t.Fatal("crash did not fail")
	}
	var e escalation
	select {
	case e = <-escalated:
	case <-time.After(bound):
		t.Fatal("no escalation reached the root")
	}
	var ee *EscalationError
	var pe *PanicError
	if e.ref != sup || !errors.As(e.err, &ee) || ee.Actor != "/sup/kid" || !errors.As(e.err, &pe) {
		t.Fatalf("root got %v from %v", e.err, e.ref)
	}
	waitDone(t, sup)
	waitDone(t, kid2)
	if m := s.Metrics(); m.Escalations != 3 || m.Restarts != 1 || m.Actors != 0 {
		t.Fatalf("metrics %+v", m)
	}
}

// recorder logs what it receives; a restart gives it a fresh log.
func recorder() Behavior {
	var got []any
	return BehaviorFunc(func(c *Context, msg any) {
		switch msg {
		case "crash":
			panic("boom")
		case "log":
			c.Reply(slices.Clone(got))
		default:
			got = append(got, msg)
		}
	})
}

// During the backoff messages queue; the restart waits for the clock.
func TestBackoffWaitsForClock(t *testing.T) {
	fc := NewFakeClock(fakeStart)
	s := newTestSystem(t, Config{Clock: fc})
	ctx := bounded(t)
	ref := mustSpawn(t, s, "patient", recorder, WithPolicy(RestartPolicy{
		MaxRestarts: 2, Window: time.Minute, Backoff: Backoff{Min: time.Second},
	}))
	if err := ref.Send("before"); err != nil {
		t.Fatal(err)
	}
	if _, err := ref.Request(ctx, "crash"); err == nil {
		t.Fatal("crash did not fail")
	}
	for _, m := range []string{"a", "b"} {
		if err := ref.Send(m); err != nil {
			t.Fatal(err)
		}
	}
	fc.Advance(999 * time.Millisecond)
	if st := ref.Stats(); st.Mailbox != 2 || st.Restarts != 1 {
		t.Fatalf("during backoff: %+v", st)
	}
	fc.Advance(time.Millisecond)
	v, err := ref.Request(ctx, "log")
	if err != nil {
		t.Fatal(err)
	}
	if got := v.([]any); !slices.Equal(got, []any{"a", "b"}) {
		t.Fatalf("new incarnation saw %v, want [a b]", got)
	}
}

func TestStopDuringBackoff(t *testing.T) {
	fc := NewFakeClock(fakeStart)
	s := newTestSystem(t, Config{Clock: fc})
	ref := mustSpawn(t, s, "quitter", recorder, WithPolicy(RestartPolicy{
		MaxRestarts: 1, Backoff: Backoff{Min: time.Second},
	}))
	if _, err := ref.Request(bounded(t), "crash"); err == nil {
		t.Fatal("crash did not fail")
	}
	if fc.Pending() != 1 {
		t.Fatalf("%d timers pending, want the backoff", fc.Pending())
	}
	ref.Stop()
	waitDone(t, ref)
	if fc.Pending() != 0 {
		t.Fatal("backoff timer still armed after Stop")
	}
}

// hooks records its lifecycle; it panics where told to.
type hooks struct {
	n         int
	mu        *sync.Mutex
	events    *[]string
	panicWhen string
}

func (h *hooks) event(e string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	*h.events = append(*h.events, e)
	if e == h.panicWhen {
		panic(e)
	}
}

func (h *hooks) Started(*Context) { h.event("started" + string(rune('0'+h.n))) }
func (h *hooks) Stopped(*Context) { h.event("stopped" + string(rune('0'+h.n))) }

func (h *hooks) Receive(c *Context, msg any) {
	if msg == "crash" {
		panic("crash")
	}
	c.Reply(msg)
}

// Started and Stopped bracket every incarnation; a panic in Started is a
// failure, one in Stopped is only logged.
func TestLifecycleHooks(t *testing.T) {
	s := newTestSystem(t, Config{})
	ctx := bounded(t)
	var mu sync.Mutex
	var events []string
	n := 0
	ref := mustSpawn(t, s, "hooked", func() Behavior {
		n++
		return &hooks{n: n, mu: &mu, events: &events, panicWhen: map[int]string{2: "started2", 3: "stopped3"}[n]}
	}, WithPolicy(RestartPolicy{MaxRestarts: 5}))
	if _, err := ref.Request(ctx, "crash"); err == nil {
		t.Fatal("crash did not fail")
	}
	if _, err := ref.Request(ctx, "ping"); err != nil {
		t.Fatal(err)
	}
	ref.Stop()
	waitDone(t, ref)
	want := []string{"started1", "stopped1", "started2", "stopped2", "started3", "stopped3"}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(events, want) {
		t.Fatalf("events %v, want %v", events, want)
	}
	if st := ref.Stats(); st.Restarts != 2 || st.Panics != 3 {
		t.Fatalf("stats %+v, want 2 restarts, 3 panics", st)
	}
}

func TestSpawnFactoryFailures(t *testing.T) {
	s := newTestSystem(t, Config{})
	_, err := s.Spawn("panicky", func() Behavior { panic("no") })
	var pe *PanicError
	if !errors.As(err, &pe) || pe.Actor != "/panicky" {
		t.Fatalf("Spawn with a panicking factory = %v", err)
	}
	if _, err := s.Spawn("nil", func() Behavior { return nil }); err == nil {
		t.Fatal("Spawn accepted a nil behaviour")
	}
	if m := s.Metrics(); m.Actors != 0 {
		t.Fatalf("failed spawns left %d actors", m.Actors)
	}
}

// Stopping a parent stops its children; the parent is Done only after
// they are.
func TestStopParentStopsChildren(t *testing.T) {
	s := newTestSystem(t, Config{})
	ctx := bounded(t)
	g := newGate()
	sup := mustSpawn(t, s, "sup", func() Behavior { return &supervisor{kidPolicy: DefaultPolicy()} })
	v, err := sup.Request(ctx, "kid")
	if err != nil {
		t.Fatal(err)
	}
	kid := v.(*Ref)
	// A grandchild whose Stopped hook waits on the gate. (Tests may spawn
	// under any actor; behaviours use Context.Spawn.)
	grandchild, err := kid.spawn("slow", func() Behavior { return slowStopper{g} }, nil)
	if err != nil {
		t.Fatal(err)
	}
	sup.Stop()
	<-g.entered // the grandchild is stopping
	select {
	case <-sup.Done():
		t.Fatal("parent Done before its grandchild terminated")
	default:
	}
	if err := kid.Send("x"); !errors.Is(err, ErrStopped) {
		t.Fatalf("send to child of stopped parent = %v", err)
	}
	g.open()
	waitDone(t, sup)
	for _, r := range []*Ref{kid, grandchild} {
		select {
		case <-r.Done():
		default:
			t.Fatalf("%s not Done when its ancestor is", r.ID())
		}
	}
}

type slowStopper struct{ g *gate }

func (slowStopper) Receive(*Context, any) {}
func (s slowStopper) Stopped(*Context)    { s.g.block() }

// Without a Max, the delay doubles until it would overflow and stays
// there: a Min that is a power of two reached exactly 1<<62, passed the
// guard and doubled into a negative delay, which restarted at once, in a
// hot loop.
func TestBackoffDelayNeverOverflows(t *testing.T) {
	for _, min := range []time.Duration{1 << 30, time.Second, 3} {
		b := Backoff{Min: min}
		prev := time.Duration(0)
		for attempt := 1; attempt <= 80; attempt++ {
			d := b.Delay(attempt)
			if d <= 0 || d < prev {
				t.Fatalf("Min %v: Delay(%d) = %v after %v", min, attempt, d, prev)
			}
			prev = d
		}
	}
}
