package scheduler

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/types/known/timestamppb"

	fsmv1 "github.com/warrenhq/warren/api/gen/warren/fsm/v1"
	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
	"github.com/warrenhq/warren/api/gen/warren/v1/warrenv1connect"
)

// Liveness defaults.
const (
	DefaultNodeHeartbeat = 500 * time.Millisecond
	DefaultNodeTTL       = 3 * time.Second
)

// sessionQueue is the commands buffered per session before it is cut (a
// variable so that tests can shrink it).
var sessionQueue = 8192

// session is the leader's end of one node daemon's stream.
type session struct {
	node        string
	incarnation string
	out         chan *warrenv1.SessionResponse
	closed      chan struct{}
	closeOnce   sync.Once
	yielded     map[string]uint64 // task -> epoch asked to yield (drain); monitor goroutine only
	// warm is the node's ready warm sandboxes per template from its last
	// heartbeat (nil: none). Guarded by sessions.mu; the map itself is
	// never modified once set, so placement may read it after unlocking.
	warm map[string]int
	// verifying is the tasks whose finish step holds a verification
	// sandbox on the node, from its last heartbeat (see verifying.go);
	// guarded and never modified like warm.
	verifying []string
}

func (c *session) close() { c.closeOnce.Do(func() { close(c.closed) }) }

// send queues a command; a session that cannot keep up is cut, and the
// node's next Hello reconciles what it missed.
func (c *session) send(m *warrenv1.SessionResponse) {
	select {
	case c.out <- m:
	case <-c.closed:
	default:
		c.close()
	}
}

// sendSome queues a command if the queue is less than half full, and
// reports whether it did: for the many commands of one round (a drain's
// requests to give tasks back, their withdrawal), which a node with more
// leases than the queue holds would otherwise cut its own session with,
// again at every round after its reconnect. What is not sent now is sent
// in a later round; the other half is left to the commands that must not
// wait (send cuts a session whose queue is full).
func (c *session) sendSome(m *warrenv1.SessionResponse) bool {
	if len(c.out) >= cap(c.out)/2 {
		return false
	}
	select {
	case c.out <- m:
		return true
	case <-c.closed:
	default:
	}
	return false
}

// sessions is the leader's in-memory view of its node daemons: their
// streams, when each was last heard from, and what memberlist says. None of
// it goes through raft; a new leader starts it afresh and gives every node a
// full TTL of grace.
type sessions struct {
	// freed counts the heartbeats that gave back room placement had
	// counted (a verification sandbox gone: verifying.go); the placement
	// loop plans again when it changes, as when the FSM's replanGen does.
	freed       atomic.Uint64
	mu          sync.Mutex
	byNode      map[string]*session
	lastSeen    map[string]time.Time
	gossipDead  map[string]time.Time // memberlist declared the node dead at
	leaderSince time.Time            // zero when not leader
	// kept is the last verifying report of a node whose session ended,
	// until the node attaches again (its hello reports afresh): the
	// verification sandboxes do not end with a stream, so a blip or a
	// reconnect must not hand placement their room.
	kept map[string][]string
}

func newSessions() *sessions {
	return &sessions{byNode: map[string]*session{}, lastSeen: map[string]time.Time{}, gossipDead: map[string]time.Time{}, kept: map[string][]string{}}
}

// lead resets the view when this server becomes leader (now) or stops
// being leader (zero time), cutting every session.
func (h *sessions) lead(now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, c := range h.byNode {
		c.close()
	}
	h.byNode = map[string]*session{}
	h.lastSeen = map[string]time.Time{}
	h.gossipDead = map[string]time.Time{}
	h.kept = map[string][]string{}
	h.leaderSince = now
}

// ready restarts the grace when the new leader starts accepting sessions
// (after its barrier), which under load can be seconds after it won the
// election: nodes cannot reconnect before that, so their TTL counts from
// here.
func (h *sessions) ready(now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.leaderSince.IsZero() {
		h.leaderSince = now
	}
}

