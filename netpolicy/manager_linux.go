package netpolicy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Config is a node's egress settings.
type Config struct {
	// Tag names what this manager owns, so several node daemons can share
	// a host: namespaces "warren-<tag>-<slot>", links "w<tag>-<slot>" and
	// the node table "warren-<tag>". At most 4 characters of [a-z0-9].
	Tag string
	// HostNS is the path of the namespace the node's uplink is in; "" is
	// the calling process's. Tests use a namespace of their own.
	HostNS string
	// Prefix4 and Prefix6 are the address pools; zero means
	// DefaultPrefix4 and DefaultPrefix6.
	Prefix4, Prefix6 netip.Prefix
	// Upstream is the resolver that allowed names are forwarded to,
	// host:port; "" means the first nameserver of /etc/resolv.conf.
	Upstream string
	// ClusterPorts are the cluster's ports (API, raft, gossip), denied on
	// every destination unless a policy allows the address.
	ClusterPorts []uint16
	// NodeAddrs are more addresses of the node to deny, besides those on
	// its links (found at start).
	NodeAddrs []netip.Addr
	// Registries replaces DefaultRegistries for the registries profile.
	// New normalizes them as Policy.Normalize does a policy's names.
	Registries []string
	// Pool is how many namespaces to keep ready.
	Pool int
	// AuditInterval is how often attempts are read and reported; 0 means 1s.
	AuditInterval time.Duration
	// Audit receives each sandbox's egress attempts, at most MaxAuditEvents
	// per interval (the rest summed into Omitted). It runs under the
	// sandbox's lock, so it must not block or call back into the sandbox.
	Audit func(sandbox string, b AuditBatch)
	// StateDir, if set, keeps each bound sandbox's id and policy, so that a
	// restarted node can take back the networks of the sandboxes its
	// driver re-adopts (Reattach) before it removes the rest
	// (ReapOrphans). Without it a start removes every namespace.
	StateDir string
	Logger   *slog.Logger

	// stateSaveEvery bounds how often a report rewrites a sandbox's
	// record (stateSaveEvery when 0); tests shorten it.
	stateSaveEvery time.Duration
}

// stateSaveEvery is how often at most the periodic audit rewrites a
// sandbox's record in StateDir with what it has reported. The record holds
// every attempt still in the audit sets (up to 4 x auditSize), so writing
// it at each report cost a rename of up to a megabyte every interval for a
// guest that kept hitting one destination. Bind, SetPolicy, Collect and
// Detach still write it at once; a node that crashes meanwhile reports
// again, after its restart, at most this long's worth of attempts (never
// fewer: the record is written only after the reports it holds).
const stateSaveEvery = 30 * time.Second

// Manager gives sandboxes their networks. Its methods are safe for
// concurrent use.
type Manager struct {
	cfg      Config
	log      *slog.Logger
	host     netns.NsHandle
	hostH    *netlink.Handle
	hostNFT  *nftables.Conn
	pool     pool
	resolver Slot
	denied   []netip.Addr // the node's own addresses
	dns      *resolver
	fwd      *forwardingState // what setupHost changed, to restore
	orphans  map[int]string   // slot → namespace kept from an earlier run, until Reattach or ReapOrphans
	claims   sync.WaitGroup   // Claims in flight, which Close waits for

	mu      sync.Mutex
	ports   []uint16         // the cluster ports, cfg's and those added since; the list only grows
	used    map[int]bool     // slots with a namespace
	claimed map[int]*Sandbox // by slot
	ready   []*Sandbox       // pre-created, unclaimed
	closed  bool
	refill  chan struct{}
	stop    chan struct{}
	wg      sync.WaitGroup
}

// ErrClosed is returned by a closed Manager.
var ErrClosed = errors.New("netpolicy: closed")

func (c Config) nsPrefix() string { return "warren-" + c.Tag + "-" }
func (c Config) ifPrefix() string { return "w" + c.Tag + "-" }
func (c Config) table() string    { return "warren-" + c.Tag }

