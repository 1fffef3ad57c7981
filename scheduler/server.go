package scheduler

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"github.com/cockroachdb/pebble/v2"
	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"

	fsmv1 "github.com/warrenhq/warren/api/gen/warren/fsm/v1"
	"github.com/warrenhq/warren/internal/gossip"
	"github.com/warrenhq/warren/raftlog"
)

// Clock is the time source of a server. Tests may pass their own.
type Clock interface{ Now() time.Time }

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

// Config is one scheduler peer's configuration.
type Config struct {
	ID       string // raft server id, unique in the cluster
	DataDir  string // Pebble database, snapshots
	RaftAddr string // HOST:PORT the raft transport listens on and advertises
	APIURL   string // URL other servers and clients reach this server's API at

	Bootstrap bool   // form a new single-voter cluster if there is no state yet
	JoinURL   string // API URL of any member to join through (with state: only if the cluster has another RaftAddr for ID)
	// AwaitJoin lets a server with no state start with neither Bootstrap
	// nor JoinURL, to be added by a Join call another makes for it (tests);
	// without it such a server is refused at start.
	AwaitJoin bool

	HeartbeatTimeout  time.Duration // 0 means DefaultHeartbeatTimeout
	ElectionTimeout   time.Duration // 0 means DefaultElectionTimeout
	MaxStarting       int           // tasks placed but not yet running, cluster-wide; 0 means DefaultMaxStarting
	MaxStreams        int           // event streams (StreamEvents, SSE) this server serves at once; 0 means DefaultMaxStreams
	SnapshotThreshold uint64        // entries between snapshots; 0 means 16384
	TrailingLogs      uint64        // entries kept after a snapshot; 0 means 10240
	SnapshotInterval  time.Duration // 0 means 30s

	PlacementInterval time.Duration // how often the leader checks for work; 0 means 20ms
	PlacementSeed     uint64        // placement's random seed; 0 means time-based
	// maxPendingPerRound bounds the pending tasks one placement round
	// reads (0: maxPendingPerRound; smaller in tests).
	maxPendingPerRound int

	NodeHeartbeat time.Duration // how often node daemons heartbeat; 0 means 500ms
	NodeTTL       time.Duration // a node silent this long is down; 0 means 3s
	GossipAddr    string        // HOST:PORT for memberlist; "" runs without gossip
	JoinGossip    []string      // memberlist members to join through

	Logger    *slog.Logger // nil means discard
	RaftLogTo io.Writer    // raft's own log; nil means stderr
	RaftLevel string       // raft's log level; "" means "warn"
	Clock     Clock        // nil means the system clock
}

// Raft timing. A follower calls an election after 1-2 heartbeat timeouts
// without the leader, so failover takes about 1-1.6 s. With 500 ms, leaders
// on a CPU-starved box (the capacity benchmark's 40,000 tasks, fleet and
// servers on 2 cores) lost their lease to 500-950 ms stalls; and candidates
// whose vote round trips took longer than a 500 ms election timeout split
// the vote again and again (6 s failovers).
const (
	DefaultHeartbeatTimeout = 750 * time.Millisecond
	DefaultElectionTimeout  = time.Second
)

