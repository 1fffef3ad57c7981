package actor

import (
	"context"
	"errors"
	"testing"
)

// Send never blocks: a full mailbox refuses the message with
// ErrMailboxFull; SendContext waits for space.
func TestMailboxFull(t *testing.T) {
	s := newTestSystem(t, Config{})
	ctx := bounded(t)
	g := newGate()
	var got []any // owned by the actor
	ref := mustSpawn(t, s, "narrow", func() Behavior {
		return BehaviorFunc(func(c *Context, msg any) {
			switch msg {
			case "block":
				g.block()
			case "log":
				c.Reply(append([]any(nil), got...))
				return
			}
			got = append(got, msg)
		})
	}, WithMailbox(3))
	defer g.open()
	g.hold(t, ref)
	for i := range 3 {
		if err := ref.Send(i); err != nil {
			t.Fatalf("send %d: %v", i, err)
		}
	}
	if err := ref.Send(3); !errors.Is(err, ErrMailboxFull) {
		t.Fatalf("send to full mailbox = %v, want ErrMailboxFull", err)
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if err := ref.SendContext(cancelled, 3); !errors.Is(err, context.Canceled) {
		t.Fatalf("SendContext with cancelled ctx = %v, want context.Canceled", err)
	}
	st := ref.Stats()
	want := Stats{Mailbox: 3, MaxMailbox: 3, MailboxCap: 3, Received: 1, Rejected: 1}
	if st != want {
		t.Fatalf("stats = %+v, want %+v", st, want)
	}

	sent := make(chan error, 1)
	go func() { sent <- ref.SendContext(ctx, 4) }()
	g.open()
	if err := <-sent; err != nil {
		t.Fatalf("SendContext waiting for space: %v", err)
	}
	v, err := ref.Request(ctx, "log")
	if err != nil {
		t.Fatal(err)
	}
	if got := v.([]any); len(got) != 5 || got[0] != "block" || got[1] != 0 || got[4] != 4 {
		t.Fatalf("delivered %v, want block 0 1 2 4", got)
	}
}

// The ring keeps FIFO order through wrap-around and growth, grows only up
// to its limit unless forced past it, and drops a large buffer when idle.
func TestMailboxRing(t *testing.T) {
	var m mailbox
	next, want := 0, 0
	push := func(k int, limit int32) {
		for range k {
			m.push(envelope{msg: next}, limit)
			next++
		}
	}
	pop := func(k int) {
		for range k {
			if e := m.pop(); e.msg != want {
				t.Fatalf("popped %v, want %d", e.msg, want)
			}
			want++
		}
	}
	push(3, 5)
	pop(2)
	push(4, 5) // wraps, then grows to the limit of 5
	if len(m.buf) != 5 || m.n != 5 {
		t.Fatalf("len %d n %d, want 5 5", len(m.buf), m.n)
	}
	push(1, 5) // forced past the limit (timer messages)
	if m.n != 6 {
		t.Fatalf("n = %d, want 6", m.n)
	}
	pop(6)
	push(20, 64)
	pop(20)
	m.idle()
	if m.buf != nil {
		t.Fatalf("idle kept a buffer of %d", len(m.buf))
	}
	push(1, 64)
	if replies := m.drain(); len(replies) != 0 || m.n != 0 {
		t.Fatalf("drain left %d, returned %d replies", m.n, len(replies))
	}
}