// New sets the node up: it removes what an earlier run with the same tag
// left (namespaces, links, the node table), adds the resolver's link and
// the node table, starts the DNS resolver and fills the pool.
func New(cfg Config) (*Manager, error) {
	if cfg.Tag == "" || len(cfg.Tag) > 4 || strings.Trim(cfg.Tag, "abcdefghijklmnopqrstuvwxyz0123456789") != "" {
		return nil, fmt.Errorf("netpolicy: tag %q: want 1 to 4 characters of [a-z0-9]", cfg.Tag)
	}
	if cfg.Registries != nil {
		// Matcher compares names as Normalize leaves them: a registry
		// written "PyPI.org." would otherwise match no query.
		regs, err := normalizeNames("registries", cfg.Registries)
		if err != nil {
			return nil, fmt.Errorf("netpolicy: %w", err)
		}
		cfg.Registries = append([]string{}, regs...) // empty stays empty: nil means the defaults
	}
	if !cfg.Prefix4.IsValid() {
		cfg.Prefix4 = DefaultPrefix4
	}
	if !cfg.Prefix6.IsValid() {
		cfg.Prefix6 = DefaultPrefix6
	}
	p, err := newPool(cfg.Prefix4, cfg.Prefix6)
	if err != nil {
		return nil, fmt.Errorf("netpolicy: %w", err)
	}
	if cfg.AuditInterval <= 0 {
		cfg.AuditInterval = time.Second
	}
	if cfg.stateSaveEvery <= 0 {
		cfg.stateSaveEvery = stateSaveEvery
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Upstream == "" {
		up, err := systemResolver()
		if err != nil {
			return nil, fmt.Errorf("netpolicy: upstream: %w", err)
		}
		cfg.Upstream = up
	}
	m := &Manager{cfg: cfg, log: cfg.Logger, pool: p, resolver: p.slot(0),
		ports: cfg.ClusterPorts, used: map[int]bool{}, claimed: map[int]*Sandbox{}, refill: make(chan struct{}, 1), stop: make(chan struct{})}
	if cfg.HostNS == "" {
		m.host, err = netns.Get()
	} else {
		m.host, err = netns.GetFromPath(cfg.HostNS)
	}
	if err != nil {
		return nil, fmt.Errorf("netpolicy: host namespace: %w", err)
	}
	if m.hostH, err = netlink.NewHandleAt(m.host); err != nil {
		m.host.Close()
		return nil, fmt.Errorf("netpolicy: netlink: %w", err)
	}
	if m.hostNFT, err = nftables.New(nftables.WithNetNSFd(int(m.host))); err != nil {
		m.closeHandles()
		return nil, fmt.Errorf("netpolicy: nftables: %w", err)
	}
	if err := m.reconcile(); err != nil {
		m.closeHandles()
		return nil, err
	}
	if err := m.setupHost(); err != nil {
		m.teardownHost()
		m.closeHandles()
		return nil, err
	}
	if m.dns, err = startResolver(m); err != nil {
		m.teardownHost()
		m.closeHandles()
		return nil, err
	}
	m.wg.Add(2)
	go m.fill()
	go m.audit()
	m.kick()
	m.log.Info("egress policy ready", "tag", cfg.Tag, "resolver", m.resolver.Host4, "upstream", cfg.Upstream, "pool", cfg.Pool)
	return m, nil
}

// reconcile removes the namespaces, links and table an earlier run left.
func (m *Manager) reconcile() error {
	names, err := listNS(m.cfg.nsPrefix())
	if err != nil {
		return fmt.Errorf("netpolicy: list namespaces: %w", err)
	}
	// A sandbox's record whose namespace is gone (a reboot empties
	// /run/netns) is of no use, and a new sandbox in its slot would be
	// taken back under its id and policy after a crash: it goes.
	if m.cfg.StateDir != "" {
		ents, _ := os.ReadDir(m.cfg.StateDir)
		for _, e := range ents {
			name, ok := strings.CutSuffix(e.Name(), ".json")
			if ok && strings.HasPrefix(name, m.cfg.nsPrefix()) && !slices.Contains(names, name) {
				m.removeState(name)
			}
		}
	}
	// Namespaces of bound sandboxes wait for their drivers (Reattach);
	// the rest go now.
	m.orphans = map[int]string{}
	keepLinks := map[string]bool{}
	var gone []string
	for _, name := range names {
		slot, err := strconv.Atoi(strings.TrimPrefix(name, m.cfg.nsPrefix()))
		if m.cfg.StateDir != "" && err == nil && slot > 0 && slot <= m.pool.slots() && m.hasState(name) {
			m.orphans[slot] = name
			m.used[slot] = true
			keepLinks[m.cfg.ifPrefix()+strconv.Itoa(slot)] = true
			continue
		}
		gone = append(gone, name)
	}
	names = gone
	links, err := m.hostH.LinkList()
	if err != nil {
		return fmt.Errorf("netpolicy: list links: %w", err)
	}
	n := 0
	for _, l := range links {
		if strings.HasPrefix(l.Attrs().Name, m.cfg.ifPrefix()) && !keepLinks[l.Attrs().Name] {
			// Removing one end of a veth removes its peer too.
			if err := m.hostH.LinkDel(l); err != nil && !errors.Is(err, unix.ENODEV) {
				return fmt.Errorf("netpolicy: remove leftover link %s: %w", l.Attrs().Name, err)
			}
			n++
		}
	}
	for _, name := range names {
		if err := deleteNS(name); err != nil {
			return fmt.Errorf("netpolicy: remove leftover namespace: %w", err)
		}
		m.removeState(name)
		n++
	}
	if n > 0 || len(m.orphans) > 0 {
		m.log.Info("egress leftovers of an earlier run", "removed", n, "kept_for_reattach", len(m.orphans))
	}
	return deleteTable(m.hostNFT, m.cfg.table())
}

func (m *Manager) setupHost() error {
	// The resolver's addresses sit on a veth pair of their own (a dummy
	// link would do, but not every kernel has the module).
	name := m.cfg.ifPrefix() + "dns"
	if err := m.hostH.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: m.cfg.ifPrefix() + "dnp"}); err != nil {
		return fmt.Errorf("netpolicy: resolver link %s: %w", name, err)
	}
	l, err := m.hostH.LinkByName(name)
	if err != nil {
		return err
	}
	peer, err := m.hostH.LinkByName(m.cfg.ifPrefix() + "dnp")
	if err == nil {
		err = m.hostH.LinkSetUp(peer)
	}
	if err != nil {
		return fmt.Errorf("netpolicy: resolver link %s: peer: %w", name, err)
	}
	for _, a := range []netip.Addr{m.resolver.Host4, m.resolver.Host6} {
		if err := m.hostH.AddrAdd(l, prefixOf(a, a.BitLen())); err != nil {
			return fmt.Errorf("netpolicy: resolver address %v: %w", a, err)
		}
	}
	if err := m.hostH.LinkSetUp(l); err != nil {
		return err
	}
	prev, err := m.loadForwarding()
	if err != nil {
		return err
	}
	if err := inNS(m.host, func() (err error) {
		m.fwd, err = hostForwarding(prev)
		return err
	}); err != nil {
		return fmt.Errorf("netpolicy: %w", err)
	}
	if err := m.saveForwarding(); err != nil {
		return err
	}
	addrs, err := nodeAddrs(m.hostH)
	if err != nil {
		return fmt.Errorf("netpolicy: node addresses: %w", err)
	}
	for _, a := range append(addrs, m.cfg.NodeAddrs...) {
		if a != m.resolver.Host4 && a != m.resolver.Host6 {
			m.denied = append(m.denied, a)
		}
	}
	return installHostRules(m.hostNFT, m.cfg.table(), m.cfg.ifPrefix(), m.resolver, m.pool.p4, m.pool.p6, m.fwd.Router4, m.fwd.Router6)
}

