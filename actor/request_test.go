package actor

import (
	"context"
	"errors"
	"testing"
	"time"
)

var errTeapot = errors.New("teapot")

// How the behaviour answers decides what Request returns.
func TestRequestReplies(t *testing.T) {
	for _, tc := range []struct {
		name    string
		receive func(c *Context, msg any)
		want    any
		wantErr func(error) bool
	}{
		{
			name:    "reply",
			receive: func(c *Context, msg any) { c.Reply(msg.(int) * 2) },
			want:    42,
		},
		{
			name:    "first reply wins",
			receive: func(c *Context, msg any) { c.Reply(1); c.Reply(2); c.ReplyError(errTeapot) },
			want:    1,
		},
		{
			name:    "reply error",
			receive: func(c *Context, msg any) { c.ReplyError(errTeapot) },
			wantErr: func(err error) bool { return errors.Is(err, errTeapot) },
		},
		{
			name:    "no reply",
			receive: func(c *Context, msg any) {},
			wantErr: func(err error) bool { return errors.Is(err, ErrNoReply) },
		},
		{
			name:    "panic",
			receive: func(c *Context, msg any) { panic("boom") },
			wantErr: func(err error) bool {
				var pe *PanicError
				return errors.As(err, &pe) && pe.Actor == "/answerer" && pe.Value == "boom" && len(pe.Stack) > 0
			},
		},
		{
			name: "deferred reply from another goroutine",
			receive: func(c *Context, msg any) {
				r := c.Defer()
				if c.Defer().Reply("second defer is a no-op") {
					panic("zero Replier answered")
				}
				go r.Reply("later")
			},
			want: "later",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newTestSystem(t, Config{})
			ref := mustSpawn(t, s, "answerer", func() Behavior { return BehaviorFunc(tc.receive) })
			got, err := ref.Request(bounded(t), 21)
			if tc.wantErr != nil {
				if !tc.wantErr(err) {
					t.Fatalf("Request = %v, %v: unexpected error", got, err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("Request = %v, %v; want %v", got, err, tc.want)
			}
		})
	}
}

// A Request's deadline comes from its context; WithTimeout puts it on the
// system's clock, so a FakeClock expires it without waiting.
func TestRequestDeadline(t *testing.T) {
	for _, tc := range []struct {
		name    string
		mailbox int
		fill    bool          // block the actor and fill its mailbox first
		timeout time.Duration // on the fake clock
		advance time.Duration
		reply   bool // the behaviour replies at once
		wantErr error
	}{
		{name: "reply before deadline", timeout: time.Second, reply: true},
		{name: "no reply until deadline", timeout: time.Second, advance: time.Second, wantErr: context.DeadlineExceeded},
		{name: "deadline already passed", timeout: 0, wantErr: context.DeadlineExceeded},
		{name: "mailbox full until deadline", mailbox: 1, fill: true, timeout: time.Second, advance: time.Second, wantErr: context.DeadlineExceeded},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fc := NewFakeClock(fakeStart)
			s := newTestSystem(t, Config{Clock: fc})
			g := newGate()
			ref := mustSpawn(t, s, "slow", func() Behavior {
				return BehaviorFunc(func(c *Context, msg any) {
					switch {
					case msg == "block":
						g.block()
					case tc.reply:
						c.Reply(msg)
					default:
						c.Defer() // never answered
					}
				})
			}, WithMailbox(max(tc.mailbox, 1)))
			defer g.open()
			if tc.fill {
				g.hold(t, ref)
				if err := ref.Send("filler"); err != nil {
					t.Fatal(err)
				}
			}
			ctx, cancel := WithTimeout(bounded(t), fc, tc.timeout)
			defer cancel()
			done := make(chan error, 1)
			go func() {
				_, err := ref.Request(ctx, "q")
				done <- err
			}()
			fc.Advance(tc.advance)
			var err error
			select {
			case err = <-done:
			case <-time.After(bound):
				t.Fatal("Request did not return")
			}
			if tc.wantErr == nil && err != nil || tc.wantErr != nil && !errors.Is(err, tc.wantErr) {
				t.Fatalf("Request error %v, want %v", err, tc.wantErr)
			}
		})
	}
}

// Requests still queued when the actor stops are answered with ErrStopped.
func TestRequestQueuedWhenStopped(t *testing.T) {
	s := newTestSystem(t, Config{})
	g := newGate()
	ref := mustSpawn(t, s, "stopper", func() Behavior {
		return BehaviorFunc(func(c *Context, msg any) {
			if msg == "block" {
				g.block()
			}
			c.Reply(msg)
		})
	})
	g.hold(t, ref)
	// Queue a request the way Request does, without blocking on it.
	rp := &reply{ch: make(chan result, 1)}
	if err := ref.enqueue(nil, envelope{msg: "queued", reply: rp}, false); err != nil {
		t.Fatal(err)
	}
	ref.Stop()
	g.open()
	if res := <-rp.ch; !errors.Is(res.err, ErrStopped) {
		t.Fatalf("queued request answered %v, %v; want ErrStopped", res.v, res.err)
	}
	waitDone(t, ref)
}
