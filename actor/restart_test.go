package actor

import (
	"sync"
	"testing"
	"time"
)

// A timer of incarnation 1 that fires while incarnation 1 is still busy
// is queued; incarnation 1 then panics, and incarnation 2 must not receive
// it. (It did: the incarnation was checked when the timer fired only.)
func TestTimerQueuedBeforeARestartIsDropped(t *testing.T) {
	fc := NewFakeClock(fakeStart)
	s := newTestSystem(t, Config{Clock: fc})
	ctx := bounded(t)
	release := make(chan struct{})
	holding := make(chan struct{})
	var mu sync.Mutex
	var got []string
	n := 0
	ref := mustSpawn(t, s, "a", func() Behavior {
		n++
		inc := n
		return BehaviorFunc(func(c *Context, msg any) {
			switch msg {
			case "arm":
				c.After(time.Second, "tick-from-1")
				c.Reply(nil)
			case "hold-then-crash":
				close(holding)
				<-release
				panic("boom")
			case "tick-from-1":
				mu.Lock()
				got = append(got, "tick-from-1 seen by incarnation "+string(rune('0'+inc)))
				mu.Unlock()
			case "sync":
				c.Reply(inc)
			}
		})
	}, WithPolicy(RestartPolicy{MaxRestarts: 5}))
	if _, err := ref.Request(ctx, "arm"); err != nil {
		t.Fatal(err)
	}
	if err := ref.Send("hold-then-crash"); err != nil {
		t.Fatal(err)
	}
	<-holding
	fc.Advance(time.Second) // incarnation 1's timer fires: its message is queued
	close(release)          // incarnation 1 panics; incarnation 2 takes over the mailbox
	v, err := ref.Request(ctx, "sync")
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if v.(int) != 2 || len(got) != 0 {
		t.Fatalf("incarnation %v; predecessor's timer messages delivered: %q (want none)", v, got)
	}
}

// A timer set by the old behaviour's Stopped hook during a restart is not
// delivered to the new incarnation. (It was: the incarnation was bumped
// before Stopped ran.)
type stoppedTimer struct {
	inc  int
	seen *[]int
}

func (b *stoppedTimer) Receive(c *Context, msg any) {
	switch msg {
	case "crash":
		panic("crash")
	case "late":
		*b.seen = append(*b.seen, b.inc)
	case "seen":
		c.Reply(append([]int(nil), *b.seen...))
	}
}

func (b *stoppedTimer) Stopped(c *Context) { c.After(time.Second, "late") }

func TestTimerSetInStoppedEndsWithIt(t *testing.T) {
	fc := NewFakeClock(fakeStart)
	s := newTestSystem(t, Config{Clock: fc})
	ctx := bounded(t)
	var seen []int
	n := 0
	ref := mustSpawn(t, s, "b", func() Behavior { n++; return &stoppedTimer{inc: n, seen: &seen} },
		WithPolicy(RestartPolicy{MaxRestarts: 5}))
	if _, err := ref.Request(ctx, "crash"); err == nil {
		t.Fatal("no panic error")
	}
	ref.Request(ctx, "seen") // incarnation 2 is installed
	fc.Advance(time.Second)
	v, err := ref.Request(ctx, "seen")
	if err != nil {
		t.Fatal(err)
	}
	if got := v.([]int); len(got) != 0 {
		t.Fatalf("timer set in incarnation 1's Stopped delivered to incarnations %v, want dropped", got)
	}
}

// A child spawned by the old behaviour's Stopped hook during a restart
// is stopped with it, not left to live under the new incarnation. (During
// Stop such a spawn is refused.)
type stoppedSpawner struct{ kids *[]*Ref }

func (b *stoppedSpawner) Receive(c *Context, msg any) {
	if msg == "crash" {
		panic("crash")
	}
	c.Reply(nil)
}

func (b *stoppedSpawner) Stopped(c *Context) {
	if k, err := c.Spawn("", echo); err == nil {
		*b.kids = append(*b.kids, k)
	}
}

func TestChildSpawnedInStoppedEndsWithIt(t *testing.T) {
	s := newTestSystem(t, Config{})
	ctx := bounded(t)
	var kids []*Ref
	ref := mustSpawn(t, s, "c", func() Behavior { return &stoppedSpawner{kids: &kids} },
		WithPolicy(RestartPolicy{MaxRestarts: 5}))
	ref.Request(ctx, "crash")
	ref.Request(ctx, "sync")
	for _, k := range kids {
		for i := 0; !k.Stats().Stopped; i++ {
			if i == 500 {
				t.Fatalf("incarnation 1's Stopped spawned %s during the restart; it still runs under incarnation 2", k.ID())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}