// forwardingFile keeps the node's forwarding sysctls as they were before
// the manager's first start (forwardingState), in StateDir.
func (m *Manager) forwardingFile() string {
	if m.cfg.StateDir == "" {
		return ""
	}
	return filepath.Join(m.cfg.StateDir, "forwarding.json")
}

// loadForwarding reads what an earlier run left in forwardingFile (nil:
// nothing, the sysctls are as the node has them).
func (m *Manager) loadForwarding() (*forwardingState, error) {
	p := m.forwardingFile()
	if p == "" {
		return nil, nil
	}
	b, err := os.ReadFile(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("netpolicy: %w", err)
	}
	var st forwardingState
	if err := json.Unmarshal(b, &st); err != nil {
		// Not ours to guess: the node's own values would be read as
		// the last run left them.
		return nil, fmt.Errorf("netpolicy: %s: %v (remove it if the node's forwarding sysctls are as they should be)", p, err)
	}
	return &st, nil
}

// saveForwarding writes m.fwd to forwardingFile before anything depends
// on it; an unchanged node (a router, or one with nothing to change)
// still records that it was a router.
func (m *Manager) saveForwarding() error {
	p := m.forwardingFile()
	if p == "" {
		return nil
	}
	b, err := json.Marshal(m.fwd)
	if err != nil {
		return err
	}
	if err := m.writeStateFile(p, b); err != nil {
		return fmt.Errorf("netpolicy: %w", err)
	}
	return nil
}

