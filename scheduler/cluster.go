package scheduler

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"connectrpc.com/connect"
	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/proto"

	fsmv1 "github.com/warrenhq/warren/api/gen/warren/fsm/v1"
	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
	"github.com/warrenhq/warren/api/gen/warren/v1/warrenv1connect"
	"github.com/warrenhq/warren/internal/reqbound"
)

// clusterAPI implements warrenv1connect.ClusterServiceHandler.
type clusterAPI struct{ s *Server }

var _ warrenv1connect.ClusterServiceHandler = clusterAPI{}

// Status reports this server's view of the cluster.
func (c clusterAPI) Status(ctx context.Context, _ *connect.Request[warrenv1.StatusRequest]) (*connect.Response[warrenv1.StatusResponse], error) {
	if c.s.raft.State() == raft.Leader {
		// A follower's read waits for this fsm_applied_index (catchUp):
		// a new leader's must cover what earlier leaders committed.
		c.s.leaderCaughtUp()
	}
	return connect.NewResponse(c.s.Status()), nil
}

// Status reports this server's view of the cluster.
func (s *Server) Status() *warrenv1.StatusResponse {
	st := s.raft.Stats()
	u := func(k string) uint64 { v, _ := strconv.ParseUint(st[k], 10, 64); return v }
	_, leaderID := s.raft.LeaderWithID()
	out := &warrenv1.StatusResponse{
		ServerId:          s.cfg.ID,
		RaftState:         map[raft.RaftState]string{raft.Leader: "leader", raft.Follower: "follower", raft.Candidate: "candidate", raft.Shutdown: "shutdown"}[s.raft.State()],
		LeaderId:          string(leaderID),
		Term:              u("term"),
		LastLogIndex:      u("last_log_index"),
		CommitIndex:       u("commit_index"),
		AppliedIndex:      u("applied_index"),
		LastSnapshotIndex: u("last_snapshot_index"),
		FsmAppliedIndex:   s.fsm.Applied(),
		NodeSessions:      uint32(s.sess.count()),
	}
	out.AppliedEntries, out.AppliedCommands, out.CommandsPerEntry = s.fsm.ApplyStats()
	if leaderID != "" {
		if m, err := s.fsm.Member(string(leaderID)); err == nil {
			out.LeaderApiUrl = m.GetApiUrl()
		}
	}
	if f := s.raft.GetConfiguration(); f.Error() == nil {
		for _, srv := range f.Configuration().Servers {
			p := &warrenv1.Peer{
				Id:          string(srv.ID),
				RaftAddress: string(srv.Address),
				Suffrage:    map[raft.ServerSuffrage]string{raft.Voter: "voter", raft.Nonvoter: "nonvoter", raft.Staging: "staging"}[srv.Suffrage],
				Leader:      srv.ID == leaderID,
			}
			if m, err := s.fsm.Member(string(srv.ID)); err == nil {
				p.ApiUrl = m.GetApiUrl()
			}
			out.Peers = append(out.Peers, p)
		}
	}
	return out
}

// Join adds a voter. A follower forwards the request to the leader.
func (c clusterAPI) Join(ctx context.Context, req *connect.Request[warrenv1.JoinRequest]) (*connect.Response[warrenv1.JoinResponse], error) {
	var p problems
	p.text("id", req.Msg.GetId(), true, 128, true)
	p.text("raft_address", req.Msg.GetRaftAddress(), true, 256, true)
	p.text("api_url", req.Msg.GetApiUrl(), true, 2048, true)
	if err := p.err(); err != nil {
		return nil, invalid(err)
	}
	if c.s.raft.State() != raft.Leader {
		url, err := c.s.leaderURL()
		if err != nil {
			return nil, connect.NewError(connect.CodeUnavailable, err)
		}
		_, err = c.s.fwd.client(url).Join(ctx, req)
		if err != nil {
			return nil, err
		}
		return connect.NewResponse(&warrenv1.JoinResponse{}), nil
	}
	id, addr := req.Msg.GetId(), req.Msg.GetRaftAddress()
	// A voter counts towards the quorum whether the leader reaches it or
	// not: add only one that answers. Unavailable when it does not answer
	// (the joiner may still be starting, or a firewall be opened; it keeps
	// trying and logs each refusal), failed_precondition when something
	// else answers there.
	if err := c.s.probeRaft(ctx, id, addr); err != nil {
		code := connect.CodeFailedPrecondition
		if errors.Is(err, errUnreachable) {
			code = connect.CodeUnavailable
		}
		c.s.log.Warn("refused join", "peer", id, "raft", addr, "err", err)
		return nil, connect.NewError(code, fmt.Errorf("raft_address %q of server %s: %w", addr, id, err))
	}
	// AddVoter on a known id moves it to the new address. That is how a
	// dead server is replaced, or a restarted one moved; but while the old
	// address still answers as that server, the joiner is a second machine
	// given the same id and would take the live server's place.
	if old, ok := c.s.raftAddrOf(id); ok && old != addr {
		if c.s.probeRaft(ctx, id, old) == nil {
			return nil, connect.NewError(connect.CodeAlreadyExists, fmt.Errorf(
				"id %q is in the cluster already, at raft address %s, which still answers as %s; this server is at %s: give it another id, or stop the other first",
				id, old, id, addr))
		}
		c.s.log.Warn("moving voter: its old raft address does not answer", "peer", id, "old", old, "raft", addr)
	}
	if err := c.s.addVoter(ctx, id, addr, req.Msg.GetApiUrl()); err != nil {
		return nil, fmt.Errorf("add voter %s: %w", id, err)
	}
	c.s.log.Info("added voter", "peer", id, "raft", addr)
	return connect.NewResponse(&warrenv1.JoinResponse{}), nil
}

