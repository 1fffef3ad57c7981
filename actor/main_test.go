package actor

import (
	"bytes"
	"context"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// Every test must leave no goroutine behind: Shutdown waits for all actor
// goroutines.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// tb is what the helpers need of *testing.T, *testing.B and *rapid.T.
type tb interface {
	Helper()
	Cleanup(func())
	Errorf(format string, args ...any)
	Fatalf(format string, args ...any)
}

// bound is how long a test may wait for something that should happen at
// once. It is a safety net against hangs, never a way to wait.
const bound = 10 * time.Second

// newTestSystem returns a System shut down (and waited for) at cleanup.
func newTestSystem(t tb, cfg Config) *System {
	t.Helper()
	s := NewSystem(cfg)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), bound)
		defer cancel()
		if err := s.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	})
	return s
}

// bounded returns a context that ends the test's waits after bound.
func bounded(t tb) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	t.Cleanup(cancel)
	return ctx
}

func waitDone(t tb, r *Ref) {
	t.Helper()
	select {
	case <-r.Done():
	case <-time.After(bound):
		t.Fatalf("%s did not terminate", r.ID())
	}
}

func mustSpawn(t tb, s *System, name string, b func() Behavior, opts ...Option) *Ref {
	t.Helper()
	r, err := s.Spawn(name, b, opts...)
	if err != nil {
		t.Fatalf("spawn %s: %v", name, err)
	}
	return r
}

// echo replies to every request with its message.
func echo() Behavior {
	return BehaviorFunc(func(c *Context, msg any) { c.Reply(msg) })
}

// fakeStart is where fake clocks start.
var fakeStart = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// syncBuffer is a goroutine-safe log sink.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
