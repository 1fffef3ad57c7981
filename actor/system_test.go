package actor

import (
	"context"
	"errors"
	"strings"
	"testing"
)

func TestSpawnNames(t *testing.T) {
	s := newTestSystem(t, Config{})
	a := mustSpawn(t, s, "a", echo)
	if a.ID() != "/a" || a.String() != "/a" {
		t.Fatalf("ID %q", a.ID())
	}
	if _, err := s.Spawn("a", echo); !errors.Is(err, ErrNameTaken) {
		t.Fatalf("duplicate name: %v", err)
	}
	anon1, anon2 := mustSpawn(t, s, "", echo), mustSpawn(t, s, "", echo)
	if anon1.ID() == anon2.ID() || !strings.HasPrefix(anon1.ID(), "/$") {
		t.Fatalf("generated names %q %q", anon1.ID(), anon2.ID())
	}
	for _, tc := range []struct {
		name string
		b    func() Behavior
		opts []Option
	}{
		{"a/b", echo, nil},
		{"nofactory", nil, nil},
		{"nomailbox", echo, []Option{WithMailbox(0)}},
	} {
		if _, err := s.Spawn(tc.name, tc.b, tc.opts...); err == nil {
			t.Errorf("Spawn(%q) succeeded", tc.name)
		}
	}
	a.Stop()
	b := mustSpawn(t, s, "a", echo) // the name is free as soon as Stop returns
	if b == a {
		t.Fatal("got the stopped actor back")
	}
}

// Shutdown waits for every actor; it gives up when ctx ends and can be
// called again.
func TestShutdown(t *testing.T) {
	s := NewSystem(Config{})
	g := newGate()
	r := mustSpawn(t, s, "slow", func() Behavior { return slowStopper{g} })
	mustSpawn(t, s, "echo", echo)
	expired, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.Shutdown(expired); !errors.Is(err, context.Canceled) {
		t.Fatalf("Shutdown with a blocked Stopped hook = %v", err)
	}
	if _, err := s.Spawn("late", echo); !errors.Is(err, ErrStopped) {
		t.Fatalf("Spawn after Shutdown = %v", err)
	}
	if err := r.Send(1); !errors.Is(err, ErrStopped) {
		t.Fatalf("Send after Shutdown = %v", err)
	}
	g.open()
	if err := s.Shutdown(bounded(t)); err != nil {
		t.Fatal(err)
	}
	waitDone(t, r)
	if m := s.Metrics(); m.Actors != 0 || m.Active != 0 || m.MailboxDepth != 0 {
		t.Fatalf("after Shutdown: %+v", m)
	}
}

func TestMetrics(t *testing.T) {
	s := newTestSystem(t, Config{})
	ctx := bounded(t)
	g := newGate()
	defer g.open()

	a := mustSpawn(t, s, "a", echo)
	for i := range 3 {
		if _, err := a.Request(ctx, i); err != nil {
			t.Fatal(err)
		}
	}
	b := mustSpawn(t, s, "b", func() Behavior {
		return BehaviorFunc(func(c *Context, msg any) {
			if msg == "block" {
				g.block()
			}
		})
	}, WithMailbox(2))
	g.hold(t, b)
	for i := range 3 {
		if err := b.Send(i); (err != nil) != (i == 2) {
			t.Fatalf("send %d: %v", i, err)
		}
	}
	c := mustSpawn(t, s, "c", crashy, WithPolicy(RestartPolicy{MaxRestarts: 1}))
	for range 2 {
		if _, err := c.Request(ctx, "crash"); err == nil {
			t.Fatal("crash did not fail")
		}
	}
	waitDone(t, c)

	m := s.Metrics()
	if m.Active < 1 {
		t.Errorf("Active = %d with b blocked", m.Active)
	}
	m.Active = 0
	want := Metrics{Actors: 2, MailboxDepth: 2, Received: 6, Rejected: 1, Panics: 2, Restarts: 1, Escalations: 1}
	if m != want {
		t.Fatalf("metrics %+v\nwant    %+v", m, want)
	}
	if st, want := b.Stats(), (Stats{Mailbox: 2, MaxMailbox: 2, MailboxCap: 2, Received: 1, Rejected: 1}); st != want {
		t.Fatalf("b stats %+v, want %+v", st, want)
	}
	if st := c.Stats(); st.Panics != 2 || st.Restarts != 1 || !st.Stopped || st.Received != 2 {
		t.Fatalf("c stats %+v", st)
	}
}
