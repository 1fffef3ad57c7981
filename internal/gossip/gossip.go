// Package gossip runs hashicorp/memberlist for warren's servers and node
// daemons with one LAN tuning, one naming scheme ("server:ID", "node:ID")
// and one callback for joins and deaths. memberlist is the second,
// independent failure signal next to session heartbeats.
package gossip

import (
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
)

// Roles of members.
const (
	RoleServer = "server"
	RoleNode   = "node"
	// RoleFleet is one process hosting Count simulated nodes named
	// ID-0001 ... ID-<Count>: they share the process's fate, so they share
	// one member. Its changes are reported as changes of each node.
	RoleFleet = "fleet"
)

// Config is one member's gossip configuration.
type Config struct {
	Role, ID string
	Addr     string   // HOST:PORT to bind and advertise (UDP and TCP)
	Join     []string // members to join through; may be empty for the first
	// OnChange is told when a member appears (alive) or is declared dead or
	// leaves (alive false). It runs on the member's own goroutine, one call
	// at a time, never under memberlist's locks; changes that arrive while
	// it runs are coalesced to each member's latest state (see queue).
	OnChange func(role, id string, alive bool)
	Logger   *slog.Logger
	// Wrap, if set, wraps memberlist's network transport (tests cut it to
	// simulate a partition).
	Wrap func(memberlist.Transport) memberlist.Transport
	// Fleet selects FleetConfig instead of LANConfig: for many simulated
	// members in one process.
	Fleet bool
	// Count is the number of nodes a RoleFleet member stands for.
	Count int
}

// FleetNodeID is the id of node i (from 1) of a fleet process.
func FleetNodeID(fleet string, i int) string { return fmt.Sprintf("%s-%04d", fleet, i) }

// Member is a running memberlist instance.
type Member struct {
	ml   *memberlist.Memberlist
	log  *slog.Logger
	stop chan struct{}
	wg   sync.WaitGroup // joinLoop and deliver
	once sync.Once      // Close or Kill, whichever comes first
}

// rejoinEvery is how often a joined member checks that its join peers
// are still among the live members (a variable so tests can shorten it).
var rejoinEvery = 5 * time.Second

// LANConfig is memberlist tuned for one LAN or one machine: a probe every
// 250 ms with a 100 ms timeout and a short suspicion (3 × log10(N) probe
// intervals, at least 750 ms), so a dead member is declared in about a
// second instead of memberlist's default five or more.
func LANConfig() *memberlist.Config {
	c := memberlist.DefaultLANConfig()
	c.ProbeInterval = 250 * time.Millisecond
	c.ProbeTimeout = 100 * time.Millisecond
	c.SuspicionMult = 3
	c.SuspicionMaxTimeoutMult = 4
	c.GossipInterval = 100 * time.Millisecond
	c.GossipToTheDeadTime = 5 * time.Second
	c.TCPTimeout = 2 * time.Second
	c.PushPullInterval = 15 * time.Second
	return c
}

// FleetConfig is memberlist's own LAN timing (a probe a second with a
// 500 ms timeout, suspicion 4 × log10(N) probe intervals) with slower
// gossip and push-pull. It is for simulated fleets, where one process
// hosts many members and a machine a thousand: LANConfig's probe and
// gossip rates times a thousand members would take the machine's CPU.
// A dead member takes a few seconds to be declared, so the heartbeat
// TTL usually wins.
func FleetConfig() *memberlist.Config {
	c := memberlist.DefaultLANConfig()
	c.GossipInterval = 500 * time.Millisecond
	c.PushPullInterval = 60 * time.Second
	c.TCPTimeout = 5 * time.Second
	return c
}

// Name is the memberlist name of a member.
func Name(role, id string) string { return role + ":" + id }

// Split parses a memberlist name.
func Split(name string) (role, id string, ok bool) { return strings.Cut(name, ":") }

