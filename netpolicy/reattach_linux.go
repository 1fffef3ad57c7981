package netpolicy

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"net/netip"

	"github.com/google/nftables"
	"github.com/vishvananda/netns"
)

// A node that restarts while its microVMs keep running takes their
// networks back: each bound sandbox's id, policy and audit progress are
// kept in Config.StateDir; at start, namespaces with such a record stay (with their
// veths, rules and allow sets) until the driver re-adopts the sandbox and
// calls Reattach, or ReapOrphans removes them.

type sandboxState struct {
	ID     string `json:"id"`
	Policy Policy `json:"policy"`
	// Seen is what the audit has reported of the attempts in the audit
	// sets, which outlive the node, so a restarted node does not report
	// them again.
	Seen []seenAttempt `json:"seen,omitempty"`
}

// seenAttempt is one entry of Sandbox.seen.
type seenAttempt struct {
	Allowed bool       `json:"allowed,omitempty"`
	Addr    netip.Addr `json:"addr"`
	Proto   uint8      `json:"proto"`
	Port    uint16     `json:"port,omitempty"`
	Packets uint64     `json:"packets"`
}

func (m *Manager) statePath(name string) string {
	return filepath.Join(m.cfg.StateDir, name+".json")
}

func (m *Manager) hasState(name string) bool {
	_, err := os.Stat(m.statePath(name))
	return err == nil
}

// saveState records a bound sandbox's id, policy and what its audit has
// reported (s.mu held): at once when the id or the policy changes, at
// Collect and Detach, and from the periodic report at most every
// stateSaveEvery. A closed sandbox's record is left alone: its
// teardown removes it, and Detach saves before it closes.
func (s *Sandbox) saveState() {
	if s.id == "" || s.closed {
		return
	}
	st := sandboxState{ID: s.id, Policy: s.policy}
	for k, n := range s.seen {
		st.Seen = append(st.Seen, seenAttempt{Allowed: k.allowed, Addr: k.addr, Proto: k.proto, Port: k.port, Packets: n})
	}
	// A failed write is tried again at the next report after
	// stateSaveEvery.
	s.unsaved, s.savedAt = !s.m.writeState(s.name, st), time.Now()
}

// writeState writes a sandbox's record (write, then rename). A failure
// only costs the network, or a repeated audit, after a restart, so it is
// logged; it returns whether the record was written.
func (m *Manager) writeState(name string, st sandboxState) bool {
	if m.cfg.StateDir == "" {
		return true
	}
	b, _ := json.Marshal(st)
	if err := m.writeStateFile(m.statePath(name), b); err != nil {
		m.log.Warn("egress: keep sandbox state", "namespace", name, "err", err)
		return false
	}
	return true
}

