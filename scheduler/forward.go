package scheduler

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"connectrpc.com/connect"
	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/proto"

	"github.com/warrenhq/warren/api"
	fsmv1 "github.com/warrenhq/warren/api/gen/warren/fsm/v1"
	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
	"github.com/warrenhq/warren/api/gen/warren/v1/warrenv1connect"
)

// errNoLeader means no leader is known right now; the write is retried.
var errNoLeader = errors.New("no leader elected")

// forwarder sends writes from a follower to the leader's API.
type forwarder struct {
	s    *Server
	http *http.Client
	mu   sync.Mutex
	conn map[string]warrenv1connect.ClusterServiceClient
}

func newForwarder(s *Server) *forwarder {
	return &forwarder{
		s: s,
		http: &http.Client{Transport: &http.Transport{
			MaxIdleConnsPerHost: 256,
			IdleConnTimeout:     90 * time.Second,
		}},
		conn: map[string]warrenv1connect.ClusterServiceClient{},
	}
}

func (f *forwarder) client(url string) warrenv1connect.ClusterServiceClient {
	f.mu.Lock()
	defer f.mu.Unlock()
	c, ok := f.conn[url]
	if !ok {
		c = warrenv1connect.NewClusterServiceClient(f.http, url, connect.WithCompressMinBytes(compressMinBytes))
		f.conn[url] = c
	}
	return c
}

func (f *forwarder) join(ctx context.Context, url string) error {
	_, err := f.client(url).Join(ctx, connect.NewRequest(&warrenv1.JoinRequest{
		Id: f.s.cfg.ID, RaftAddress: f.s.cfg.RaftAddr, ApiUrl: f.s.cfg.APIURL,
	}))
	return err
}

// leaderURL returns the API URL of the current leader.
func (s *Server) leaderURL() (string, error) {
	_, id := s.raft.LeaderWithID()
	if id == "" {
		return "", errNoLeader
	}
	m, err := s.fsm.Member(string(id))
	if err != nil {
		return "", fmt.Errorf("leader %s has no recorded address yet: %w", id, errNoLeader)
	}
	return m.GetApiUrl(), nil
}

// nameLeader sets api.LeaderHeader on a write's response when this server
// is not the leader (so it forwarded the write) and knows who is.
func (s *Server) nameLeader(h http.Header) {
	if s.raft.State() == raft.Leader {
		return
	}
	if url, err := s.leaderURL(); err == nil && url != s.cfg.APIURL {
		h.Set(api.LeaderHeader, url)
	}
}

// propose commits commands through raft, from any server: on the leader it
// goes through group commit, on a follower it is forwarded. Transient
// failures (no leader, leadership lost) are retried until ctx ends; every
// write command carries a request id, so a retry never applies twice. On
// return the local replica has applied the commands (read-your-writes), or
// at least tried to for a bounded time.
func (s *Server) propose(ctx context.Context, msgs ...proto.Message) ([]*fsmv1.Result, error) {
	cmds := make([][]byte, len(msgs))
	for i, m := range msgs {
		b, err := EncodeCommand(m)
		if err != nil {
			return nil, err
		}
		cmds[i] = b
	}
	backoff := 20 * time.Millisecond
	for {
		res, idx, err := s.proposeOnce(ctx, cmds)
		if err == nil {
			wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			_ = s.fsm.WaitApplied(wctx, idx)
			cancel()
			return res, nil
		}
		// A leader that dies mid-call can surface as Canceled although our
		// caller did not cancel: that, too, is worth another try.
		if !retryable(err) && (ctx.Err() != nil || connect.CodeOf(err) != connect.CodeCanceled) {
			return nil, err
		}
		s.log.Debug("write not committed yet; retrying", "err", err)
		select {
		case <-ctx.Done():
			return nil, connect.NewError(connect.CodeUnavailable, fmt.Errorf("write not committed before deadline: %w (last error: %v)", ctx.Err(), err))
		case <-s.stop:
			return nil, connect.NewError(connect.CodeUnavailable, errProposalAborted)
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 500*time.Millisecond)
	}
}

func (s *Server) proposeOnce(ctx context.Context, cmds [][]byte) ([]*fsmv1.Result, uint64, error) {
	if s.raft.State() == raft.Leader {
		return s.gc.propose(ctx, cmds)
	}
	return s.fgc.propose(ctx, cmds)
}

// start forwards one batch of commands to the leader (a startFunc for the
// follower's group commit).
func (f *forwarder) start(cmds [][]byte) func() ([]*fsmv1.Result, uint64, error) {
	type outcome struct {
		res []*fsmv1.Result
		idx uint64
		err error
	}
	ch := make(chan outcome, 1)
	go func() {
		res, idx, err := f.forward(cmds)
		ch <- outcome{res, idx, err}
	}()
	return func() ([]*fsmv1.Result, uint64, error) {
		o := <-ch
		return o.res, o.idx, o.err
	}
}