// Snapshot takes a snapshot on this server, compacting its log.
func (c clusterAPI) Snapshot(ctx context.Context, _ *connect.Request[warrenv1.SnapshotRequest]) (*connect.Response[warrenv1.SnapshotResponse], error) {
	f := c.s.raft.Snapshot()
	if err := f.Error(); err != nil && !errors.Is(err, raft.ErrNothingNewToSnapshot) {
		return nil, fmt.Errorf("snapshot: %w", err)
	}
	idx, _ := strconv.ParseUint(c.s.raft.Stats()["last_snapshot_index"], 10, 64)
	return connect.NewResponse(&warrenv1.SnapshotResponse{Index: idx}), nil
}

// Propose applies commands forwarded by a follower. Only the leader
// accepts them; it never forwards again, so there are no loops.
//
// A follower's group commit joins the commands of unrelated callers into
// one call, so a command refused here (one that does not decode, or that
// validateForwarded refuses) gets its own failed result, with code
// invalid_argument, and the others are proposed without it: one bad
// command never fails the writes that happened to share its batch. The
// results come back in the order of the commands, one each.
func (c clusterAPI) Propose(ctx context.Context, req *connect.Request[warrenv1.ProposeRequest]) (*connect.Response[warrenv1.ProposeResponse], error) {
	cmds := req.Msg.GetCommands()
	if len(cmds) == 0 {
		return nil, invalid(errors.New("commands: required"))
	}
	res := make([]*fsmv1.Result, len(cmds))
	good := make([][]byte, 0, len(cmds))
	for i, b := range cmds {
		if err := checkForwarded(b); err != nil {
			res[i] = &fsmv1.Result{Code: uint32(connect.CodeInvalidArgument), Message: "the leader refused this forwarded command: " + err.Error()}
			continue
		}
		good = append(good, b)
	}
	if c.s.raft.State() != raft.Leader {
		return nil, connect.NewError(connect.CodeUnavailable, raft.ErrNotLeader)
	}
	var idx uint64
	if len(good) > 0 {
		applied, i, err := c.s.gc.propose(ctx, good)
		if err != nil {
			return nil, err
		}
		if len(applied) != len(good) {
			return nil, fmt.Errorf("group commit returned %d results for %d commands", len(applied), len(good))
		}
		idx = i
		k := 0
		for j := range res {
			if res[j] == nil {
				res[j] = applied[k]
				k++
			}
		}
	} else {
		// Nothing to apply: the index the caller waits for before it reads
		// is one this server has applied already.
		idx = c.s.fsm.Applied()
	}
	out := &warrenv1.ProposeResponse{Index: idx, Results: make([][]byte, len(res))}
	for i, r := range res {
		var err error
		if out.Results[i], err = proto.Marshal(r); err != nil {
			return nil, err
		}
	}
	return connect.NewResponse(out), nil
}

// checkForwarded decodes one command a follower forwarded and checks it.
// The FSM trusts what it applies (it does not scan an append's payloads
// again, for one): what a follower forwards is checked here.
func checkForwarded(b []byte) error {
	if len(b) > reqbound.ScanAbove {
		if body := newBody(CmdType(b[0])); body != nil {
			if err := checkEntries(b[1:], body.ProtoReflect().Descriptor()); err != nil {
				return err
			}
		}
	}
	cmd, err := DecodeCommand(b)
	if err != nil {
		return err
	}
	return validateForwarded(cmd)
}