// Validate reports every problem with the config at once.
func (c *Config) Validate() error {
	var errs []error
	if c.ID == "" {
		errs = append(errs, errors.New("id: required"))
	}
	if c.DataDir == "" {
		errs = append(errs, errors.New("data: required"))
	}
	if host, _, err := net.SplitHostPort(c.RaftAddr); err != nil {
		errs = append(errs, fmt.Errorf("raft: %q is not HOST:PORT: %v", c.RaftAddr, err))
	} else if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
		errs = append(errs, fmt.Errorf("raft: %q must be an address other servers can reach, not %q", c.RaftAddr, host))
	}
	if c.APIURL == "" {
		errs = append(errs, errors.New("api: required"))
	}
	if c.GossipAddr != "" {
		if _, port, err := net.SplitHostPort(c.GossipAddr); err != nil {
			errs = append(errs, fmt.Errorf("gossip: %q is not HOST:PORT: %v", c.GossipAddr, err))
		} else if _, err := strconv.ParseUint(port, 10, 16); err != nil {
			errs = append(errs, fmt.Errorf("gossip: %q: port %q is not 0-65535", c.GossipAddr, port))
		}
	}
	if c.Bootstrap && c.JoinURL != "" {
		errs = append(errs, errors.New("bootstrap and join: choose one"))
	}
	if j := c.JoinURL; j != "" && !strings.HasPrefix(j, "http://") && !strings.HasPrefix(j, "https://") {
		errs = append(errs, fmt.Errorf("join: %q must be a URL starting with http:// or https://", j))
	}
	for _, d := range []struct {
		flag string
		v    time.Duration
	}{{"heartbeat-timeout", c.HeartbeatTimeout}, {"election-timeout", c.ElectionTimeout}, {"snapshot-interval", c.SnapshotInterval},
		{"node-heartbeat", c.NodeHeartbeat}, {"node-ttl", c.NodeTTL}} {
		if d.v < 0 {
			errs = append(errs, fmt.Errorf("%s: %v must not be negative (0: the default)", d.flag, d.v))
		}
	}
	// Compared as they will run, the defaults put in for 0: --node-ttl 0
	// with --node-heartbeat 5s was a 3 s TTL under a 5 s heartbeat, and
	// raft's own limits were found only once the ports and Pebble were
	// open, in raft's names for them.
	if ttl, hb := orDuration(c.NodeTTL, DefaultNodeTTL), orDuration(c.NodeHeartbeat, DefaultNodeHeartbeat); c.NodeTTL >= 0 && c.NodeHeartbeat >= 0 && ttl <= hb {
		errs = append(errs, fmt.Errorf("node-ttl: %v must be longer than node-heartbeat %v (0 is the default: %v and %v)", ttl, hb, DefaultNodeTTL, DefaultNodeHeartbeat))
	}
	if c.NodeHeartbeat > 0 && c.NodeHeartbeat < time.Millisecond {
		errs = append(errs, fmt.Errorf("node-heartbeat: %v is under 1ms (nodes are told it in whole milliseconds)", c.NodeHeartbeat))
	}
	for _, d := range []struct {
		flag string
		v    time.Duration
	}{{"heartbeat-timeout", c.HeartbeatTimeout}, {"election-timeout", c.ElectionTimeout}, {"snapshot-interval", c.SnapshotInterval}} {
		if d.v > 0 && d.v < 5*time.Millisecond {
			errs = append(errs, fmt.Errorf("%s: %v is under raft's minimum of 5ms", d.flag, d.v))
		}
	}
	if hb, el := orDuration(c.HeartbeatTimeout, DefaultHeartbeatTimeout), orDuration(c.ElectionTimeout, DefaultElectionTimeout); c.HeartbeatTimeout >= 0 && c.ElectionTimeout >= 0 && el < hb {
		errs = append(errs, fmt.Errorf("election-timeout: %v must be at least heartbeat-timeout %v (0 is the default: %v and %v)", el, hb, DefaultElectionTimeout, DefaultHeartbeatTimeout))
	}
	if c.MaxStreams < 0 {
		errs = append(errs, fmt.Errorf("max-streams: %d must be positive (0: the default, %d)", c.MaxStreams, DefaultMaxStreams))
	}
	if c.MaxStarting < 0 {
		errs = append(errs, fmt.Errorf("max-starting: %d must be positive (0: the default, %d)", c.MaxStarting, DefaultMaxStarting))
	}
	return errors.Join(errs...)
}

// Server is one scheduler peer: raft over Pebble, the FSM, group commit,
// write forwarding and the API.
type Server struct {
	// caughtUpTerm is the last term in which this server, as leader, had
	// applied everything committed before it (leaderCaughtUp).
	caughtUpTerm atomic.Uint64
	cfg          Config
	log          *slog.Logger
	clock        Clock
	db           *pebble.DB
	store        *raftlog.Store
	fsm          *FSM
	trans        *raft.NetworkTransport
	raft         *raft.Raft
	gc           *groupCommit // leader: batches into raft entries
	fwd          *forwarder
	fgc          *groupCommit   // follower: batches into Propose calls to the leader
	sess         *sessions      // leader: node daemon sessions and liveness
	gossip       *gossip.Member // memberlist, when configured

	// streams counts the event streams this server serves (takeStream).
	streams atomic.Int64

	// readyTerm is the raft term in which this server, as leader, has
	// applied everything committed before it led (a barrier); sessions wait
	// for it so that a new leader never reconciles nodes from a lagging FSM.
	readyTerm atomic.Uint64

	// failed gets the error that leaves this server no use running (a
	// join the cluster refuses for good); see Failed.
	failed chan error

	stop     chan struct{}
	stopCtx  context.Context // done when stop is closed
	stopAll  context.CancelFunc
	wg       sync.WaitGroup
	closeErr error
	closed   sync.Once
	stopped  sync.Once
}