func (m *Manager) teardownHost() {
	if l, err := m.hostH.LinkByName(m.cfg.ifPrefix() + "dns"); err == nil {
		m.hostH.LinkDel(l)
	}
	deleteTable(m.hostNFT, m.cfg.table())
	if m.fwd != nil {
		if err := inNS(m.host, func() error { return restoreSysctls(m.fwd.Changed) }); err != nil {
			m.log.Warn("egress: restore forwarding sysctls", "err", err)
		} else if p := m.forwardingFile(); p != "" {
			_ = os.Remove(p) // restored: the next start reads the node again
		}
	}
}

func (m *Manager) closeHandles() {
	if m.hostNFT != nil {
		m.hostNFT.CloseLasting()
	}
	m.hostH.Close()
	m.host.Close()
}

// Close tears down every sandbox network, the pool, the resolver and the
// node table.
func (m *Manager) Close() error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil
	}
	m.closed = true
	sbs := append([]*Sandbox{}, m.ready...)
	for _, s := range m.claimed {
		sbs = append(sbs, s)
	}
	m.ready = nil
	m.mu.Unlock()
	close(m.stop)
	m.wg.Wait()
	m.claims.Wait() // a Claim past its check finishes (and sees closed) first
	m.dns.close()
	var errs []error
	for _, s := range sbs {
		errs = append(errs, s.teardown())
	}
	errs = append(errs, m.ReapOrphans())
	m.teardownHost()
	m.closeHandles()
	return errors.Join(errs...)
}

// Sandbox is one sandbox's network: a namespace wired to the node, with its
// rules installed.
type Sandbox struct {
	m    *Manager
	slot Slot
	name string // namespace
	ns   netns.NsHandle
	nft  *nftables.Conn
	sets *nftSets

	mu      sync.Mutex
	id      string
	policy  Policy
	matcher *Matcher
	seen    map[attemptKey]uint64 // packets reported so far
	// unsaved says seen has advanced since the record in StateDir was
	// written (at savedAt); the periodic report writes it at most every
	// cfg.stateSaveEvery.
	unsaved bool
	savedAt time.Time
	// pending holds the events not yet reported that no audit set counts:
	// resolver decisions (noteDNS) and audit_full notes (noteFull).
	pending []AuditEvent
	// auditFull holds the audit sets reported full (noteFull) that were
	// still full at the last read.
	auditFull map[string]bool
	closed    bool
	// ports is how many of the manager's cluster ports (a list that only
	// grows) the table denies.
	ports int
	// gen counts policy changes: a lookup that began under an older policy
	// does not open the allow sets.
	gen uint64
	// allowed is when each address the resolver handed out leaves the
	// allow sets (its TTL), so a later answer can extend it.
	allowed map[netip.Addr]time.Time
	// queries bounds the resolver's queries in flight for this sandbox,
	// taken before anything waits (maxQueries).
	queries chan struct{}
	// lookups bounds the resolver's upstream calls in flight for this
	// sandbox.
	lookups chan struct{}
}