// attach makes c the node's session. It refuses (closing c, and
// reporting false) on a server that is no longer the leader: a session
// whose hello registered just before the server stepped down would
// otherwise attach after lead cut every session, stay open on the
// follower, and have its heartbeats acknowledged for good, while the real
// leader, never hearing from the node, declared it down.
func (h *sessions) attach(c *session, now time.Time) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.leaderSince.IsZero() {
		c.close()
		return false
	}
	if old := h.byNode[c.node]; old != nil {
		old.close()
		if len(old.verifying) > 0 {
			h.freed.Add(1) // its report goes; the new one may name fewer
		}
	}
	h.byNode[c.node] = c
	h.lastSeen[c.node] = now
	if len(h.kept[c.node]) > 0 {
		h.freed.Add(1) // the hello's report replaces it and may name fewer
	}
	delete(h.kept, c.node)
	delete(h.gossipDead, c.node) // a hello proves it is alive
	return true
}

// forget drops what the leader keeps in memory about a node that was
// removed (called as the removal is applied, before any later
// registration of its id: FSM.nodeRemoved). A session still attached is
// the removed node's (a down node's session, cut at the next liveness
// round otherwise, which no longer sees the node): it is cut, so a daemon
// still running says hello again and registers as a new node. Its last
// sign of life goes only when older than ttl: a hello on its way (seen
// before it registers) must keep counting for the node it registers.
func (h *sessions) forget(node string, now time.Time, ttl time.Duration) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if c := h.byNode[node]; c != nil {
		delete(h.byNode, node) // so that its detach keeps no report
		c.close()
	}
	if last, ok := h.lastSeen[node]; ok && now.Sub(last) > ttl {
		delete(h.lastSeen, node)
	}
	delete(h.gossipDead, node)
	delete(h.kept, node)
}

// rival returns the incarnation of another process's session for node
// id that is still live (heard within ttl), if there is one: a second
// node given the same --id. A restarted node's old session, its process
// gone, is heard no more, and is let go of within ttl.
func (h *sessions) rival(id, incarnation string, now time.Time, ttl time.Duration) (string, time.Duration, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	old := h.byNode[id]
	if old == nil || incarnation == "" || old.incarnation == "" || old.incarnation == incarnation {
		return "", 0, false
	}
	ago := now.Sub(h.lastSeen[id])
	return old.incarnation, ago, ago < ttl
}

func (h *sessions) detach(c *session) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.byNode[c.node] == c {
		delete(h.byNode, c.node)
		if len(c.verifying) > 0 {
			// Kept until the node is back: its verification sandboxes
			// did not end with the stream. (Only tasks still leased to
			// the node and not ended count: verifyingExtra.)
			h.kept[c.node] = c.verifying
		}
	}
	c.close()
}

func (h *sessions) seen(node string, now time.Time) {
	h.mu.Lock()
	h.lastSeen[node] = now
	h.mu.Unlock()
}

// heard records a heartbeat on c: a sign of life from its node, and the
// warm sandboxes it holds now (warm is c's from then on, not to be
// modified).
//
// A report of verifying tasks that drops one gives room back without any
// FSM change, so it counts in freed, after it is stored: a placement round
// that sees the new count sees the new report too.
func (h *sessions) heard(c *session, now time.Time, warm map[string]int, verifying []string) {
	h.mu.Lock()
	h.lastSeen[c.node] = now
	// (An unchanged report is the same slice: the receive loop keeps it.)
	same := len(c.verifying) == len(verifying) && (len(verifying) == 0 || &c.verifying[0] == &verifying[0])
	lost := !same && lostAny(c.verifying, verifying)
	c.warm, c.verifying = warm, verifying
	h.mu.Unlock()
	if lost {
		h.freed.Add(1)
	}
}

func (h *sessions) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.byNode)
}

func (h *sessions) get(node string) *session {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.byNode[node]
}

// gossip records memberlist's verdict on a node daemon.
func (h *sessions) gossip(node string, dead bool, now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if dead {
		h.gossipDead[node] = now
	} else {
		delete(h.gossipDead, node)
	}
}

