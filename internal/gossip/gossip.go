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
	"strconv"
	"strings"
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
	// leaves (alive false). It runs on memberlist's goroutine: keep it short.
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
	done chan struct{}
}

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
	mc.Events = events{cfg.OnChange}
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
	m := &Member{ml: ml, log: cfg.Logger, stop: make(chan struct{}), done: make(chan struct{})}
	go m.joinLoop(cfg.Join)
	return m, nil
}

func (m *Member) joinLoop(peers []string) {
	defer close(m.done)
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
	for {
		n, err := m.ml.Join(others)
		if n > 0 {
			m.log.Info("gossip joined", "contacted", n)
			return
		}
		m.log.Debug("gossip join failed; retrying", "err", err)
		select {
		case <-m.stop:
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 2*time.Second)
	}
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
func (m *Member) Close() error {
	close(m.stop)
	<-m.done
	_ = m.ml.Leave(time.Second)
	return m.ml.Shutdown()
}

// Kill shuts down without leaving, as a crash would (tests).
func (m *Member) Kill() error {
	close(m.stop)
	<-m.done
	return m.ml.Shutdown()
}

type events struct {
	fn func(role, id string, alive bool)
}

func (e events) tell(n *memberlist.Node, alive bool) {
	if e.fn == nil {
		return
	}
	role, id, ok := Split(n.Name)
	if !ok {
		return
	}
	if role == RoleFleet {
		count, _ := strconv.Atoi(string(n.Meta))
		for i := 1; i <= count; i++ {
			e.fn(RoleNode, FleetNodeID(id, i), alive)
		}
		return
	}
	e.fn(role, id, alive)
}

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

func (e events) NotifyJoin(n *memberlist.Node)   { e.tell(n, true) }
func (e events) NotifyLeave(n *memberlist.Node)  { e.tell(n, false) }
func (e events) NotifyUpdate(n *memberlist.Node) {}

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
