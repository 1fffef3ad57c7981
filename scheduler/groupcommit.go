package scheduler

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hashicorp/raft"

	fsmv1 "github.com/warrenhq/warren/api/gen/warren/fsm/v1"
)

// groupCommit batches commands from concurrent callers into raft entries:
// it keeps at most `slots` entries in flight, and while they are, new
// proposals queue up and go out together in the next entry. Throughput
// therefore grows with concurrency while a lone writer still waits for only
// one round trip.
type groupCommit struct {
	raft     *raft.Raft
	in       chan *proposal
	slots    chan struct{}
	maxCmds  int
	maxBytes int
	done     chan struct{}
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

func newGroupCommit(r *raft.Raft, inflight, maxCmds, maxBytes int) *groupCommit {
	g := &groupCommit{
		raft:     r,
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
	}
}

func (g *groupCommit) run() {
	for {
		select {
		case g.slots <- struct{}{}:
		case <-g.done:
			g.drainAborted()
			return
		}
		var first *proposal
		select {
		case first = <-g.in:
		case <-g.done:
			g.drainAborted()
			return
		}
		batch := []*proposal{first}
		n, size := len(first.cmds), cmdBytes(first.cmds)
	fill:
		for n < g.maxCmds && size < g.maxBytes {
			select {
			case p := <-g.in:
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
		f := g.raft.Apply(encodeBatch(all), 5*time.Second)
		go g.finish(f, batch)
	}
}

func (g *groupCommit) finish(f raft.ApplyFuture, batch []*proposal) {
	defer func() { <-g.slots }()
	if err := f.Error(); err != nil {
		for _, p := range batch {
			p.out <- proposalResult{err: err}
		}
		return
	}
	res, ok := f.Response().([]*fsmv1.Result)
	if !ok {
		err := fmt.Errorf("apply returned %T", f.Response())
		for _, p := range batch {
			p.out <- proposalResult{err: err}
		}
		return
	}
	off := 0
	for _, p := range batch {
		p.out <- proposalResult{results: res[off : off+len(p.cmds)], index: f.Index()}
		off += len(p.cmds)
	}
}

func (g *groupCommit) drainAborted() {
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