// writeStateFile writes a file of StateDir (write, then rename), making
// the directory if need be.
func (m *Manager) writeStateFile(path string, b []byte) error {
	if err := os.MkdirAll(m.cfg.StateDir, 0o700); err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func (m *Manager) removeState(name string) {
	if m.cfg.StateDir != "" {
		os.Remove(m.statePath(name))
	}
}

// Reattach takes back the network at nsPath that an earlier run of this
// node left to a sandbox the driver has re-adopted: its namespace, veth,
// connections, allow sets and audit sets are as they were; its id and
// policy come from StateDir, with what the audit had reported, so it is
// not reported again. Its rules are this run's: the earlier run may have
// been an older binary, or had other node addresses or cluster ports, so
// the table is rebuilt in one batch (rebuildRules).
func (m *Manager) Reattach(nsPath string) (*Sandbox, error) {
	name := filepath.Base(nsPath)
	slot, err := strconv.Atoi(strings.TrimPrefix(name, m.cfg.nsPrefix()))
	if err != nil || !strings.HasPrefix(name, m.cfg.nsPrefix()) {
		return nil, fmt.Errorf("netpolicy: %s is not one of this node's namespaces", nsPath)
	}
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil, ErrClosed
	}
	if m.orphans[slot] != name {
		m.mu.Unlock()
		return nil, fmt.Errorf("netpolicy: %s was not kept from an earlier run", name)
	}
	delete(m.orphans, slot)
	m.mu.Unlock()
	s := &Sandbox{m: m, slot: m.pool.slot(slot), name: name, ns: netns.None(), seen: map[attemptKey]uint64{},
		allowed: map[netip.Addr]time.Time{}, lookups: make(chan struct{}, maxLookups),
		queries: make(chan struct{}, maxQueries)}
	fail := func(err error) (*Sandbox, error) {
		s.teardown()
		return nil, fmt.Errorf("netpolicy: reattach %s: %w", name, err)
	}
	b, err := os.ReadFile(m.statePath(name))
	if err != nil {
		return fail(err)
	}
	var st sandboxState
	if err := json.Unmarshal(b, &st); err != nil {
		return fail(err)
	}
	if st.Policy, err = st.Policy.Normalize(); err != nil {
		return fail(err)
	}
	if s.ns, err = netns.GetFromPath(s.NSPath()); err != nil {
		return fail(err)
	}
	if s.nft, err = nftables.New(nftables.WithNetNSFd(int(s.ns)), nftables.AsLasting()); err != nil {
		return fail(err)
	}
	s.sets = newSets() // the table's sets, by name
	if _, err := s.nft.GetSetByName(s.sets.table, s.sets.allow4.Name); err != nil {
		return fail(fmt.Errorf("its table is gone: %w", err))
	}
	s.id, s.policy, s.matcher = st.ID, st.Policy, st.Policy.Matcher(m.cfg.Registries)
	// What the allow sets hold, until when: the rebuilt table gets them
	// back with the time they have left. And else the first lookup of an
	// address still there would add it again, which a kernel that keeps
	// an element's first timeout ignores, while s.allowed would record
	// the later time and skip the renewals that follow (see allow).
	if err := s.loadAllowed(); err != nil {
		return fail(fmt.Errorf("read its allow sets: %w", err))
	}
	ports := m.clusterPorts()
	sets, kept, err := rebuildRules(s.nft, m.rulesWith(ports, st.Policy), s.allowed)
	if err != nil {
		return fail(fmt.Errorf("rebuild its rules: %w", err))
	}
	s.sets, s.ports = sets, len(ports)
	if !kept {
		m.log.Warn("egress: taken-back network's audit sets replaced; attempts not reported before the restart are lost", "sandbox", st.ID, "namespace", name)
	}
	for _, a := range st.Seen {
		s.seen[attemptKey{a.Allowed, a.Addr, a.Proto, a.Port}] = a.Packets
	}
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return fail(ErrClosed)
	}
	m.claimed[slot] = s
	m.mu.Unlock()
	// The ports added since rulesWith read them.
	if err := s.syncPorts(); err != nil {
		return fail(fmt.Errorf("cluster ports: %w", err))
	}
	m.log.Info("egress: network taken back", "sandbox", s.id, "namespace", name, "profile", s.policy.Profile)
	return s, nil
}

// loadAllowed fills s.allowed from the kernel's allow sets.
func (s *Sandbox) loadAllowed() error {
	now := time.Now()
	for _, set := range []*nftables.Set{s.sets.allow4, s.sets.allow6} {
		els, err := s.nft.GetSetElements(set)
		if err != nil {
			return err
		}
		for _, el := range els {
			a, ok := netip.AddrFromSlice(el.Key)
			if !ok || el.Expires <= 0 {
				continue
			}
			s.allowed[a.Unmap()] = now.Add(el.Expires)
		}
	}
	return nil
}

// ReapOrphans removes the networks kept from an earlier run that no driver
// took back. Call it once the drivers have re-adopted what they will.
func (m *Manager) ReapOrphans() error {
	m.mu.Lock()
	orphans := m.orphans
	m.orphans = map[int]string{}
	m.mu.Unlock()
	var errs []error
	for slot, name := range orphans {
		s := &Sandbox{m: m, slot: m.pool.slot(slot), name: name, ns: netns.None()}
		errs = append(errs, s.teardown())
	}
	if len(orphans) > 0 {
		m.log.Info("egress: removed networks no sandbox took back", "count", len(orphans))
	}
	return errors.Join(errs...)
}

// Detach stops the manager but leaves the networks of bound sandboxes in
// place (namespaces, veths, rules, allow sets and StateDir), for the next
// start to take back: a node upgraded in place, whose driver detaches from
// its running sandboxes too. Pooled namespaces are removed. The node's
// table and resolver link are replaced at the next start; forwarding stays
// on meanwhile.
func (m *Manager) Detach() {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return
	}
	m.closed = true
	pool := m.ready
	m.ready = nil
	var bound []*Sandbox
	for _, s := range m.claimed {
		bound = append(bound, s)
	}
	m.mu.Unlock()
	close(m.stop)
	m.wg.Wait()
	m.claims.Wait()
	m.dns.close()
	for _, s := range pool {
		s.teardown()
	}
	for _, s := range bound {
		s.mu.Lock()
		if !s.closed {
			s.saveState() // what the reports since the last write added
			s.closed = true
			s.nft.CloseLasting()
			s.ns.Close()
		}
		s.mu.Unlock()
	}
	m.closeHandles()
}
