package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
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

// A call that fits goes through while a larger one waits for room: the
// gate used to queue every call behind the first waiter, so one ListFiles
// waiting for room held up every 32 MiB ReadFile on the node for 30 s,
// and they were refused though there was room for them. The larger one
// gets its room once enough is released.
func TestASmallTakePassesAWaitingLargeOne(t *testing.T) {
	g := NewBulkGate(100, 2*time.Second)
	ctx := context.Background()
	r1, err := g.Take(ctx, "a", 60)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		r, err := g.Take(ctx, "large", 60)
		if err == nil {
			r()
		}
		got <- err
	}()
	time.Sleep(20 * time.Millisecond) // the large one waits
	small, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	r2, err := g.Take(small, "small", 10)
	if err != nil {
		t.Fatalf("a call that fits, behind a waiting larger one: %v", err)
	}
	r1()
	if err := <-got; err != nil {
		t.Fatalf("the larger one after a release: %v", err)
	}
	r2()
	r2() // a second release frees nothing more
	if _, err := g.Take(small, "after", 100); err != nil {
		t.Fatalf("after every release: %v", err)
	}
}

// A cancelled caller stops waiting at once with its context's error, and
// takes no room.
func TestBulkGateCancel(t *testing.T) {
	g := NewBulkGate(100, 10*time.Second)
	r, err := g.Take(context.Background(), "a", 100)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	got := make(chan error, 1)
	go func() {
		_, err := g.Take(ctx, "b", 1)
		got <- err
	}()
	cancel()
	if err := <-got; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled while waiting: %v", err)
	}
	r()
	r, err = g.Take(context.Background(), "c", 100)
	if err != nil {
		t.Fatalf("after the cancelled wait: %v", err)
	}
	r()
}

// Many callers taking and releasing at once never hold more than the
// total, and each waiter is woken by the releases it waits for: a lost
// wakeup would leave one waiting until the gate's wait refuses it.
func TestBulkGateUnderLoad(t *testing.T) {
	const total = 100
	g := NewBulkGate(total, 10*time.Second)
	var held atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range 300 {
				n := int64((i*37+j*11)%total + 1)
				r, err := g.Take(context.Background(), "load", n)
				if err != nil {
					errs <- err
					return
				}
				if h := held.Add(n); h > total {
					errs <- fmt.Errorf("%d bytes held, over the total of %d", h, total)
				}
				runtime.Gosched()
				held.Add(-n)
				r()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// Room taken with TakeUntilSent under HoldUntilServed is held until the
// HTTP handler returns (connect-go writes a unary answer after the
// procedure returns), though the procedure "releases" it before; called
// directly, without the holder, the release frees it.
func TestTakeUntilSent(t *testing.T) {
	g := NewBulkGate(100, 50*time.Millisecond)
	free := func() bool {
		r, err := g.Take(context.Background(), "probe", 100)
		if err != nil {
			return false
		}
		r()
		return true
	}
	var heldAfterRelease bool
	h := HoldUntilServed(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		release, err := g.TakeUntilSent(r.Context(), "read_file", 60)
		if err != nil {
			t.Error(err)
			return
		}
		release()
		heldAfterRelease = !free()
	}))
	h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("POST", "/", nil))
	if !heldAfterRelease {
		t.Error("the room was given back before the handler returned")
	}
	if !free() {
		t.Error("the room is still held after the handler returned")
	}
	release, err := g.TakeUntilSent(context.Background(), "direct", 60)
	if err != nil {
		t.Fatal(err)
	}
	release()
	if !free() {
		t.Error("without HoldUntilServed, the release did not free the room")
	}
}
