package api

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
)

// A gate holds at most its total: a call past it waits for a release, and
// is refused with resource_exhausted, naming itself, when none comes in
// time; a call larger than the gate takes all of it; the caller's own
// deadline ends the wait with the caller's error.
func TestBulkGate(t *testing.T) {
	g := NewBulkGate(100, 200*time.Millisecond)
	ctx := context.Background()
	r1, err := g.Take(ctx, "a", 60)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := g.Take(ctx, "read_file", 50); connect.CodeOf(err) != connect.CodeResourceExhausted || !strings.Contains(err.Error(), "read_file:") {
		t.Fatalf("over the total: %v, want resource_exhausted naming the call", err)
	}
	got := make(chan error, 1)
	go func() {
		r, err := g.Take(ctx, "b", 50)
		if err == nil {
			r()
		}
		got <- err
	}()
	time.Sleep(50 * time.Millisecond)
	r1()
	if err := <-got; err != nil {
		t.Fatalf("a waiter after a release: %v", err)
	}
	big, err := g.Take(ctx, "big", 1000)
	if err != nil {
		t.Fatalf("a call larger than the gate: %v", err)
	}
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if _, err := g.Take(short, "c", 1); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("the caller's deadline: %v", err)
	}
	big()
	r, err := g.Take(ctx, "d", 100)
	if err != nil {
		t.Fatalf("after every release: %v", err)
	}
	r()
}