// verdict says whether node should be declared down now, and why.
func (h *sessions) verdict(node string, now time.Time, ttl time.Duration) (string, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.leaderSince.IsZero() || now.Sub(h.leaderSince) < ttl {
		return "", false // grace after a leader change
	}
	if last := h.lastSeen[node]; last.Before(h.leaderSince) {
		// Not heard from since this leader became ready: its session has
		// to find the new leader (backing off up to 1 s while the election
		// runs) and register, which takes seconds under load. Give it two
		// TTLs; memberlist's verdict still counts after one.
		if d := now.Sub(h.leaderSince); d > 2*ttl {
			return fmt.Sprintf("no session since this leader took over %s ago (allowed 2 × ttl %s)", d.Round(time.Millisecond), ttl), true
		}
	} else if d, allowed := now.Sub(last), heartbeatTTL(now.Sub(h.leaderSince), ttl); d > allowed {
		return fmt.Sprintf("no heartbeat for %s (ttl %s)", d.Round(time.Millisecond), allowed), true
	}
	// A heartbeat after memberlist's verdict proves the node alive, as a
	// hello does: it paused (a long GC, a starved CPU) long enough for
	// memberlist's probes to time out, but not for its TTL, which still
	// holds if it stopped for good.
	if dead, ok := h.gossipDead[node]; ok && !h.lastSeen[node].After(dead) {
		return "memberlist declared it dead", true
	}
	return "", false
}

// heartbeatTTL is the heartbeat TTL a leader that has been ready for led
// applies: twice ttl for the first failoverWindow TTLs. Right after a
// failover every node reconnects, registers and is reconciled while the
// actors retry their appends, and heartbeats lag: with one TTL, 64 healthy
// nodes of the 40,000-task benchmark were declared down (Nomad, for the
// same reason, gives nodes minutes after a failover). memberlist's verdict
// is not stretched.
func heartbeatTTL(led, ttl time.Duration) time.Duration {
	if led < failoverWindow*ttl {
		return 2 * ttl
	}
	return ttl
}

// failoverWindow is how many TTLs after a leader becomes ready heartbeats
// get twice the TTL.
const failoverWindow = 5

// nodeAPI implements warrenv1connect.NodeServiceHandler.
type nodeAPI struct{ s *Server }

var _ warrenv1connect.NodeServiceHandler = nodeAPI{}

func (n nodeAPI) notLeader() error {
	addr, id := n.s.raft.LeaderWithID()
	url := ""
	if m, err := n.s.fsm.Member(string(id)); err == nil {
		url = m.GetApiUrl()
	}
	return connect.NewError(connect.CodeFailedPrecondition,
		fmt.Errorf("%w: sessions are held by the leader %q (raft %s, api %s)", raft.ErrNotLeader, id, addr, url))
}

