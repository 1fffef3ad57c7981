package scheduler

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	fsmv1 "github.com/warrenhq/warren/api/gen/warren/fsm/v1"
)

// fakeStart records each batch and holds it until released (a simulated
// commit, standing in for raft or the leader).
type fakeStart struct {
	mu      sync.Mutex
	batches [][][]byte
	release chan struct{}
}

func (f *fakeStart) start(cmds [][]byte) func() ([]*fsmv1.Result, uint64, error) {
	f.mu.Lock()
	f.batches = append(f.batches, cmds)
	idx := uint64(len(f.batches))
	f.mu.Unlock()
	return func() ([]*fsmv1.Result, uint64, error) {
		<-f.release
		res := make([]*fsmv1.Result, len(cmds))
		for i, c := range cmds {
			res[i] = &fsmv1.Result{Message: string(c)}
		}
		return res, idx, nil
	}
}

func (f *fakeStart) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.batches)
}

func TestGroupCommitBatchesWhileSlotsAreBusy(t *testing.T) {
	f := &fakeStart{release: make(chan struct{})}
	g := newGroupCommit(f.start, 1, 100, 1<<20)
	defer g.close()
	ctx := context.Background()
	var wg sync.WaitGroup
	results := make([][]*fsmv1.Result, 11)
	propose := func(i int, cmd string) {
		defer wg.Done()
		res, _, err := g.propose(ctx, [][]byte{[]byte(cmd)})
		if err != nil {
			t.Error(err)
		}
		results[i] = res
	}
	wg.Add(1)
	go propose(0, "first")
	waitFor(t, "first batch", 5*time.Second, func() bool { return f.count() == 1 })
	// The only slot is busy: these queue and must go out as one batch.
	for i := 1; i <= 10; i++ {
		wg.Add(1)
		go propose(i, string(rune('a'+i)))
	}
	waitFor(t, "queued proposals", 5*time.Second, func() bool { return len(g.in) == 10 })
	close(f.release)
	wg.Wait()
	if f.count() != 2 || len(f.batches[1]) != 10 {
		t.Fatalf("batches = %d, second holds %d commands; want 2 and 10", f.count(), len(f.batches[1]))
	}
	for i := 1; i <= 10; i++ {
		if len(results[i]) != 1 || results[i][0].GetMessage() != string(rune('a'+i)) {
			t.Fatalf("proposal %d got %v", i, results[i])
		}
	}
}

func TestGroupCommitRespectsByteLimit(t *testing.T) {
	f := &fakeStart{release: make(chan struct{})}
	g := newGroupCommit(f.start, 1, 100, 10)
	defer g.close()
	// Fill the queue before the loop can take anything: a first proposal
	// holds the only slot until release closes.
	holdSlot(t, g, f)
	type out struct {
		res []*fsmv1.Result
		err error
	}
	outs := make(chan out, 3)
	for i, c := range []string{"aaaaaa", "bbbbbb", "cc"} {
		go func() {
			res, _, err := g.propose(context.Background(), [][]byte{[]byte(c)})
			outs <- out{res, err}
		}()
		waitFor(t, "queued in order", 5*time.Second, func() bool { return len(g.in) == i+1 })
	}
	close(f.release)
	for i := 0; i < 3; i++ {
		if o := <-outs; o.err != nil {
			t.Fatal(o.err)
		}
	}
	for i, b := range f.batches {
		if cmdBytes(b) > 10 {
			t.Fatalf("batch %d has %d bytes, over the 10-byte limit", i, cmdBytes(b))
		}
	}
	// The holder, then 6 bytes, then 6+2.
	if f.count() != 3 || len(f.batches[1]) != 1 || len(f.batches[2]) != 2 {
		t.Fatalf("batches = %v, want [hold] [aaaaaa] [bbbbbb cc]", f.batches)
	}
}

func TestGroupCommitCloseFailsQueued(t *testing.T) {
	f := &fakeStart{release: make(chan struct{})}
	g := newGroupCommit(f.start, 1, 100, 1<<20)
	defer close(f.release)
	holdSlot(t, g, f) // the loop can take nothing more
	errc := make(chan error, 1)
	go func() {
		_, _, err := g.propose(context.Background(), [][]byte{[]byte("x")})
		errc <- err
	}()
	waitFor(t, "queued", 5*time.Second, func() bool { return len(g.in) == 1 })
	g.close()
	if err := <-errc; !errors.Is(err, errProposalAborted) {
		t.Fatalf("err = %v, want errProposalAborted", err)
	}
}

// A propose after close fails at once. (It chose at random between the
// queue, which has room after close, and done: about half were queued
// where no one reads, and waited for their context, forever for
// context.Background.)
func TestGroupCommitProposeAfterCloseFails(t *testing.T) {
	f := &fakeStart{release: make(chan struct{})}
	close(f.release)
	g := newGroupCommit(f.start, 1, 100, 1<<20)
	g.close()
	for i := 0; i < 50; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, _, err := g.propose(ctx, [][]byte{[]byte("x")})
		cancel()
		if !errors.Is(err, errProposalAborted) {
			t.Fatalf("propose %d after close: %v, want errProposalAborted", i, err)
		}
	}
}

// holdSlot proposes one command and waits until it is in flight, so that it
// holds a slot until f.release closes. (Sending into g.slots from the test
// would race with the loop, which takes a slot before it reads the queue.)
func holdSlot(t *testing.T, g *groupCommit, f *fakeStart) {
	t.Helper()
	go g.propose(context.Background(), [][]byte{[]byte("h")})
	waitFor(t, "holder in flight", 5*time.Second, func() bool { return f.count() == 1 })
}