// Open starts a server: it opens the data directory, starts raft, and
// bootstraps or joins as configured. Serve its Handler to expose the API.
func Open(cfg Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if cfg.Clock == nil {
		cfg.Clock = systemClock{}
	}
	s := &Server{cfg: cfg, log: cfg.Logger.With("server", cfg.ID), clock: cfg.Clock, stop: make(chan struct{}), sess: newSessions(), failed: make(chan error, 1)}
	s.stopCtx, s.stopAll = context.WithCancel(context.Background())
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("data: %w", err)
	}
	if err := claimDataDir(cfg.DataDir, cfg.ID); err != nil {
		return nil, err
	}
	var err error
	if s.db, err = raftlog.Open(filepath.Join(cfg.DataDir, "pebble")); err != nil {
		// Another process's lock (EAGAIN), or this process's (Pebble
		// says so in its own words).
		if errors.Is(err, syscall.EWOULDBLOCK) || strings.Contains(err.Error(), "lock held by current process") {
			return nil, fmt.Errorf("data: %s is in use by another warren server (its Pebble store is locked); give each server its own --data", cfg.DataDir)
		}
		return nil, fmt.Errorf("data: open pebble: %w", err)
	}
	if s.store, err = raftlog.New(s.db); err != nil {
		s.db.Close()
		return nil, err
	}
	if s.fsm, err = NewFSM(s.db, filepath.Join(cfg.DataDir, "tmp"), s.log); err != nil {
		s.db.Close()
		return nil, err
	}
	s.fsm.nodeRemoved = func(id string) { s.sess.forget(id, s.clock.Now(), s.ttl()) }
	if err := s.startRaft(); err != nil {
		s.db.Close()
		return nil, err
	}
	s.gc = newGroupCommit(raftStart(s.raft), 4, 4096, 4<<20)
	s.fwd = newForwarder(s)
	s.fgc = newGroupCommit(s.fwd.start, 8, 1024, 4<<20)
	if cfg.GossipAddr != "" {
		if s.gossip, err = startGossip(s); err != nil {
			// As Close: stop group commit, wait until raft has stopped
			// (its goroutines write to the store), then close the store.
			s.stopAll()
			s.gc.close()
			s.fgc.close()
			s.raft.Shutdown().Error()
			s.trans.Close()
			s.db.Close()
			return nil, err
		}
	}
	s.wg.Add(3)
	go s.watchLeadership()
	go s.placementLoop()
	go s.livenessLoop()
	if cfg.JoinURL != "" {
		s.wg.Add(1)
		go s.joinLoop()
	}
	return s, nil
}

// logCacheEntries is how many of the newest raft entries stay in memory
// (raft.LogCache) after they are stored. Raft reads every entry back from
// the log store: the leader to send it to each follower, a follower to
// apply it. From Pebble that is a read, a copy and a decode per entry, and
// was the largest allocator on every server under load. The entries are
// group-commit batches (a few KiB to 4 MiB, usually tens of KiB), and 64
// covers what replication and apply trail behind the newest by; older
// entries are read from the store as before.
const logCacheEntries = 64