// Session holds one node daemon's stream on the leader.
func (n nodeAPI) Session(ctx context.Context, stream *connect.BidiStream[warrenv1.SessionRequest, warrenv1.SessionResponse]) error {
	s := n.s
	if s.raft.State() != raft.Leader {
		return n.notLeader()
	}
	// A new leader first applies what was committed before it led;
	// reconciling nodes from a lagging FSM would stop actors whose leases
	// it has not seen yet.
	for s.readyTerm.Load() != s.raft.CurrentTerm() {
		if s.raft.State() != raft.Leader {
			return n.notLeader()
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-s.stop:
			return connect.NewError(connect.CodeUnavailable, errors.New("server shutting down"))
		case <-time.After(10 * time.Millisecond):
		}
	}
	first, err := stream.Receive()
	if err != nil {
		return err
	}
	hello := first.GetHello()
	if hello == nil {
		return connect.NewError(connect.CodeInvalidArgument, errors.New("msg: the first message of a session must be a hello"))
	}
	if err := validateNode(hello.GetNode()); err != nil {
		return invalid(fmt.Errorf("hello: %w", err))
	}
	id := hello.GetNode().GetId()
	// Two processes with one --id took the session from each other about
	// once a second, each re-registering the node as its own: the second
	// is refused while the first is heard from.
	if other, ago, live := s.sess.rival(id, hello.GetIncarnation(), s.clock.Now(), s.ttl()); live {
		return connect.NewError(connect.CodeAlreadyExists, fmt.Errorf(
			"node %s: another process has a live session as this node (incarnation %s, heard %v ago): two nodes were given --id %s; give this one another, or, if that one has just stopped, it is let go of within %v",
			id, other, ago.Round(time.Millisecond), id, s.ttl()))
	}
	// A hello is a sign of life, and so is every heartbeat from here on:
	// registering and reconciling can take seconds under load, and when
	// heartbeats were read only after, a healthy node registering then
	// was declared down.
	s.sess.seen(id, s.clock.Now())
	c := &session{node: id, incarnation: hello.GetIncarnation(), out: make(chan *warrenv1.SessionResponse, sessionQueue),
		closed: make(chan struct{}), yielded: map[string]uint64{}, verifying: verifyingReport(hello.GetVerifying())}
	recv := make(chan error, 1)
	heard := make(chan uint64, 1) // the last heartbeat's seq, not yet acknowledged
	helloVerifying := c.verifying
	go func() {
		var warm map[string]int     // as last reported
		verifying := helloVerifying // as last reported (the hello's until a heartbeat)
		for {
			m, err := stream.Receive()
			if err != nil {
				recv <- err
				return
			}
			if hb := m.GetHeartbeat(); hb != nil {
				// Warm counts land on c, which placement reads only
				// while c is attached and open: those heard before the
				// attach count from it, none outlive the session.
				if !sameWarm(warm, hb.GetWarm()) {
					warm = warmCounts(hb.GetWarm())
				}
				if v := hb.GetVerifying(); !slices.Equal(verifying, v) {
					verifying = verifyingReport(v)
				}
				s.sess.heard(c, s.clock.Now(), warm, verifying)
				select { // only the last one is acknowledged
				case <-heard:
				default:
				}
				heard <- hb.GetSeq()
			}
		}
	}()
	res, _, err := s.proposeLocal(ctx, &fsmv1.RegisterNode{Node: hello.GetNode(), Time: timestamppb.New(s.clock.Now())})
	if err != nil {
		return toConnect(err)
	}
	if err := resultErr(res); err != nil {
		return err
	}
	// Welcome is sent before the session is attached: once attached, the
	// placement and liveness loops send on it too, and a node refuses a
	// session whose first message is not a welcome (nor may an ack come
	// first).
	if err := stream.Send(&warrenv1.SessionResponse{Msg: &warrenv1.SessionResponse_Welcome{Welcome: &warrenv1.Welcome{
		LeaderId: s.cfg.ID, HeartbeatIntervalMs: s.heartbeat().Milliseconds(), TtlMs: s.ttl().Milliseconds(),
		AcksHeartbeats: true}}}); err != nil {
		return err
	}
	if !s.sess.attach(c, s.clock.Now()) {
		return connect.NewError(connect.CodeUnavailable, errors.New("this server stopped leading while the node registered; find the leader again"))
	}
	defer s.sess.detach(c)
	// A down committed after this node registered cut no session if
	// declareDown looked for one before this attach: without this check
	// the session stayed attached to a DOWN node, which got no tasks and
	// was never judged again. Its down is applied by then (declareDown
	// looks after the commit), so this read sees it.
	if n, err := s.fsm.Node(id); err == nil && n.GetStatus() == warrenv1.NodeStatus_NODE_STATUS_DOWN {
		return connect.NewError(connect.CodeUnavailable, errors.New("node declared down while registering; reconnect"))
	}
	s.log.Info("node session opened", "node", id, "incarnation", c.incarnation, "running", len(hello.GetRunning()))
	// The cluster's warm-pool targets, so a node that joins or restarts
	// keeps the pools the operators set: each one (nodes that predate
	// PoolTargets read only these), then the complete set, with which the
	// node zeroes the targets it still keeps from records removed while it
	// was away (a target of 0 removes the record, so nothing names it).
	poolsCh, poolsSent := s.sendPools(c, nil)
	// The reconcile goes on the stream itself, not through c.out: a node
	// holding more leases than the queue has room for had its session cut
	// by its own reconcile, again at every hello. Whatever c.out holds by
	// now is sent after it; nothing there depends on coming first (a
	// start queued by placement meanwhile is a repeat the node ignores).
	send := func(m *warrenv1.SessionResponse) error { return stream.Send(m) }
	if err := s.reconcile(c, hello.GetRunning(), send); err != nil {
		return toConnect(err)
	}
	s.sess.seen(id, s.clock.Now())

	// Heartbeats are acknowledged at most every ttl/3, so that a node
	// hears from a quiet leader well within its ttl and can tell a leader
	// that vanished without closing the connection from an idle one.
	var acked time.Time
	for {
		select {
		case m := <-c.out:
			if err := stream.Send(m); err != nil {
				return err
			}
		case seq := <-heard:
			if now := s.clock.Now(); now.Sub(acked) >= s.ttl()/3 {
				acked = now
				if err := stream.Send(&warrenv1.SessionResponse{Msg: &warrenv1.SessionResponse_Ack{Ack: &warrenv1.HeartbeatAck{Seq: seq}}}); err != nil {
					return err
				}
			}
		case <-poolsCh:
			// The cluster's targets changed since they were sent (a
			// `pool set` is recorded after its direct calls to the
			// nodes, one of which may have reached this node before its
			// session opened with the older target): send the changed
			// ones.
			poolsCh, poolsSent = s.sendPools(c, poolsSent)
		case err := <-recv:
			s.log.Info("node session ended", "node", id, "err", err)
			return nil
		case <-c.closed:
			return connect.NewError(connect.CodeUnavailable, errors.New("session closed by the leader; reconnect"))
		case <-ctx.Done():
			return ctx.Err()
		case <-s.stop:
			return connect.NewError(connect.CodeUnavailable, errors.New("server shutting down"))
		}
	}
}