// Claim gives sandbox id a network with policy p: a pre-created one when
// the pool has one, else a new one.
func (m *Manager) Claim(ctx context.Context, id string, p Policy) (*Sandbox, error) {
	p, err := p.Normalize()
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil, ErrClosed
	}
	m.claims.Add(1)
	defer m.claims.Done()
	var s *Sandbox
	if n := len(m.ready); n > 0 {
		s, m.ready = m.ready[n-1], m.ready[:n-1]
	}
	m.mu.Unlock()
	if s == nil {
		if s, err = m.create(); err != nil {
			return nil, err
		}
	}
	m.kick()
	s.mu.Lock()
	s.id = id
	s.mu.Unlock()
	if err := s.SetPolicy(p); err != nil {
		s.teardown()
		return nil, err
	}
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		s.teardown()
		return nil, ErrClosed
	}
	m.claimed[s.slot.Index] = s
	m.mu.Unlock()
	// AddClusterPorts updates the pool and the claimed sandboxes; s was
	// in neither while it was bound (or created), so it may have missed
	// a port.
	if err := s.syncPorts(); err != nil {
		s.teardown()
		return nil, fmt.Errorf("netpolicy: sandbox network %s: cluster ports: %w", s.name, err)
	}
	return s, nil
}

// create makes one namespace, wires it and installs the rules of the
// default policy.
func (m *Manager) create() (*Sandbox, error) {
	m.mu.Lock()
	idx := 0
	for i := 1; i <= m.pool.slots(); i++ {
		if !m.used[i] {
			idx = i
			break
		}
	}
	if idx == 0 {
		m.mu.Unlock()
		return nil, fmt.Errorf("netpolicy: the address pools %v and %v hold %d sandboxes, and all are in use", m.pool.p4, m.pool.p6, m.pool.slots())
	}
	m.used[idx] = true
	m.mu.Unlock()
	s := &Sandbox{m: m, slot: m.pool.slot(idx), name: m.cfg.nsPrefix() + strconv.Itoa(idx), ns: netns.None(), seen: map[attemptKey]uint64{},
		allowed: map[netip.Addr]time.Time{}, lookups: make(chan struct{}, maxLookups),
		queries: make(chan struct{}, maxQueries)}
	var err error
	if s.ns, err = createNS(s.name); err != nil {
		m.release(idx)
		return nil, fmt.Errorf("netpolicy: %w", err)
	}
	fail := func(err error) (*Sandbox, error) {
		s.teardown()
		return nil, fmt.Errorf("netpolicy: sandbox network %s: %w", s.name, err)
	}
	if err := wireSlot(m.hostH, s.ns, s.hostIf(), s.slot); err != nil {
		return fail(err)
	}
	if s.nft, err = nftables.New(nftables.WithNetNSFd(int(s.ns)), nftables.AsLasting()); err != nil {
		return fail(err)
	}
	def, _ := Policy{}.Normalize()
	ports := m.clusterPorts()
	if s.sets, err = installRules(s.nft, m.rulesWith(ports, def)); err != nil {
		return fail(err)
	}
	s.policy, s.matcher, s.ports = def, def.Matcher(m.cfg.Registries), len(ports)
	return s, nil
}

// clusterPorts is the cluster's ports so far. AddClusterPorts replaces
// the list rather than append in place, so the caller may keep it.
func (m *Manager) clusterPorts() []uint16 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.ports
}

func (m *Manager) rules(p Policy) Rules { return m.rulesWith(m.clusterPorts(), p) }

func (m *Manager) rulesWith(ports []uint16, p Policy) Rules {
	return computeRules(m.resolver, m.denied, []netip.Prefix{m.pool.p4, m.pool.p6}, ports, p)
}

// AddClusterPorts denies more of the cluster's ports (one bound after the
// manager started, such as the node's sandbox API on a port the kernel
// picked) to every sandbox, live and future. A sandbox that is in neither
// the pool nor the claimed ones now (a Claim is binding it, or the pool is
// creating it) catches up when its Claim puts it with the claimed.
func (m *Manager) AddClusterPorts(ports ...uint16) error {
	m.mu.Lock()
	// Not in m.cfg, which others read without the lock.
	m.ports = append(slices.Clone(m.ports), ports...)
	sbs := slices.Clone(m.ready)
	for _, s := range m.claimed {
		sbs = append(sbs, s)
	}
	m.mu.Unlock()
	var errs []error
	for _, s := range sbs {
		errs = append(errs, s.syncPorts())
	}
	return errors.Join(errs...)
}