func (s *Server) startRaft() error {
	level := s.cfg.RaftLevel
	if level == "" {
		level = "warn"
	}
	out := s.cfg.RaftLogTo
	if out == nil {
		out = os.Stderr
	}
	hl := hclog.New(&hclog.LoggerOptions{Name: "raft." + s.cfg.ID, Level: hclog.LevelFromString(level), Output: out})

	rc := raft.DefaultConfig()
	rc.LocalID = raft.ServerID(s.cfg.ID)
	rc.Logger = hl
	rc.HeartbeatTimeout = orDuration(s.cfg.HeartbeatTimeout, DefaultHeartbeatTimeout)
	rc.ElectionTimeout = orDuration(s.cfg.ElectionTimeout, DefaultElectionTimeout)
	// A leader steps down after a whole heartbeat timeout without a quorum
	// (not half of one): on a CPU-starved box a shorter lease made leaders
	// step down under load (seen in the capacity benchmark).
	rc.LeaderLeaseTimeout = rc.HeartbeatTimeout
	// A follower learns that an entry committed from the next message the
	// leader sends; a forwarded write waits for that, so keep it short.
	rc.CommitTimeout = 5 * time.Millisecond
	rc.MaxAppendEntries = 512
	rc.BatchApplyCh = true
	rc.SnapshotThreshold = orUint(s.cfg.SnapshotThreshold, 16384)
	rc.TrailingLogs = orUint(s.cfg.TrailingLogs, 10240)
	rc.SnapshotInterval = orDuration(s.cfg.SnapshotInterval, 30*time.Second)

	snaps, err := raft.NewFileSnapshotStoreWithLogger(s.cfg.DataDir, 2, hl)
	if err != nil {
		return fmt.Errorf("snapshot store: %w", err)
	}
	addr, err := net.ResolveTCPAddr("tcp", s.cfg.RaftAddr)
	if err != nil {
		return fmt.Errorf("raft address: %w", err)
	}
	s.trans, err = raft.NewTCPTransportWithLogger(s.cfg.RaftAddr, addr, 8, 5*time.Second, hl)
	if err != nil {
		return fmt.Errorf("raft transport: %w", err)
	}
	hasState, err := raft.HasExistingState(s.store, s.store, snaps)
	if err != nil {
		s.trans.Close()
		return err
	}
	if !hasState && !s.cfg.Bootstrap && s.cfg.JoinURL == "" && !s.cfg.AwaitJoin {
		// It would wait, no member, for a leader that never comes: raft's
		// only word was "no known peers", and writes through it timed out.
		s.trans.Close()
		return fmt.Errorf("data directory %s holds no cluster state: give --bootstrap to start a new cluster, or --join URL to join one", s.cfg.DataDir)
	}
	logs, err := raft.NewLogCache(logCacheEntries, s.store)
	if err != nil {
		s.trans.Close()
		return err
	}
	s.raft, err = raft.NewRaft(rc, s.fsm, logs, s.store, snaps, s.trans)
	if err != nil {
		s.trans.Close()
		return fmt.Errorf("start raft: %w", err)
	}
	if s.cfg.Bootstrap && !hasState {
		f := s.raft.BootstrapCluster(raft.Configuration{Servers: []raft.Server{{
			Suffrage: raft.Voter, ID: rc.LocalID, Address: s.trans.LocalAddr(),
		}}})
		if err := f.Error(); err != nil && !errors.Is(err, raft.ErrCantBootstrap) {
			// Wait for raft to stop before Open closes the store under it.
			s.raft.Shutdown().Error()
			s.trans.Close()
			return fmt.Errorf("bootstrap: %w", err)
		}
		s.log.Info("bootstrapped a new cluster")
	}
	return nil
}

func orDuration(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}

func orUint(v, def uint64) uint64 {
	if v == 0 {
		return def
	}
	return v
}