func (f *forwarder) forward(cmds [][]byte) ([]*fsmv1.Result, uint64, error) {
	url, err := f.s.leaderURL()
	if err != nil {
		return nil, 0, err
	}
	if url == f.s.cfg.APIURL {
		return nil, 0, errNoLeader // stale view of ourselves as leader
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := f.client(url).Propose(ctx, connect.NewRequest(&warrenv1.ProposeRequest{Commands: cmds}))
	if err != nil {
		return nil, 0, forwardFailure(ctx, err)
	}
	out := make([]*fsmv1.Result, len(resp.Msg.GetResults()))
	for i, b := range resp.Msg.GetResults() {
		out[i] = &fsmv1.Result{}
		if err := proto.Unmarshal(b, out[i]); err != nil {
			return nil, 0, fmt.Errorf("leader result %d: %w", i, err)
		}
	}
	if len(out) != len(cmds) {
		return nil, 0, fmt.Errorf("leader returned %d results for %d commands", len(out), len(cmds))
	}
	return out, resp.Msg.GetIndex(), nil
}

// proposeLocal proposes on this server only (no forwarding, no retry).
func (s *Server) proposeLocal(ctx context.Context, m proto.Message) (*fsmv1.Result, uint64, error) {
	b, err := EncodeCommand(m)
	if err != nil {
		return nil, 0, err
	}
	res, idx, err := s.gc.propose(ctx, [][]byte{b})
	if err != nil {
		return nil, 0, err
	}
	return res[0], idx, nil
}

// retryable reports whether a write failed before commit in a way that a
// retry (possibly on a new leader) can fix.
// forwardFailure is a failed forward's error. One that ran out of the
// forward's own time (ctx), not a caller's deadline, is unavailable: the
// batch's callers retry it (their commands carry request ids, so one the
// leader did commit is not applied twice). As deadline_exceeded it failed
// every caller in the batch at once.
func forwardFailure(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return connect.NewError(connect.CodeUnavailable, fmt.Errorf("the leader did not answer a forwarded write in time: %w", err))
	}
	return err
}

func retryable(err error) bool {
	switch {
	case errors.Is(err, errNoLeader),
		errors.Is(err, raft.ErrNotLeader),
		errors.Is(err, raft.ErrLeadershipLost),
		errors.Is(err, raft.ErrLeadershipTransferInProgress),
		errors.Is(err, raft.ErrEnqueueTimeout),
		errors.Is(err, raft.ErrAbortedByRestore):
		return true
	}
	var ce *connect.Error
	if errors.As(err, &ce) {
		switch ce.Code() {
		case connect.CodeUnavailable, connect.CodeAborted:
			return true
		case connect.CodeUnknown:
			// A transport failure (leader died mid-response) surfaces here.
			return true
		}
	}
	return false
}

// catchUpWait bounds how long a follower's read of a task it does not
// have waits to apply what the leader has.
const catchUpWait = 2 * time.Second

// readTask reads a task for a read by id (GetTask, ListEvents,
// StreamEvents, the SSE gateway). Reads are served by the local replica,
// and a follower may not have applied yet a task another server has
// acknowledged: one created through the leader a moment ago. So before a
// follower answers not_found, it asks the leader how far its state
// machine has applied, waits (at most catchUpWait) until it has applied as
// far, and reads again. A task no server has (a mistyped id) costs that
// one call to the leader.
func (s *Server) readTask(ctx context.Context, id string) (*warrenv1.Task, error) {
	check := s.readGuard()
	t, err := s.fsm.Task(id)
	if cerr := check(); cerr != nil {
		return nil, cerr
	}
	if !errors.Is(err, ErrNotFound) {
		return t, err
	}
	// Not here: a definite answer only once this replica has applied
	// everything the cluster acknowledged. A leader has once its term's
	// first entry is applied (entries an earlier leader committed come
	// before it); a follower, once it has caught up with the leader. One
	// that cannot tell (no leader during an election, a leader not yet
	// caught up) answers unavailable, which clients retry, rather than a
	// not_found they would take as final.
	var sure bool
	if s.raft.State() == raft.Leader {
		sure = s.leaderCaughtUp()
	} else {
		sure = s.catchUp(ctx)
	}
	check = s.readGuard()
	t, err = s.fsm.Task(id) // it may have been applied meanwhile, waited for or not
	if cerr := check(); cerr != nil {
		return nil, cerr
	}
	if errors.Is(err, ErrNotFound) && !sure {
		return nil, errNotSure
	}
	return t, err
}

// errNotSure answers a read of a task this replica does not have when it
// cannot tell whether the cluster has it (see readTask).
var errNotSure = connect.NewError(connect.CodeUnavailable, errors.New("this server does not have the task and cannot confirm with a leader that the cluster has none (an election may be under way); retry, or ask another server"))

