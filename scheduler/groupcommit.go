package scheduler

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hashicorp/raft"

	fsmv1 "github.com/warrenhq/warren/api/gen/warren/fsm/v1"
)

// groupCommit batches commands from concurrent callers: it keeps at most
// `slots` batches in flight, and while they are, new proposals queue up and
// go out together in the next batch. Throughput therefore grows with
// concurrency while a lone writer still waits for only one round trip. The
// leader sends batches into raft as one entry each; a follower sends them to
// the leader as one Propose call each.
type groupCommit struct {
	start    startFunc
	in       chan *proposal
	slots    chan struct{}
	maxCmds  int
	maxBytes int
	done     chan struct{}
}

// startFunc starts committing a batch of encoded commands and returns a
// function that waits for the outcome: one result per command, in order,
// and the raft index they were applied at. It is called from one goroutine,
// in batch order; the wait functions run concurrently.
type startFunc func(cmds [][]byte) (wait func() ([]*fsmv1.Result, uint64, error))

// raftStart commits a batch as one raft entry (leader only).
func raftStart(r *raft.Raft) startFunc {
	return func(cmds [][]byte) func() ([]*fsmv1.Result, uint64, error) {
		f := r.Apply(encodeBatch(cmds), 5*time.Second)
		return func() ([]*fsmv1.Result, uint64, error) {
			if err := f.Error(); err != nil {
				return nil, 0, err
			}
			res, ok := f.Response().([]*fsmv1.Result)
			if !ok || len(res) != len(cmds) {
				return nil, 0, fmt.Errorf("apply returned %T for %d commands", f.Response(), len(cmds))
			}
			return res, f.Index(), nil
		}
	}
}

type proposal struct {
	cmds [][]byte
	out  chan proposalResult // buffered, receives exactly once
}

type proposalResult struct {
	results []*fsmv1.Result
	index   uint64
	err     error
}

// errProposalAborted is returned to proposals still queued at shutdown.
var errProposalAborted = errors.New("server shutting down")

func newGroupCommit(start startFunc, inflight, maxCmds, maxBytes int) *groupCommit {
	g := &groupCommit{
		start:    start,
		in:       make(chan *proposal, 8192),
		slots:    make(chan struct{}, inflight),
		maxCmds:  maxCmds,
		maxBytes: maxBytes,
		done:     make(chan struct{}),
	}
	go g.run()
	return g
}

func (g *groupCommit) close() { close(g.done) }

// propose submits encoded commands and waits for them to be applied. The
// returned results are in the order of cmds.
func (g *groupCommit) propose(ctx context.Context, cmds [][]byte) ([]*fsmv1.Result, uint64, error) {
	p := &proposal{cmds: cmds, out: make(chan proposalResult, 1)}
	// Closed first: the queue has room after close too, and a select
	// between it and done would queue about half the late proposals
	// where no one reads them.
	select {
	case <-g.done:
		return nil, 0, errProposalAborted
	default:
	}
	select {
	case g.in <- p:
	case <-ctx.Done():
		return nil, 0, ctx.Err()
	case <-g.done:
		return nil, 0, errProposalAborted
	}
	select {
	case r := <-p.out:
		return r.results, r.index, r.err
	case <-ctx.Done():
		// The entry may still commit; callers retry with the same request
		// id, so a late commit is not applied twice.
		return nil, 0, ctx.Err()
	case <-g.done:
		// run may be gone, with p queued after its last look at the
		// queue. A result already given still counts.
		select {
		case r := <-p.out:
			return r.results, r.index, r.err
		default:
			return nil, 0, errProposalAborted
		}
	}
}

func (g *groupCommit) run() {
	// carry is a proposal taken from the queue that did not fit into the
	// previous batch; it opens the next one. A batch therefore exceeds
	// maxBytes only when its first proposal alone does.
	var carry *proposal
	for {
		select {
		case g.slots <- struct{}{}:
		case <-g.done:
			g.abort(carry)
			return
		}
		first := carry
		carry = nil
		if first == nil {
			select {
			case first = <-g.in:
			case <-g.done:
				g.abort(nil)
				return
			}
		}
		batch := []*proposal{first}
		n, size := len(first.cmds), cmdBytes(first.cmds)
	fill:
		for n < g.maxCmds && size < g.maxBytes {
			select {
			case p := <-g.in:
				if size+cmdBytes(p.cmds) > g.maxBytes || n+len(p.cmds) > g.maxCmds {
					carry = p
					break fill
				}
				batch = append(batch, p)
				n += len(p.cmds)
				size += cmdBytes(p.cmds)
			default:
				break fill
			}
		}
		all := make([][]byte, 0, n)
		for _, p := range batch {
			all = append(all, p.cmds...)
		}
		go g.finish(g.start(all), batch)
	}
}

func (g *groupCommit) finish(wait func() ([]*fsmv1.Result, uint64, error), batch []*proposal) {
	defer func() { <-g.slots }()
	res, index, err := wait()
	if err != nil {
		for _, p := range batch {
			p.out <- proposalResult{err: err}
		}
		return
	}
	off := 0
	for _, p := range batch {
		p.out <- proposalResult{results: res[off : off+len(p.cmds)], index: index}
		off += len(p.cmds)
	}
}

// abort fails the carried proposal and every queued one.
func (g *groupCommit) abort(carry *proposal) {
	if carry != nil {
		carry.out <- proposalResult{err: errProposalAborted}
	}
	for {
		select {
		case p := <-g.in:
			p.out <- proposalResult{err: errProposalAborted}
		default:
			return
		}
	}
}

func cmdBytes(cmds [][]byte) int {
	n := 0
	for _, c := range cmds {
		n += len(c)
	}
	return n
}