// sendPools queues the cluster's warm-pool targets on c. With sent nil (a
// session opening): each one (nodes that predate PoolTargets read only
// these), then the complete set, with which the node zeroes the targets it
// still keeps from records removed while it was away. Otherwise only the
// targets that differ from sent, the ones sent before: a removed record
// needs no resend (a target of 0 is recorded before the nodes are told),
// and the complete set would also zero the node's own targets
// (`pool set --node`), which last until its next session. It returns the
// channel closed at the next change and what the node has been sent.
func (s *Server) sendPools(c *session, sent map[string]uint32) (<-chan struct{}, map[string]uint32) {
	ch := s.fsm.poolsChanged() // before the read: no change is missed
	pools, err := s.fsm.Pools()
	if err != nil {
		s.log.Warn("pool targets not sent", "node", c.node, "err", err)
		return ch, sent
	}
	opening := sent == nil
	now := make(map[string]uint32, len(pools))
	all := &warrenv1.PoolTargets{}
	for _, p := range pools {
		now[p.GetTemplate()] = p.GetTarget()
		t := &warrenv1.SetPoolTarget{Template: p.GetTemplate(), Target: p.GetTarget()}
		all.Targets = append(all.Targets, t)
		if opening {
			c.send(&warrenv1.SessionResponse{Msg: &warrenv1.SessionResponse_SetPoolTarget{SetPoolTarget: t}})
		} else if n, ok := sent[p.GetTemplate()]; !ok || n != p.GetTarget() {
			r := &warrenv1.SetPoolTarget{Template: t.GetTemplate(), Target: t.GetTarget(), Resend: true}
			c.send(&warrenv1.SessionResponse{Msg: &warrenv1.SessionResponse_SetPoolTarget{SetPoolTarget: r}})
		}
	}
	if opening {
		c.send(&warrenv1.SessionResponse{Msg: &warrenv1.SessionResponse_PoolTargets{PoolTargets: all}})
	}
	return ch, now
}

