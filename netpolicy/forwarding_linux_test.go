package netpolicy_test

import (
	"context"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/miekg/dns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"github.com/warrenhq/warren/netpolicy"
	. "github.com/warrenhq/warren/netpolicy/netpolicytest"
)

const (
	ipForward  = "/proc/sys/net/ipv4/ip_forward"
	ip6Forward = "/proc/sys/net/ipv6/conf/all/forwarding"
)

// nodeSysctl reads (v "") or writes a sysctl in the topology's node
// namespace.
func nodeSysctl(t *testing.T, tp *Topo, p, v string) string {
	t.Helper()
	var got string
	if err := netpolicy.InNamedNS(tp.NodeNS, func() error {
		if v != "" {
			if err := os.WriteFile(p, []byte(v), 0o644); err != nil {
				return err
			}
		}
		b, err := os.ReadFile(p)
		got = strings.TrimSpace(string(b))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return got
}

// fwdRules counts the rules of the node table's forward chain.
func fwdRules(t *testing.T, tp *Topo) int {
	t.Helper()
	node, err := netns.GetFromPath(tp.NodeNS)
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close()
	c, err := nftables.New(nftables.WithNetNSFd(int(node)))
	if err != nil {
		t.Fatal(err)
	}
	rules, err := c.GetRules(&nftables.Table{Name: "warren-" + tp.Tag, Family: nftables.TableFamilyINet}, &nftables.Chain{Name: "fwd"})
	if err != nil {
		t.Fatal(err)
	}
	return len(rules)
}

// A node that was no router stays one that forwards only to and from
// sandboxes after an unclean exit (a crash, Detach): the next start finds
// forwarding on, as the last run left it, and must not take the node
// for a router. Its close then restores the node's own values.
func TestForwardingIsKnownAfterAnUncleanExit(t *testing.T) {
	tp := New(t)
	cfg := tp.Config(0, nil)
	cfg.StateDir = t.TempDir()
	// The node is no router. Its namespace is made so: a new namespace
	// takes the host's IPv4 settings, and a host may forward (one whose
	// egress manager was killed, say, or a router).
	if v := nodeSysctl(t, tp, ipForward, "0"); v != "0" {
		t.Fatalf("the node's namespace still forwards IPv4 (%s)", v)
	}
	m1, err := netpolicy.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	first := fwdRules(t, tp)
	m1.Detach() // as a crash leaves it
	m2, err := netpolicy.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if again := fwdRules(t, tp); again != first {
		t.Errorf("the forward chain has %d rules after the restart, %d before: the node was taken for a router", again, first)
	}
	m2.Close()
	if v4, v6 := nodeSysctl(t, tp, ipForward, ""), nodeSysctl(t, tp, ip6Forward, ""); v4 != "0" || v6 != "0" {
		t.Errorf("after close: ip_forward %s, IPv6 forwarding %s; want the node's own 0 and 0", v4, v6)
	}
	if _, err := os.Stat(filepath.Join(cfg.StateDir, "forwarding.json")); !os.IsNotExist(err) {
		t.Errorf("forwarding.json outlives the close: %v", err)
	}
}

// A node that forwarded IPv4 but not IPv6 (any Docker host) keeps its
// IPv4 forwarding as it was, and forwards IPv6 only to and from sandboxes.
func TestForwardingIsRestrictedPerFamily(t *testing.T) {
	tp := New(t)
	count := func(v4, v6 string) int {
		t.Helper()
		nodeSysctl(t, tp, ipForward, v4)
		nodeSysctl(t, tp, ip6Forward, v6)
		m, err := netpolicy.New(tp.Config(0, nil))
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		return fwdRules(t, tp)
	}
	router, v4Only := count("1", "1"), count("1", "0")
	if v4Only != router+1 {
		t.Errorf("forward chain: %d rules on an IPv4-only router, %d on a router of both: want one more, the IPv6 restriction", v4Only, router)
	}
	if v := nodeSysctl(t, tp, ip6Forward, ""); v != "0" {
		t.Errorf("IPv6 forwarding after close: %s, want the node's own 0", v)
	}
}

// A sandbox's audit ends with its last attempts: Close reports what it
// tried since the last periodic report. And it holds no denials the
// sandbox never attempted: its kernel's own multicast membership reports
// (MLD to ff02::16) are dropped unrecorded.
func TestAuditEndsWithTheLastAttemptsAndHoldsNoGroupReports(t *testing.T) {
	tp := New(t)
	var mu sync.Mutex
	var events []netpolicy.AuditEvent
	cfg := tp.Config(0, func(_ string, b netpolicy.AuditBatch) {
		mu.Lock()
		events = append(events, b.Events...)
		mu.Unlock()
	})
	cfg.AuditInterval = time.Hour // only the close reports
	m, err := netpolicy.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	s, err := m.Claim(context.Background(), "sb-audit", netpolicy.Policy{})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond) // the kernel's unsolicited MLD reports go within a second of link up
	if _, err := connect(s, netip.AddrPortFrom(Other, 80)); err == nil {
		t.Fatal("a connection to a host not on the list went through")
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	denied := false
	for _, e := range events {
		denied = denied || (e.Verdict == "deny" && e.Addr == Other.String() && e.Port == 80)
		if strings.HasPrefix(e.Addr, "ff02:") || strings.HasPrefix(e.Addr, "224.") {
			t.Errorf("an audit event the sandbox never attempted: %+v", e)
		}
	}
	if !denied {
		t.Errorf("the audit lacks the last attempt (a denied connect to %v:80): %+v", Other, events)
	}
}

// A host on the node's network that forges a sandbox's address cannot
// act as that sandbox at the resolver (opening the sandbox's allow set,
// and writing lookups it never made into its audit): a sandbox's address
// coming from anywhere but a sandbox link is dropped.
func TestAForgedSandboxAddressFromOutsideIsDropped(t *testing.T) {
	tp := New(t)
	m := tp.Manager(t, 0, nil)
	s, err := m.Claim(context.Background(), "sb-forged", netpolicy.Policy{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ih := HandleAt(t, tp.InetNS)
	lo, err := ih.LinkByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	forged := s.Slot().Sandbox4
	if err := ih.AddrAdd(lo, &netlink.Addr{IPNet: &net.IPNet{IP: forged.AsSlice(), Mask: net.CIDRMask(32, 32)}}); err != nil {
		t.Fatal(err)
	}
	res := m.Resolver().Host4
	if err := ih.RouteAdd(&netlink.Route{Dst: &net.IPNet{IP: res.AsSlice(), Mask: net.CIDRMask(32, 32)}, Gw: NodeAddr.AsSlice()}); err != nil {
		t.Fatal(err)
	}
	var answered bool
	if err := netpolicy.InNamedNS(tp.InetNS, func() error {
		c := &dns.Client{Net: "udp", Timeout: time.Second, Dialer: &net.Dialer{LocalAddr: &net.UDPAddr{IP: forged.AsSlice()}}}
		q := new(dns.Msg)
		q.SetQuestion("allowed.test.", dns.TypeA)
		_, _, err := c.Exchange(q, net.JoinHostPort(res.String(), "53"))
		answered = err == nil
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if answered {
		t.Error("the resolver answered a query from outside the node with a sandbox's address")
	}
	// The sandbox never looked allowed.test up: its address stays closed.
	if _, err := connect(s, netip.AddrPortFrom(Web, 80)); err == nil {
		t.Error("a forged lookup from outside opened the sandbox's allow set")
	}
}
