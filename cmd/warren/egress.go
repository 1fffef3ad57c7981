package main

import (
	"errors"
	"flag"
	"fmt"
	"hash/fnv"
	"net"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strconv"

	"github.com/warrenhq/warren/netpolicy"
	"github.com/warrenhq/warren/noded"
)

// egressFlags are the node's egress-policy flags.
type egressFlags struct {
	mode, prefix4, prefix6, upstream, registries, ports, nodeAddrs string
	pool                                                           int
	mgr                                                            *noded.Egress // made by newDriver for microvm and container
}

func (e *egressFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&e.mode, "egress", "auto", "egress policy for microvm and container sandboxes: on, off (sandboxes get no network at all) or auto (on when root with /dev/net/tun)")
	fs.StringVar(&e.prefix4, "egress-prefix4", netpolicy.DefaultPrefix4.String(), "egress: IPv4 pool for sandbox links (a /30 each; the first address is the DNS resolver)")
	fs.StringVar(&e.prefix6, "egress-prefix6", netpolicy.DefaultPrefix6.String(), "egress: IPv6 pool for sandbox links")
	fs.StringVar(&e.upstream, "egress-upstream", "", "egress: HOST:PORT of the DNS server allowed names are forwarded to (default: the first nameserver in /etc/resolv.conf)")
	fs.StringVar(&e.registries, "egress-registries", "", "egress: comma-separated names the registries profile allows, exact or *.suffix (default: the Go proxy, PyPI, npm, crates.io, Maven Central and Debian mirrors)")
	fs.IntVar(&e.pool, "egress-pool", 4, "egress: network namespaces kept ready for new sandboxes")
	fs.StringVar(&e.nodeAddrs, "egress-node-addrs", "", "egress: more comma-separated IP addresses of this node that sandboxes may not reach, such as a public address it is NATed to (the addresses on its own links are denied already)")
	fs.StringVar(&e.ports, "egress-cluster-ports", "", "egress: more comma-separated ports sandboxes may not reach on any address (the node's gossip, sandbox API and metrics ports and the servers' API and raft ports are denied already)")
}

// enabled decides whether the node runs egress policy.
func (e *egressFlags) enabled() (bool, error) {
	_, tunErr := os.Stat("/dev/net/tun")
	can := os.Geteuid() == 0 && tunErr == nil
	if err := e.checkMode(); err != nil {
		return false, err
	}
	switch e.mode {
	case "on":
		if !can {
			return false, errors.New("egress: on needs root and /dev/net/tun")
		}
		return true, nil
	case "off":
		return false, nil
	}
	return can, nil // auto
}

// checkMode refuses an --egress that is not on, off or auto.
func (e *egressFlags) checkMode() error {
	switch e.mode {
	case "", "auto", "on", "off":
		return nil
	}
	return fmt.Errorf("egress: %q is not on, off or auto", e.mode)
}

// check checks the egress flags, whichever the driver: a typo is
// refused also where the driver runs no egress policy.
func (e *egressFlags) check(f *nodeFlags) error {
	if err := e.checkMode(); err != nil {
		return err
	}
	_, err := e.netConfig(f)
	return err
}

// start makes the node's egress policy. ports are the cluster's (API,
// raft, gossip, sandbox API), denied to every sandbox.
func (e *egressFlags) start(f *nodeFlags) (*noded.Egress, error) {
	cfg, err := e.netConfig(f)
	if err != nil {
		return nil, err
	}
	eg, err := noded.NewEgress(cfg)
	if err != nil {
		return nil, fmt.Errorf("egress: %w", err)
	}
	return eg, nil
}

// clearLeftovers removes what an earlier run of this node with egress
// policy left on the host (its sandboxes' namespaces and links, the node's
// table, the forwarding sysctls it turned on), when the node now runs
// without it: nothing else would, and a re-adopted sandbox would keep its
// old rules, with no audit, for good. Such a sandbox runs on without a
// network.
func (e *egressFlags) clearLeftovers(f *nodeFlags) {
	if f.data == "" {
		return
	}
	dir := filepath.Join(f.data, "egress")
	if ents, err := os.ReadDir(dir); err != nil || len(ents) == 0 {
		return
	}
	warn := func(msg string, args ...any) {
		if f.logger != nil {
			f.logger.Warn(msg, args...)
		}
	}
	if os.Geteuid() != 0 {
		warn("egress: an earlier run's egress policy may be left on the host; run the node as root once (with --egress on or off) to remove it", "state", dir)
		return
	}
	cfg, err := e.netConfig(f)
	if err != nil {
		return // the flags' error is reported by check
	}
	m, err := netpolicy.New(cfg)
	if err == nil {
		err = m.Close()
	}
	if err != nil {
		warn("egress: remove what an earlier run with egress policy left", "err", err)
		return
	}
	if f.logger != nil {
		f.logger.Info("egress: removed the networks and rules an earlier run with egress policy left; this node runs without it")
	}
}