// reconcile tells a (re)connected node what it should run: a start for
// every lease it holds, a stop for every actor it runs under a lease it no
// longer holds. It sends them with send, one at a time, however many.
func (s *Server) reconcile(c *session, running []*warrenv1.RunningTask, send func(*warrenv1.SessionResponse) error) error {
	tasks, err := s.fsm.NodeTasks(c.node)
	if err != nil {
		return err
	}
	held := map[string]uint64{}
	for _, t := range tasks {
		if Terminal(t.GetState()) || t.GetLease().GetNode() != c.node {
			continue
		}
		held[t.GetId()] = t.GetLease().GetEpoch()
		if err := send(startCommand(t)); err != nil {
			return err
		}
	}
	for _, r := range running {
		if held[r.GetTaskId()] != r.GetEpoch() {
			if err := send(&warrenv1.SessionResponse{Msg: &warrenv1.SessionResponse_Stop{Stop: &warrenv1.StopTask{
				TaskId: r.GetTaskId(), Epoch: r.GetEpoch(), Reason: "the node no longer holds this lease"}}}); err != nil {
				return err
			}
		}
	}
	return nil
}

func startCommand(t *warrenv1.Task) *warrenv1.SessionResponse {
	return &warrenv1.SessionResponse{Msg: &warrenv1.SessionResponse_Start{Start: &warrenv1.StartTask{
		TaskId: t.GetId(), Epoch: t.GetLease().GetEpoch(), Resume: t.GetResume(), Task: t}}}
}

// notifyPlaced sends start commands for tasks the leader just placed.
func (s *Server) notifyPlaced(ids []string) {
	for _, id := range ids {
		t, err := s.fsm.Task(id)
		if err != nil || t.GetState() != warrenv1.TaskState_TASK_STATE_PLACED {
			continue
		}
		if c := s.sess.get(t.GetLease().GetNode()); c != nil {
			c.send(startCommand(t))
		}
	}
}

func (s *Server) heartbeat() time.Duration {
	return orDuration(s.cfg.NodeHeartbeat, DefaultNodeHeartbeat)
}
func (s *Server) ttl() time.Duration { return orDuration(s.cfg.NodeTTL, DefaultNodeTTL) }

// livenessLoop runs on every server and acts only on the leader: it
// declares down the nodes that stopped heartbeating or that memberlist
// declared dead (each one raft command), asks draining nodes to give their
// tasks back, and ends drains whose deadline passed.
func (s *Server) livenessLoop() {
	defer s.wg.Done()
	tick := time.NewTicker(max(s.heartbeat()/5, 20*time.Millisecond))
	defer tick.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-tick.C:
		}
		if s.raft.State() != raft.Leader || s.readyTerm.Load() != s.raft.CurrentTerm() {
			// Not leading, or not ready yet: nodes cannot attach until the
			// leader's barrier, so none is judged before it.
			continue
		}
		nodes, err := s.fsm.Nodes()
		if err != nil {
			s.log.Warn("liveness: list nodes", "err", err)
			continue
		}
		now := s.clock.Now()
		var downs []*fsmv1.NodeOp
		for _, n := range nodes {
			st := n.GetStatus()
			if st == warrenv1.NodeStatus_NODE_STATUS_DOWN {
				// A down applied after its proposal gave up (a slow
				// commit), or after the node said hello again: its
				// session is cut here, so that it says hello again and
				// becomes ready, instead of heartbeating on, DOWN, for
				// good.
				if c := s.sess.get(n.GetId()); c != nil {
					s.log.Info("cutting the session of a node that is down", "node", n.GetId())
					c.close()
				}
				continue
			}
			if st != warrenv1.NodeStatus_NODE_STATUS_READY && st != warrenv1.NodeStatus_NODE_STATUS_DRAINING {
				continue
			}
			reason, down := s.sess.verdict(n.GetId(), now, s.ttl())
			var drainDeadline *timestamppb.Timestamp
			if !down && st == warrenv1.NodeStatus_NODE_STATUS_DRAINING && n.GetTaskCount() > 0 {
				if dl := n.GetDrainDeadline(); dl != nil && now.After(dl.AsTime()) {
					// The down names the deadline read here: it applies
					// only if the node is still draining with it, not
					// after an uncordon or a later drain committed since.
					reason, down, drainDeadline = "drain deadline passed", true, dl
				} else {
					s.askToYield(n.GetId())
				}
			} else if !down && st == warrenv1.NodeStatus_NODE_STATUS_READY {
				s.withdrawYields(n.GetId())
			}
			if down {
				s.log.Warn("declaring node down", "node", n.GetId(), "reason", reason)
				downs = append(downs, &fsmv1.NodeOp{Id: n.GetId(), Op: fsmv1.NodeOp_OP_DOWN, Reason: reason, DrainDeadline: drainDeadline, Time: timestamppb.New(now)})
			}
		}
		s.declareDown(downs)
	}
}