// syncPorts adds to the sandbox's table the cluster ports added since it
// was made.
func (s *Sandbox) syncPorts() error {
	ports := s.m.clusterPorts()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || len(ports) <= s.ports {
		return nil
	}
	if err := addPorts(s.nft, s.sets, ports[s.ports:]); err != nil {
		return err
	}
	s.ports = len(ports)
	return nil
}

func (m *Manager) release(idx int) {
	m.mu.Lock()
	delete(m.used, idx)
	delete(m.claimed, idx)
	m.mu.Unlock()
}

func (m *Manager) kick() {
	select {
	case m.refill <- struct{}{}:
	default:
	}
}

// fill keeps cfg.Pool namespaces ready.
func (m *Manager) fill() {
	defer m.wg.Done()
	for {
		select {
		case <-m.stop:
			return
		case <-m.refill:
		}
		for {
			m.mu.Lock()
			short := !m.closed && len(m.ready) < m.cfg.Pool
			m.mu.Unlock()
			if !short {
				break
			}
			s, err := m.create()
			if err != nil {
				m.log.Warn("egress pool: create namespace", "err", err)
				break
			}
			m.mu.Lock()
			if m.closed {
				m.mu.Unlock()
				s.teardown()
				return
			}
			m.ready = append(m.ready, s)
			m.mu.Unlock()
		}
	}
}

// Resolver is the slot whose node-side addresses the DNS resolver
// listens on.
func (m *Manager) Resolver() Slot { return m.resolver }

// Ready is how many pre-created namespaces are waiting.
func (m *Manager) Ready() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.ready)
}