// becomeReady waits, as the leader of term, until everything committed
// before it is applied (a barrier), and then takes node sessions. A failed
// barrier is tried again while this server still leads in term: until it
// is ready no node can attach, and liveness judges none.
func (s *Server) becomeReady(term uint64) {
	for {
		err := s.raft.Barrier(30 * time.Second).Error()
		if s.raft.State() != raft.Leader || s.raft.CurrentTerm() != term {
			return
		}
		if err == nil {
			s.sess.ready(s.clock.Now())
			s.readyTerm.Store(term)
			return
		}
		s.log.Warn("leader barrier; trying again", "term", term, "err", err)
		select {
		case <-s.stop:
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// watchLeadership records this server's API address whenever it becomes
// leader, so followers can forward to it.
func (s *Server) watchLeadership() {
	defer s.wg.Done()
	for {
		select {
		case <-s.stop:
			return
		case isLeader := <-s.raft.LeaderCh():
			if !isLeader {
				s.sess.lead(time.Time{})
				continue
			}
			s.sess.lead(s.clock.Now())
			s.log.Info("became leader")
			term := s.raft.CurrentTerm()
			go s.becomeReady(term)
			m, err := s.fsm.Member(s.cfg.ID)
			if err == nil && m.GetApiUrl() == s.cfg.APIURL && m.GetRaftAddress() == s.cfg.RaftAddr {
				continue
			}
			ctx, cancel := s.bgContext(10 * time.Second)
			if _, _, err := s.proposeLocal(ctx, &fsmv1.SetMember{Id: s.cfg.ID, RaftAddress: s.cfg.RaftAddr, ApiUrl: s.cfg.APIURL}); err != nil {
				s.log.Warn("record own address", "err", err)
			}
			cancel()
		}
	}
}

// bgContext is a context for the server's own background work: it ends
// after d or when the server stops, so Close does not wait for a proposal
// that can no longer commit (the others may be stopping too).
func (s *Server) bgContext(d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(s.stopCtx, d)
}

// Failed receives an error when the server can no longer do its job and
// should stop: a join the cluster refused for good (another live server
// has its id). A process serving it would look healthy to its supervisor
// while it is no member.
func (s *Server) Failed() <-chan error { return s.failed }

// joinLoop asks the cluster to add this server until it is a member at
// its raft address. A server restarted on its data with another --raft is
// a member at the old one, where the leader no longer reaches it: it joins
// again, which moves it (AddVoter on a known id sets its address).
func (s *Server) joinLoop() {
	defer s.wg.Done()
	if addr, ok := s.raftAddrOf(s.cfg.ID); ok && !s.ownRaftAddr(addr) {
		s.log.Info("the cluster has this server at another raft address; joining again to move it", "old", addr, "raft", s.cfg.RaftAddr)
	}
	backoff := 100 * time.Millisecond
	for {
		if addr, ok := s.raftAddrOf(s.cfg.ID); ok && s.ownRaftAddr(addr) {
			return
		}
		ctx, cancel := s.bgContext(10 * time.Second)
		err := s.fwd.join(ctx, s.cfg.JoinURL)
		cancel()
		if err == nil {
			s.log.Info("joined cluster", "via", s.cfg.JoinURL)
			return
		}
		if connect.CodeOf(err) == connect.CodeAlreadyExists {
			// Another live server has this id: retrying would take its
			// place the moment it restarts.
			s.log.Error("join refused; not retrying: give this server another --id", "via", s.cfg.JoinURL, "err", err)
			select {
			case s.failed <- fmt.Errorf("join via %s refused: %w (give this server another --id, and a new --data: %s records this one)", s.cfg.JoinURL, err, filepath.Join(s.cfg.DataDir, serverIDFile)):
			default:
			}
			return
		}
		s.log.Warn("join failed; retrying", "via", s.cfg.JoinURL, "err", err)
		select {
		case <-s.stop:
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

// raftAddrOf returns the raft address this server's configuration has for
// server id, and whether id is in it.
func (s *Server) raftAddrOf(id string) (string, bool) {
	f := s.raft.GetConfiguration()
	if f.Error() != nil {
		return "", false
	}
	for _, srv := range f.Configuration().Servers {
		if srv.ID == raft.ServerID(id) {
			return string(srv.Address), true
		}
	}
	return "", false
}

// ownRaftAddr reports whether addr is this server's raft address: as
// given (what Join records) or as resolved (what bootstrap records).
func (s *Server) ownRaftAddr(addr string) bool {
	return addr == s.cfg.RaftAddr || addr == string(s.trans.LocalAddr())
}

// raftProbeTimeout bounds the leader's dial of a raft address it checks.
const raftProbeTimeout = 2 * time.Second

// errUnreachable marks a raft address the leader could not dial.
var errUnreachable = errors.New("the leader cannot reach it")

// probeRaft checks that server id's raft transport answers at addr. The
// leader asks before it adds a voter: one it cannot reach still counts
// towards the quorum (a single server joined by an unreachable one can
// never commit again, and nothing removes a server). After a dial, it asks
// for a pre-vote in term 0, which every raft server answers, with its id,
// without changing its state; so an address that is another server's (the
// leader's own, pasted by mistake) or no raft server's is caught too.
// Dial failures wrap errUnreachable.
func (s *Server) probeRaft(ctx context.Context, id, addr string) error {
	d := net.Dialer{Timeout: raftProbeTimeout}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("%w: %v", errUnreachable, err)
	}
	conn.Close()
	req := &raft.RequestPreVoteRequest{RPCHeader: raft.RPCHeader{
		ProtocolVersion: raft.ProtocolVersionMax,
		ID:              []byte(s.cfg.ID),
		Addr:            s.trans.EncodePeer(raft.ServerID(s.cfg.ID), s.trans.LocalAddr()),
	}}
	var resp raft.RequestPreVoteResponse
	if err := s.trans.RequestPreVote(raft.ServerID(id), raft.ServerAddress(addr), req, &resp); err != nil {
		return fmt.Errorf("no raft server answers there: %v", err)
	}
	if got := string(resp.ID); got != id {
		return fmt.Errorf("it is the raft address of server %q, not %q", got, id)
	}
	return nil
}

// addVoter adds a server (leader only) and records its addresses.
func (s *Server) addVoter(ctx context.Context, id, raftAddr, apiURL string) error {
	if err := s.raft.AddVoter(raft.ServerID(id), raft.ServerAddress(raftAddr), 0, 10*time.Second).Error(); err != nil {
		return err
	}
	_, _, err := s.proposeLocal(ctx, &fsmv1.SetMember{Id: id, RaftAddress: raftAddr, ApiUrl: apiURL})
	return err
}

// FSM returns the server's state machine (for reads and tests).
func (s *Server) FSM() *FSM { return s.fsm }

// Raft returns the raft instance (for status and tests).
func (s *Server) Raft() *raft.Raft { return s.raft }

// ID returns the server id.
func (s *Server) ID() string { return s.cfg.ID }

// Handler returns the HTTP handler serving the Connect API and the SSE
// gateway.
func (s *Server) Handler() http.Handler { return newMux(s) }

// Quiesce ends the server's streams and background loops and makes
// writes in flight give up, but keeps its store open: call it before
// shutting the HTTP server down, so that streams end and the reads in
// flight finish before Close closes the store under them.
func (s *Server) Quiesce() { s.stopped.Do(func() { close(s.stop) }) }

// Close stops the server and releases the data directory.
func (s *Server) Close() error {
	s.closed.Do(func() {
		s.Quiesce()
		s.stopAll()
		if s.gossip != nil {
			s.gossip.Close()
		}
		s.gc.close()
		s.fgc.close()
		errs := []error{s.raft.Shutdown().Error()}
		s.wg.Wait()
		errs = append(errs, s.trans.Close(), s.db.Close())
		s.closeErr = errors.Join(errs...)
	})
	return s.closeErr
}

// serverIDFile names, in a server's data directory, the id it serves as.
const serverIDFile = "server-id"

// claimDataDir records id as the server of dir, or refuses a dir another
// id has: raft's state there is that server's (its vote, its place in the
// configuration), and a server started on it under another --id served,
// never a voter, with no leader, its writes never committing.
func claimDataDir(dir, id string) error {
	path := filepath.Join(dir, serverIDFile)
	b, err := os.ReadFile(path)
	switch {
	case err == nil && strings.TrimSpace(string(b)) != "":
		if had := strings.TrimSpace(string(b)); had != id {
			return fmt.Errorf("data: %s is server %s's (%s): start it with --id %s, or give %s a data directory of its own", dir, had, path, had, id)
		}
		return nil
	case err != nil && !errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("data: %w", err)
	}
	// Missing, or empty (a crash before the write reached the disk):
	// written whole or not at all, a temporary file renamed over it.
	tmp, err := os.CreateTemp(dir, serverIDFile+".*")
	if err != nil {
		return fmt.Errorf("data: %w", err)
	}
	_, err = tmp.WriteString(id + "\n")
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("data: %w", err)
	}
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return nil
}