// netConfig is the egress policy's config from the flags; it makes
// nothing.
func (e *egressFlags) netConfig(f *nodeFlags) (netpolicy.Config, error) {
	cfg := netpolicy.Config{Tag: egressTag(f.id, f.data), Upstream: e.upstream, Pool: e.pool, Logger: f.logger,
		StateDir: filepath.Join(f.data, "egress")}
	var err error
	if cfg.Prefix4, err = netip.ParsePrefix(e.prefix4); err != nil {
		return netpolicy.Config{}, fmt.Errorf("egress-prefix4: %q is not a CIDR prefix", e.prefix4)
	}
	if cfg.Prefix6, err = netip.ParsePrefix(e.prefix6); err != nil {
		return netpolicy.Config{}, fmt.Errorf("egress-prefix6: %q is not a CIDR prefix", e.prefix6)
	}
	if e.registries != "" {
		cfg.Registries = splitComma(e.registries)
		if _, err := (netpolicy.Policy{Profile: netpolicy.ProfileCustom, Allow: cfg.Registries}).Normalize(); err != nil {
			return netpolicy.Config{}, fmt.Errorf("egress-registries: %w", err) // "allow[i]" is the i-th name
		}
	}
	if e.pool < 0 || e.pool > 1024 {
		return netpolicy.Config{}, fmt.Errorf("egress-pool: %d must be between 0 and 1024", e.pool)
	}
	cfg.ClusterPorts = clusterPorts(f)
	for _, p := range splitComma(e.ports) {
		n, err := strconv.ParseUint(p, 10, 16)
		if err != nil || n == 0 {
			return netpolicy.Config{}, fmt.Errorf("egress-cluster-ports: %q is not a port (1-65535)", p)
		}
		cfg.ClusterPorts = append(cfg.ClusterPorts, uint16(n))
	}
	if cfg.NodeAddrs, err = parseNodeAddrs(e.nodeAddrs); err != nil {
		return netpolicy.Config{}, err
	}
	return cfg, nil
}

// parseNodeAddrs reads --egress-node-addrs: comma-separated IP addresses.
func parseNodeAddrs(v string) ([]netip.Addr, error) {
	var out []netip.Addr
	for _, a := range splitComma(v) {
		ip, err := netip.ParseAddr(a)
		if err != nil || ip.Zone() != "" {
			return nil, fmt.Errorf("egress-node-addrs: %q is not an IP address", a)
		}
		out = append(out, ip.Unmap())
	}
	return out, nil
}

// egressTag names what this node owns on the host (namespaces, links, the
// node table), from its id and data directory, so nodes sharing a host
// (tests, dev) keep apart and a restarted node finds its own leftovers.
func egressTag(id, data string) string {
	h := fnv.New32a()
	h.Write([]byte(id + "\x00" + data))
	s := strconv.FormatUint(uint64(h.Sum32()), 36)
	for len(s) < 4 {
		s = "0" + s
	}
	return s[:4]
}

// clusterPorts are the ports of this node's gossip and sandbox API and of
// the servers' API and raft (the API port + 1 by default).
func clusterPorts(f *nodeFlags) []uint16 {
	var out []uint16
	add := func(hostport string) int {
		_, p, err := net.SplitHostPort(hostport)
		if err != nil {
			return 0
		}
		n, err := strconv.Atoi(p)
		if err != nil || n <= 0 || n > 65535 {
			return 0
		}
		out = append(out, uint16(n))
		return n
	}
	add(f.gossip)
	add(f.sandboxListen)
	add(f.metrics)
	for _, s := range splitComma(f.servers) {
		u, err := url.Parse(s)
		if err != nil {
			continue
		}
		// A URL without a port means 80 or 443, which every sandbox needs
		// for the registries: such servers are kept out by address (the
		// private ranges) instead.
		if n := add(u.Host); n > 0 && n < 65535 {
			out = append(out, uint16(n+1)) // raft, by the API port + 1 convention
		}
	}
	return out
}