// bySource finds the claimed sandbox whose address a is.
func (m *Manager) bySource(a netip.Addr) *Sandbox {
	i, ok := m.pool.slotOf(a)
	if !ok {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.claimed[i]
}

func (s *Sandbox) hostIf() string { return s.m.cfg.ifPrefix() + strconv.Itoa(s.slot.Index) }

// Bind names the sandbox a pre-attached network belongs to; its audit is
// reported under that id from then on.
func (s *Sandbox) Bind(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.id = id
	s.saveState()
}

// ID is the sandbox's id.
func (s *Sandbox) ID() string { s.mu.Lock(); defer s.mu.Unlock(); return s.id }

// NSPath is the namespace's path, for a container runtime to join.
func (s *Sandbox) NSPath() string { return filepath.Join(netnsDir, s.name) }

// Slot is the sandbox's addresses.
func (s *Sandbox) Slot() Slot { return s.slot }

// Policy is the policy in force.
func (s *Sandbox) Policy() Policy { s.mu.Lock(); defer s.mu.Unlock(); return s.policy }

// GuestNet is how a sandbox configures its side: a microVM's guest sets
// these on its NIC; a container finds eth0 configured and needs only DNS.
type GuestNet struct {
	Addr4, Gateway4 netip.Prefix
	Addr6, Gateway6 netip.Prefix
	DNS             []netip.Addr
}

// Guest returns the guest's network settings: for a microVM (tap) the
// guest link's addresses; for a container the slot's own.
func (s *Sandbox) Guest(tap bool) GuestNet {
	if tap {
		return s.m.GuestTap()
	}
	g := GuestNet{DNS: s.m.dnsAddrs()}
	g.Addr4, g.Gateway4 = netip.PrefixFrom(s.slot.Sandbox4, 30), netip.PrefixFrom(s.slot.Host4, 30)
	g.Addr6, g.Gateway6 = netip.PrefixFrom(s.slot.Sandbox6, 126), netip.PrefixFrom(s.slot.Host6, 126)
	return g
}

// GuestTap is the guest's side of every microVM sandbox's network on this
// node: each guest sits behind a tap in a namespace of its own, so all of
// them have the same link addresses, and the node's resolver. A snapshot
// can carry it, so clones need not set it at their claim.
func (m *Manager) GuestTap() GuestNet {
	return GuestNet{DNS: m.dnsAddrs(),
		Addr4: netip.PrefixFrom(GuestAddr4, 30), Gateway4: netip.PrefixFrom(GuestGateway4, 30),
		Addr6: netip.PrefixFrom(GuestAddr6, 126), Gateway6: netip.PrefixFrom(GuestGateway6, 126)}
}

func (m *Manager) dnsAddrs() []netip.Addr { return []netip.Addr{m.resolver.Host4, m.resolver.Host6} }

// OpenTap creates the microVM link in the namespace and returns its file
// for the VMM (QEMU's -netdev tap,fd=N). Call it at most once.
func (s *Sandbox) OpenTap() (*os.File, error) { return openTap(s.ns) }

// SetPolicy changes the policy of a live sandbox. New connections follow
// it at once; addresses the resolver let through under the old policy are
// forgotten, and established connections keep going.
func (s *Sandbox) SetPolicy(p Policy) error {
	p, err := p.Normalize()
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	// The kernel first, in one batch: if it refuses, the sandbox keeps
	// the old policy whole (its resolver answering by the new one while
	// its rules were the old would report a policy not in force).
	if err := setAllowPrefixes(s.nft, s.sets, s.m.rules(p)); err != nil {
		return err
	}
	s.policy, s.matcher = p, p.Matcher(s.m.cfg.Registries)
	s.gen++
	clear(s.allowed) // the batch emptied the allow sets
	s.saveState()
	return nil
}

// Close tears the sandbox's network down: its link to the node goes at once,
// the namespace (with its rules) when the last process in it exits.
func (s *Sandbox) Close() error {
	// What it tried since the last report (up to an audit interval)
	// goes out first: a sandbox's audit ends with its last attempts.
	s.report(s.m)
	err := s.teardown()
	s.m.kick()
	return err
}

func (s *Sandbox) teardown() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	var errs []error
	if l, err := s.m.hostH.LinkByName(s.hostIf()); err == nil {
		if err := s.m.hostH.LinkDel(l); err != nil {
			errs = append(errs, fmt.Errorf("remove link %s: %w", s.hostIf(), err))
		}
	}
	if s.nft != nil {
		s.nft.CloseLasting()
	}
	if s.ns.IsOpen() {
		s.ns.Close()
	}
	if err := deleteNS(s.name); err != nil {
		errs = append(errs, err)
	}
	s.m.removeState(s.name)
	if len(errs) > 0 {
		// The slot stays taken: its name or addresses may still be in
		// use. The next start's reconcile frees it.
		s.m.mu.Lock()
		delete(s.m.claimed, s.slot.Index)
		s.m.mu.Unlock()
		return errors.Join(errs...)
	}
	s.m.release(s.slot.Index)
	return nil
}

// audit reads every claimed sandbox's audit sets each interval and reports
// what changed.
func (m *Manager) audit() {
	defer m.wg.Done()
	t := time.NewTicker(m.cfg.AuditInterval)
	defer t.Stop()
	for {
		select {
		case <-m.stop:
			return
		case <-t.C:
		}
		m.mu.Lock()
		sbs := make([]*Sandbox, 0, len(m.claimed))
		for _, s := range m.claimed {
			sbs = append(sbs, s)
		}
		m.mu.Unlock()
		for _, s := range sbs {
			s.report(m)
		}
	}
}

// report reads one sandbox's attempts since the last report and hands them
// to the audit sink. It delivers under the sandbox's lock, so a Collect
// that returns has seen every earlier report delivered: a report read
// before it cannot reach the sink after it.
func (s *Sandbox) report(m *Manager) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b, err := s.collect()
	if err != nil {
		m.log.Debug("egress audit", "sandbox", s.id, "err", err)
		return
	}
	if len(b.Events) > 0 {
		if m.cfg.Audit != nil {
			m.cfg.Audit(s.id, b)
		}
		for _, e := range b.Events {
			if e.Kind == "connect" {
				s.unsaved = true // seen advanced
				break
			}
		}
	}
	// After the delivery: a node that dies in between reports it again
	// rather than never. Not at every report: the record holds all of
	// seen, and an attempt reported again after a crash costs only a
	// repeated event, so a record that lags is written when
	// stateSaveEvery has passed since the last write (at a later report
	// if this one has nothing new).
	if s.unsaved && time.Since(s.savedAt) >= m.cfg.stateSaveEvery {
		s.saveState()
	}
}