// Start creates the member and joins the given members, retrying in the
// background until one answers (the others may not be up yet).
func Start(cfg Config) (*Member, error) {
	host, port, err := net.SplitHostPort(cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("gossip: %q is not HOST:PORT: %v", cfg.Addr, err)
	}
	p, err := strconv.Atoi(port)
	if err != nil || p < 0 || p > 65535 {
		return nil, fmt.Errorf("gossip: port %q is not a port", port)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	mc := LANConfig()
	if cfg.Fleet {
		mc = FleetConfig()
	}
	mc.Name = Name(cfg.Role, cfg.ID)
	mc.BindAddr, mc.BindPort = host, p
	mc.AdvertiseAddr, mc.AdvertisePort = host, p
	mc.Logger = log.New(slogWriter{cfg.Logger}, "", 0)
	var q *queue
	if cfg.OnChange != nil {
		q = newQueue()
		mc.Events = events{q}
	}
	if cfg.Role == RoleFleet {
		mc.Delegate = meta(strconv.Itoa(cfg.Count))
	}
	if cfg.Wrap != nil {
		nt, err := memberlist.NewNetTransport(&memberlist.NetTransportConfig{BindAddrs: []string{host}, BindPort: p, Logger: mc.Logger})
		if err != nil {
			return nil, fmt.Errorf("gossip: %w", err)
		}
		mc.Transport = cfg.Wrap(nt)
	}
	ml, err := memberlist.Create(mc)
	if err != nil {
		return nil, fmt.Errorf("gossip: %w", err)
	}
	m := &Member{ml: ml, log: cfg.Logger, stop: make(chan struct{})}
	m.wg.Add(1)
	go m.joinLoop(cfg.Join, rejoinEvery)
	if q != nil {
		m.wg.Add(1)
		go m.deliver(q, cfg.OnChange)
	}
	return m, nil
}

// joinWarnAfter is how long the first gossip join may fail before it is
// logged above debug.
const joinWarnAfter = 10 * time.Second

// joinLoop joins through peers, retrying until one answers, and then,
// every period until Close, joins again through the peers that are not
// among the live members. memberlist probes and push-pulls only members
// it believes alive and gossips to the dead for GossipToTheDeadTime only,
// so after a partition longer than that both sides would see each other
// dead until one restarts. This is Serf's reconnect loop, limited to the
// peers we were told to join through.
func (m *Member) joinLoop(peers []string, period time.Duration) {
	defer m.wg.Done()
	var others []string
	for _, p := range peers {
		if p = strings.TrimSpace(p); p != "" {
			others = append(others, p)
		}
	}
	if len(others) == 0 {
		return
	}
	backoff := 100 * time.Millisecond
	start, warned := time.Now(), time.Time{}
	for {
		n, err := m.ml.Join(others)
		if n > 0 {
			m.log.Info("gossip joined", "contacted", n)
			break
		}
		// Above debug once it lasts (a wrong --join-gossip, a dead peer):
		// without gossip the servers have one failure signal, not two.
		if now := time.Now(); now.Sub(start) >= joinWarnAfter && now.Sub(warned) >= time.Minute {
			warned = now
			m.log.Warn("gossip join failing; retrying", "peers", others, "for", now.Sub(start).Round(time.Second), "err", err)
		} else {
			m.log.Debug("gossip join failed; retrying", "err", err)
		}
		select {
		case <-m.stop:
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 2*time.Second)
	}
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-m.stop:
			return
		case <-t.C:
		}
		missing := m.missing(others)
		if len(missing) == 0 {
			continue
		}
		if n, err := m.ml.Join(missing); n > 0 {
			m.log.Info("gossip rejoined", "peers", missing, "contacted", n)
		} else {
			m.log.Debug("gossip rejoin failed; retrying", "peers", missing, "err", err)
		}
	}
}

// missing returns the peers (HOST:PORT) that no live member has as its
// address. A peer named by host name counts as live if any of its
// addresses is; one that does not parse or resolve is missing, and Join
// reports why.
func (m *Member) missing(peers []string) []string {
	live := map[string]bool{}
	for _, n := range m.ml.Members() {
		live[n.Address()] = true
	}
	var out []string
	for _, p := range peers {
		host, port, err := net.SplitHostPort(p)
		if err != nil {
			out = append(out, p)
			continue
		}
		addrs := []string{host}
		if ip := net.ParseIP(host); ip != nil {
			addrs = []string{ip.String()}
		} else if addrs, err = net.LookupHost(host); err != nil {
			out = append(out, p)
			continue
		}
		if !slices.ContainsFunc(addrs, func(a string) bool { return live[net.JoinHostPort(a, port)] }) {
			out = append(out, p)
		}
	}
	return out
}

// Members returns the names of the members memberlist thinks are alive.
func (m *Member) Members() []string {
	var out []string
	for _, n := range m.ml.Members() {
		out = append(out, n.Name)
	}
	return out
}

// Close leaves the cluster (so others learn at once) and shuts down.
// Only the first call of Close or Kill does anything; later ones return nil.
func (m *Member) Close() error { return m.shut(true) }