// leaderCaughtUp reports whether this leader's state machine has applied
// every entry committed before its term (after a barrier, once a term).
func (s *Server) leaderCaughtUp() bool {
	term := s.raft.CurrentTerm()
	if s.caughtUpTerm.Load() == term {
		return true
	}
	if err := s.raft.Barrier(catchUpWait).Error(); err != nil {
		s.log.Debug("barrier before a read", "err", err)
		return false
	}
	s.caughtUpTerm.Store(term)
	return true
}

// readNodes lists the node records for an API read, guarded like a task
// read (readGuard): a snapshot restore empties the FSM's keyspace before it
// copies the snapshot back, so a list read during one (or after one that
// failed midway) could be partial, or empty, with no error.
func (s *Server) readNodes() ([]*warrenv1.Node, error) {
	check := s.readGuard()
	nodes, err := s.fsm.Nodes()
	if cerr := check(); cerr != nil {
		return nil, cerr
	}
	return nodes, err
}

// errRestoring answers a read that a snapshot restore overlapped.
var errRestoring = connect.NewError(connect.CodeUnavailable, errors.New("this server was installing a snapshot of the cluster's state during the read; retry, or ask another server"))

// readGuard starts a read of the local replica; the check it returns
// reports errRestoring if a snapshot restore ran during the read (which
// could then have found tasks missing, or old), else nil. Clients retry
// unavailable (client.Watch fails over to the next server).
func (s *Server) readGuard() func() error {
	g := s.fsm.restores.Load()
	return func() error {
		if g%2 == 1 || s.fsm.restores.Load() != g {
			return errRestoring
		}
		return nil
	}
}

// catchUp waits until this replica has applied what the leader had
// applied when asked; it reports whether it has.
func (s *Server) catchUp(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, catchUpWait)
	defer cancel()
	url, err := s.leaderURL()
	if err != nil || url == s.cfg.APIURL {
		return false
	}
	resp, err := s.fwd.client(url).Status(ctx, connect.NewRequest(&warrenv1.StatusRequest{}))
	if err != nil {
		s.log.Debug("catch up with the leader before a read", "err", err)
		return false
	}
	// The leader's state machine's index, not its commit index: the
	// commit index may be a leader's no-op, an entry no state machine
	// sees, so this replica's index might not reach it for a while.
	return s.fsm.WaitApplied(ctx, resp.Msg.GetFsmAppliedIndex()) == nil
}

// checkResume checks a stream's resume point (after_seq, Last-Event-ID)
// against task t as read here. One past a live task's last event names an
// event no server has given (a client's bookkeeping bug, or an id of
// another task), and tailing from it would skip every event up to it
// without a word: it is refused, out_of_range. (An ended task's stream
// has nothing more to skip; past its end it just ends, and the SSE
// gateway answers 204 so that an EventSource stops reconnecting.)
//
// A replica may lag the one that gave the client its last event, so
// before refusing, a follower catches up with the leader, and any server
// waits up to catchUpWait for the task to reach the point. A follower
// that cannot reach a leader (an election under way) cannot be sure and
// refuses nothing: the stream waits for the point, as it always did. It
// returns the task as last read.
func (s *Server) checkResume(ctx context.Context, t *warrenv1.Task, after uint64) (*warrenv1.Task, error) {
	if after < t.GetNextSeq() || Terminal(t.GetState()) {
		return t, nil
	}
	id := t.GetId()
	if s.raft.State() == raft.Leader {
		if !s.leaderCaughtUp() {
			// A new leader still applying what it committed before: as
			// unsure as a follower without a leader.
			return t, nil
		}
	} else if !s.catchUp(ctx) {
		// No leader to ask (an election, a partition): this replica may
		// just lag, so the stream waits for the point, as it always has.
		return t, nil
	}
	wctx, cancel := context.WithTimeout(ctx, catchUpWait)
	defer cancel()
	for {
		wake, release := s.fsm.WatchTask(id)
		check := s.readGuard()
		cur, err := s.fsm.Task(id)
		if err = cmp.Or(check(), err); err != nil {
			release()
			return nil, err
		}
		if after < cur.GetNextSeq() || Terminal(cur.GetState()) {
			release()
			return cur, nil
		}
		select {
		case <-wake:
			release()
			continue
		case <-wctx.Done():
		case <-s.stop:
			release()
			return nil, connect.NewError(connect.CodeUnavailable, errors.New("server shutting down; reconnect with after_seq"))
		}
		release()
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		return nil, connect.NewError(connect.CodeOutOfRange, fmt.Errorf("after_seq %d: past task %s's last event (seq %d)", after, id, cur.GetNextSeq()-1))
	}
}