// maxCollectReads bounds Collect's reads of the audit sets. Each read is
// reported in full, however many batches it takes (the sets hold up to
// 4 x auditSize attempts); a further read takes what the sandbox tried
// meanwhile, so the bound is reached only when it keeps trying new
// destinations during the collect.
const maxCollectReads = 8

// Collect returns every attempt not reported yet, now instead of at the
// next interval, in batches of at most MaxAuditEvents: a task calls it
// before it ends, so its last attempts are on its log. Every report read
// before the call has been delivered to the audit sink when it returns.
func (s *Sandbox) Collect() ([]AuditBatch, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, ErrClosed
	}
	var out []AuditBatch
	for range maxCollectReads {
		now, full, err := readAttempts(s.nft, s.sets)
		if err != nil {
			return out, err
		}
		s.noteFull(full)
		// One read, many batches: reading the sets again for each batch
		// would cost a full dump per 32 events, under the lock the
		// resolver and the periodic report wait for.
		n := len(out)
		for {
			b, left := summarise(s.seen, now, s.pending)
			s.pending = left
			if len(b.Events) > 0 {
				out = append(out, b)
			}
			if b.Omitted == 0 {
				break
			}
		}
		if len(out) == n {
			break // nothing new since the last read
		}
	}
	if len(out) > 0 {
		s.saveState()
	}
	return out, nil
}

// collect reads the sandbox's attempts since the last call; s.mu is held.
func (s *Sandbox) collect() (AuditBatch, error) {
	if s.closed {
		return AuditBatch{}, ErrClosed
	}
	now, full, err := readAttempts(s.nft, s.sets)
	if err != nil {
		return AuditBatch{}, err
	}
	s.noteFull(full)
	b, left := summarise(s.seen, now, s.pending)
	s.pending = left
	return b, nil
}

// noteFull queues an audit_full event for each audit set that has become
// full since the last read (s.mu held): until its entries expire, the
// attempts to destinations not in it are filtered but not recorded, and
// the task's log says so once, rather than going quiet.
func (s *Sandbox) noteFull(full []auditSet) {
	if s.auditFull == nil {
		s.auditFull = map[string]bool{}
	}
	now := map[string]bool{}
	for _, f := range full {
		now[f.name] = true
		if s.auditFull[f.name] {
			continue
		}
		s.auditFull[f.name] = true
		verdict, family := "deny", "IPv4"
		if f.allowed {
			verdict = "allow"
		}
		if f.v6 {
			family = "IPv6"
		}
		s.pending = append(s.pending, AuditEvent{Verdict: verdict, Kind: "audit_full", Count: 1,
			Reason: fmt.Sprintf("%d distinct %s destinations (%s) in %v: attempts to others are filtered but not recorded until these expire",
				auditSize, family, verdict, auditTTL)})
	}
	for name := range s.auditFull {
		if !now[name] {
			delete(s.auditFull, name)
		}
	}
}

// maxPendingDNS bounds the notes a sandbox keeps between reports (its
// resolver decisions, and the few audit_full notes beside them), so a
// flood of distinct names cannot grow the node's memory.
const maxPendingDNS = 4 * MaxAuditEvents

// noteDNS queues a resolver decision for the next report, merging repeats.
// Past maxPendingDNS distinct decisions, a further one is not dropped: it
// is counted in an event without a name, one per verdict and reason.
func (s *Sandbox) noteDNS(e AuditEvent) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range s.pending {
		if d := &s.pending[i]; d.Name == e.Name && d.Verdict == e.Verdict && d.Reason == e.Reason {
			d.Count++
			return
		}
	}
	if len(s.pending) >= maxPendingDNS {
		e.Name = ""
		for i := range s.pending {
			if d := &s.pending[i]; d.Name == "" && d.Verdict == e.Verdict && d.Reason == e.Reason {
				d.Count++
				return
			}
		}
	}
	e.Count = 1
	s.pending = append(s.pending, e)
}