// Kill shuts down without leaving, as a crash would (tests). Only the
// first call of Close or Kill does anything; later ones return nil.
func (m *Member) Kill() error { return m.shut(false) }

func (m *Member) shut(leave bool) error {
	var err error
	m.once.Do(func() {
		close(m.stop)
		m.wg.Wait()
		if leave {
			_ = m.ml.Leave(time.Second)
		}
		err = m.ml.Shutdown()
	})
	return err
}

// deliver calls fn for the queued changes until Close.
func (m *Member) deliver(q *queue, fn func(role, id string, alive bool)) {
	defer m.wg.Done()
	for {
		select {
		case <-m.stop:
			return
		case <-q.wake:
		}
		for _, c := range q.take() {
			select {
			case <-m.stop:
				return
			default:
			}
			c.tell(fn)
		}
	}
}

// change is a member seen alive, or dead or gone.
type change struct {
	name, meta string
	alive      bool
}

func (c change) tell(fn func(role, id string, alive bool)) {
	role, id, ok := Split(c.name)
	if !ok {
		return
	}
	if role == RoleFleet {
		count, _ := strconv.Atoi(c.meta)
		for i := 1; i <= count; i++ {
			fn(RoleNode, FleetNodeID(id, i), c.alive)
		}
		return
	}
	fn(role, id, c.alive)
}

// queue hands membership changes from memberlist to deliver. memberlist
// calls its event delegate holding its node lock, so OnChange must not
// run there: the scheduler's callback logs a line per simulated node, about a
// hundred per fleet member, and probes and gossip would wait for it.
// put never blocks (it takes only q.mu, which take holds for a moment),
// and the queue is bounded by the number of members: a member already
// queued has its entry replaced by its latest state rather than queued
// again, so a member that flaps between two deliveries is reported once,
// in its latest state. Nothing is dropped but such intermediate states.
type queue struct {
	mu      sync.Mutex
	pending []change       // oldest first, one per member
	index   map[string]int // member name -> its index in pending
	wake    chan struct{}  // capacity 1: something is pending
}

func newQueue() *queue {
	return &queue{index: map[string]int{}, wake: make(chan struct{}, 1)}
}

func (q *queue) put(c change) {
	q.mu.Lock()
	if i, ok := q.index[c.name]; ok {
		q.pending[i] = c
	} else {
		q.index[c.name] = len(q.pending)
		q.pending = append(q.pending, c)
	}
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default: // a wake-up is already pending
	}
}

// take returns the pending changes and empties the queue.
func (q *queue) take() []change {
	q.mu.Lock()
	defer q.mu.Unlock()
	out := q.pending
	q.pending = nil
	clear(q.index)
	return out
}

// events is memberlist's event delegate: it only queues.
type events struct{ q *queue }

func (e events) NotifyJoin(n *memberlist.Node)   { e.q.put(change{n.Name, string(n.Meta), true}) }
func (e events) NotifyLeave(n *memberlist.Node)  { e.q.put(change{n.Name, string(n.Meta), false}) }
func (e events) NotifyUpdate(n *memberlist.Node) {}

// meta is a memberlist delegate that only publishes node metadata.
type meta string

func (m meta) NodeMeta(limit int) []byte {
	if len(m) > limit {
		return nil
	}
	return []byte(m)
}
func (meta) NotifyMsg([]byte)                {}
func (meta) GetBroadcasts(int, int) [][]byte { return nil }
func (meta) LocalState(bool) []byte          { return nil }
func (meta) MergeRemoteState([]byte, bool)   {}

// slogWriter feeds memberlist's log lines ("[DEBUG] memberlist: ...") to
// slog at a matching level.
type slogWriter struct{ l *slog.Logger }

func (w slogWriter) Write(p []byte) (int, error) {
	s := strings.TrimSpace(string(p))
	level := slog.LevelDebug
	switch {
	case strings.HasPrefix(s, "[ERR]"):
		// memberlist logs every failed probe as an error; a death is
		// reported through the events, so these are warnings.
		level = slog.LevelWarn
	case strings.HasPrefix(s, "[WARN]"):
		level = slog.LevelInfo
	case strings.HasPrefix(s, "[INFO]"):
		level = slog.LevelInfo
	}
	if i := strings.Index(s, "] "); i >= 0 {
		s = s[i+2:]
	}
	if level <= slog.LevelInfo {
		level = slog.LevelDebug // memberlist is chatty
	}
	w.l.Log(nil, level, s, "component", "memberlist")
	return len(p), nil
}