// declareDown proposes the downs of one liveness round together, in raft
// entries of up to 64 (many nodes die at once when a host running many
// simulated nodes dies, or a rack does), and cuts their sessions.
//
// A down is this leader's own verdict, so it is proposed on this server
// only, never forwarded nor retried elsewhere: a server that stopped
// leading during the round drops its downs (the new leader judges the
// nodes itself), and a leader refuses a forwarded down anyway.
func (s *Server) declareDown(downs []*fsmv1.NodeOp) {
	for len(downs) > 0 {
		n := min(len(downs), 64)
		chunk := downs[:n]
		downs = downs[n:]
		cmds := make([][]byte, len(chunk))
		for i, d := range chunk {
			b, err := EncodeCommand(d)
			if err != nil {
				s.log.Warn("declare node down", "node", d.GetId(), "err", err)
				return
			}
			cmds[i] = b
		}
		ctx, cancel := s.bgContext(10 * time.Second)
		res, _, err := s.gc.propose(ctx, cmds)
		cancel()
		if err != nil {
			s.log.Warn("declare nodes down", "nodes", len(chunk), "err", err)
			return // the next round tries again
		}
		for i, d := range chunk {
			if err := resultErr(res[i]); err != nil {
				s.log.Warn("declare node down", "node", d.GetId(), "err", err)
				continue
			}
			if c := s.sess.get(d.GetId()); c != nil {
				c.close() // it must say hello again to be ready
			}
		}
	}
}

// askToYield asks a draining node to give back, at the next step boundary,
// each task it has not been asked about yet under its current epoch.
func (s *Server) askToYield(node string) {
	c := s.sess.get(node)
	if c == nil {
		return
	}
	tasks, err := s.fsm.NodeTasks(node)
	if err != nil {
		return
	}
	// Forget the tasks that left the node: the record would otherwise
	// grow with every task the drain moved, and an uncordon would send
	// each of them a KeepTask.
	here := make(map[string]bool, len(tasks))
	for _, t := range tasks {
		here[t.GetId()] = true
	}
	maps.DeleteFunc(c.yielded, func(id string, _ uint64) bool { return !here[id] })
	for _, t := range tasks {
		e := t.GetLease().GetEpoch()
		if Terminal(t.GetState()) || c.yielded[t.GetId()] == e {
			continue
		}
		if !c.sendSome(&warrenv1.SessionResponse{Msg: &warrenv1.SessionResponse_Stop{Stop: &warrenv1.StopTask{
			TaskId: t.GetId(), Epoch: e, Reason: "node draining", Yield: true}}}) {
			return // the rest in a later round
		}
		c.yielded[t.GetId()] = e
	}
}

// withdrawYields takes back, on a node that is no longer draining (it was
// uncordoned), the requests to give tasks back that askToYield sent on its
// session: the tasks whose actors have not reached a step boundary since
// stay. Without it, an uncordon only stopped the asking, and every task
// asked before it still moved once.
func (s *Server) withdrawYields(node string) {
	c := s.sess.get(node)
	if c == nil || len(c.yielded) == 0 {
		return
	}
	for id, e := range c.yielded {
		if !c.sendSome(&warrenv1.SessionResponse{Msg: &warrenv1.SessionResponse_Keep{Keep: &warrenv1.KeepTask{TaskId: id, Epoch: e}}}) {
			return // the rest in a later round
		}
		delete(c.yielded, id)
	}
}
