package client

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"testing"
	"time"

	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
)

// The writers a returning call wakes queue their next appends a moment
// after its slot is free; gather must wait for them instead of sending a
// call of one append and leaving the rest for the next slot. One P stands
// for a busy machine, where the woken writers run only when gather yields
// (with an idle P they race gather, and a yield may bring none).
//
// The time bound is lifted here: on a loaded machine (CI runs packages in
// parallel) the OS can stop the thread for over a millisecond between two
// yields, and gather then rightly stops early; the yields are what this
// test is about.
func TestGatherTakesWritersWokenJustBefore(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	defer func(d time.Duration) { gatherFor = d }(gatherFor)
	gatherFor = time.Minute
	for round := range 20 {
		in := make(chan *pendingAppend, 1024)
		release := make(chan struct{})
		const writers = 64
		var blocked sync.WaitGroup
		for range writers {
			blocked.Add(1)
			go func() {
				blocked.Done()
				<-release
				in <- &pendingAppend{}
			}()
		}
		blocked.Wait()
		close(release) // as a call's outcomes wake its writers
		batch, _ := gather(&pendingAppend{}, in, 1024, maxCallBytes, true)
		if len(batch) != writers+1 {
			t.Fatalf("round %d: gathered %d appends of %d queued right after the call began", round, len(batch), writers+1)
		}
	}
}

func TestGatherBounds(t *testing.T) {
	in := make(chan *pendingAppend, 100)
	for range 100 {
		in <- &pendingAppend{}
	}
	if n := len(first(gather(&pendingAppend{}, in, 10, maxCallBytes, true))); n != 10 {
		t.Fatalf("gathered %d appends with a maximum of 10", n)
	}
	if len(in) != 91 {
		t.Fatalf("%d appends left queued, want 91", len(in))
	}
	empty := make(chan *pendingAppend)
	for _, busy := range []bool{false, true} {
		if n := len(first(gather(&pendingAppend{}, empty, 10, maxCallBytes, busy))); n != 1 {
			t.Fatalf("a lone append gathered %d (busy %v)", n, busy)
		}
	}
	// With nothing else in flight gather takes what is queued and does not
	// wait: one P, and the woken writer runs only if gather yields.
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	release := make(chan struct{})
	done := make(chan struct{})
	go func() {
		<-release
		empty <- &pendingAppend{}
		close(done)
	}()
	runtime.Gosched() // let it block on release
	close(release)
	if n := len(first(gather(&pendingAppend{}, empty, 10, maxCallBytes, false))); n != 1 {
		t.Fatalf("an idle appender waited for an append: gathered %d", n)
	}
	<-empty
	<-done
}

// An append queued after Close (it passed Append's check just before)
// ends with ErrAppenderClosed instead of waiting for its context: the
// queue has room after Close, and run, which drained it once, is gone.
func TestAppendQueuedAfterCloseEnds(t *testing.T) {
	c, err := New("http://127.0.0.1:1") // never dialled
	if err != nil {
		t.Fatal(err)
	}
	a := c.NewAppender(1, 8)
	a.Close()
	<-a.stopped
	for i := range 50 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		p := &pendingAppend{req: &warrenv1.AppendEventsRequest{TaskId: "x"}, out: make(chan appendOutcome, 1)}
		_, err := a.enqueue(ctx, p)
		cancel()
		if !errors.Is(err, ErrAppenderClosed) {
			t.Fatalf("append %d queued after close: %v, want ErrAppenderClosed", i, err)
		}
	}
}

func first[A, B any](a A, _ B) A { return a }

// gather ends a call before an append that would take it past its bytes,
// and hands that append back to open the next call; an append alone over
// the bound still goes, alone.
func TestGatherBoundsBytes(t *testing.T) {
	big := func() *pendingAppend {
		return &pendingAppend{req: &warrenv1.AppendEventsRequest{TaskId: "t", Events: []*warrenv1.EventInput{{Kind: "log", Payload: make([]byte, 60<<10)}}}}
	}
	in := make(chan *pendingAppend, 100)
	for range 99 {
		in <- big()
	}
	batch, carry := gather(big(), in, 1024, 1<<20, false)
	if size := len(batch) * appendBytes(big().req); size > 1<<20 || len(batch) < 10 {
		t.Fatalf("gathered %d appends (%d bytes) under a bound of 1 MiB", len(batch), size)
	}
	if carry == nil || len(in) != 99-len(batch) {
		t.Fatalf("carry %v, %d left queued after %d gathered", carry != nil, len(in), len(batch))
	}
	empty := make(chan *pendingAppend)
	if batch, carry := gather(big(), empty, 1024, 1000, true); len(batch) != 1 || carry != nil {
		t.Fatalf("an append over the bound alone: %d gathered, carry %v", len(batch), carry != nil)
	}
}
