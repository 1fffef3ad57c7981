package noded

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"sync"

	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
	"github.com/warrenhq/warren/guest"
	"github.com/warrenhq/warren/netpolicy"
	"github.com/warrenhq/warren/noded/driver"
)

// Egress is the node's egress policy as drivers and APIs see it: it hands
// drivers networks (driver.Networks), binds a claimed sandbox's network to
// its id and policy, and routes each sandbox's egress audit to its task's
// event log (or the node's log for a sandbox-API sandbox).
type Egress struct {
	m   *netpolicy.Manager
	log *slog.Logger

	mu    sync.Mutex
	sinks map[string]func(netpolicy.AuditBatch) // by sandbox id
}

// NewEgress starts the node's egress policy.
func NewEgress(cfg netpolicy.Config) (*Egress, error) {
	e := &Egress{log: cfg.Logger, sinks: map[string]func(netpolicy.AuditBatch){}}
	if e.log == nil {
		e.log = slog.New(slog.DiscardHandler)
	}
	cfg.Audit = e.audit
	m, err := netpolicy.New(cfg)
	if err != nil {
		return nil, err
	}
	e.m = m
	return e, nil
}

// Close removes every network and the node's egress setup.
func (e *Egress) Close() error {
	if e == nil {
		return nil
	}
	return e.m.Close()
}

// denyPort adds a cluster port bound after the egress policy started.
func (e *Egress) denyPort(hostport string) {
	if e == nil {
		return
	}
	_, p, err := net.SplitHostPort(hostport)
	if err != nil {
		return
	}
	n, err := strconv.ParseUint(p, 10, 16)
	if err != nil || n == 0 {
		return
	}
	if err := e.m.AddClusterPorts(uint16(n)); err != nil {
		e.log.Warn("egress: deny the sandbox API's port", "port", n, "err", err)
	}
}

// Attach gives a new sandbox a network that allows nothing until bind.
func (e *Egress) Attach(ctx context.Context) (driver.Network, error) {
	return driver.PolicyNetworks{M: e.m}.Attach(ctx)
}

// TapGuestConfig is the guest side of every microVM sandbox's network.
func (e *Egress) TapGuestConfig() guest.NetConfig {
	return driver.PolicyNetworks{M: e.m}.TapGuestConfig()
}

// Reattach takes back, after a restart, a re-adopted sandbox's network.
func (e *Egress) Reattach(nsPath string) (driver.Network, error) {
	return driver.PolicyNetworks{M: e.m}.Reattach(nsPath)
}

// ReapOrphans removes the networks of an earlier run that no driver took
// back; call it once the driver has re-adopted its sandboxes.
func (e *Egress) ReapOrphans() error {
	if e == nil {
		return nil
	}
	return e.m.ReapOrphans()
}

// netOf returns a sandbox's egress network, if it has one.
func netOf(sb driver.Sandbox) (driver.PolicyNetwork, bool) {
	nw, ok := sb.(driver.Networked)
	if !ok || nw.Network() == nil {
		return driver.PolicyNetwork{}, false
	}
	n, ok := nw.Network().(driver.PolicyNetwork)
	return n, ok
}

// bind names sb's network, sets its policy, and sends its audit to sink
// (nil: the node's log). A sandbox without a network is left alone.
func (e *Egress) bind(sb driver.Sandbox, p netpolicy.Policy, sink func(netpolicy.AuditBatch)) error {
	n, ok := netOf(sb)
	if e == nil || !ok {
		return nil
	}
	// The sink first: a report made once Bind names the sandbox goes to
	// its sink, not the node's log. A nil sink means the node's log, as
	// for an unknown id: nothing to keep (and nothing left behind by a
	// sandbox whose TTL destroys it, which no one unbinds).
	if sink != nil {
		e.mu.Lock()
		e.sinks[sb.ID()] = sink
		e.mu.Unlock()
	}
	n.Bind(sb.ID())
	if err := n.SetPolicy(p); err != nil {
		if sink != nil {
			e.unbind(sb.ID())
		}
		return err
	}
	return nil
}

// unbind stops routing a sandbox's audit; a report being delivered
// finishes first.
func (e *Egress) unbind(id string) {
	if e == nil {
		return
	}
	e.mu.Lock()
	delete(e.sinks, id)
	e.mu.Unlock()
}

func (e *Egress) audit(id string, b netpolicy.AuditBatch) {
	// The sink runs under e.mu, so unbind returns only once no report is
	// in flight; sinks must not block.
	e.mu.Lock()
	if sink := e.sinks[id]; sink != nil {
		sink(b)
		e.mu.Unlock()
		return
	}
	e.mu.Unlock()
	deny := 0
	for _, ev := range b.Events {
		if ev.Verdict == "deny" {
			deny++
		}
	}
	e.log.Info("egress", "sandbox", id, "events", len(b.Events), "denied", deny, "omitted", b.Omitted, "first", b.Events[0])
}

// policyFromProto checks a policy from the API; errors name the field.
func policyFromProto(field string, p *warrenv1.EgressPolicy) (netpolicy.Policy, error) {
	out := netpolicy.Policy{Profile: p.GetProfile(), Allow: p.GetAllow()}
	for i, s := range p.GetAllowPrefixes() {
		pfx, err := netip.ParsePrefix(s)
		if err != nil {
			return netpolicy.Policy{}, fmt.Errorf("%s.allow_prefixes[%d]: %q is not a CIDR prefix", field, i, s)
		}
		out.AllowPrefixes = append(out.AllowPrefixes, pfx)
	}
	n, err := out.Normalize()
	if err != nil {
		return netpolicy.Policy{}, fmt.Errorf("%s.%w", field, err)
	}
	return n, nil
}

func policyToProto(p netpolicy.Policy) *warrenv1.EgressPolicy {
	out := &warrenv1.EgressPolicy{Profile: p.Profile, Allow: p.Allow}
	for _, pfx := range p.AllowPrefixes {
		out.AllowPrefixes = append(out.AllowPrefixes, pfx.String())
	}
	return out
}

// taskPolicy is the egress policy of a task's spec.
func taskPolicy(s *warrenv1.TaskSpec) (netpolicy.Policy, error) {
	return netpolicy.Policy{Profile: s.GetEgressProfile(), Allow: s.GetEgressAllow()}.Normalize()
}
