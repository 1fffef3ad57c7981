package netpolicy_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/miekg/dns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/netpolicy"
	. "github.com/warrenhq/warren/netpolicy/netpolicytest"
)

// These tests act from inside a sandbox's namespace, as a container's
// processes do: every socket below is opened in it.

// dialResolver opens a UDP socket from the sandbox's namespace to its
// resolver.
func dialResolver(t *testing.T, s *netpolicy.Sandbox) net.Conn {
	t.Helper()
	var c net.Conn
	if err := netpolicy.InNamedNS(s.NSPath(), func() (err error) {
		c, err = net.Dial("udp", net.JoinHostPort(s.Guest(false).DNS[0].String(), "53"))
		return
	}); err != nil {
		t.Fatal(err)
	}
	return c
}

// ask sends one query from the sandbox to its resolver.
func ask(t *testing.T, s *netpolicy.Sandbox, name string, qtype uint16) *dns.Msg {
	t.Helper()
	c := dialResolver(t, s)
	defer c.Close()
	q := new(dns.Msg)
	q.SetQuestion(dns.Fqdn(name), qtype)
	resp, _, err := (&dns.Client{Timeout: 3 * time.Second}).ExchangeWithConn(q, &dns.Conn{Conn: c})
	if err != nil {
		t.Fatalf("lookup %s: %v", name, err)
	}
	return resp
}

// lookup returns the rcode and the addresses of the answer.
func lookup(t *testing.T, s *netpolicy.Sandbox, name string, qtype uint16) (int, []netip.Addr) {
	t.Helper()
	resp := ask(t, s, name, qtype)
	var out []netip.Addr
	for _, rr := range resp.Answer {
		switch v := rr.(type) {
		case *dns.A:
			a, _ := netip.AddrFromSlice(v.A)
			out = append(out, a.Unmap())
		case *dns.AAAA:
			a, _ := netip.AddrFromSlice(v.AAAA)
			out = append(out, a)
		}
	}
	return resp.Rcode, out
}

// lookupTTL returns the rcode and the TTL of name's first A record.
func lookupTTL(t *testing.T, s *netpolicy.Sandbox, name string) (int, uint32) {
	t.Helper()
	resp := ask(t, s, name, dns.TypeA)
	if len(resp.Answer) == 0 {
		return resp.Rcode, 0
	}
	return resp.Rcode, resp.Answer[0].Header().Ttl
}

// connect dials TCP from the sandbox, exchanges a line with the echo
// server, and returns how long a failed dial took (the dial alone, not the
// switch into the namespace).
func connect(s *netpolicy.Sandbox, ap netip.AddrPort) (time.Duration, error) {
	var c net.Conn
	var took time.Duration
	err := netpolicy.InNamedNS(s.NSPath(), func() (err error) {
		d := net.Dialer{Timeout: 2 * time.Second}
		start := time.Now()
		c, err = d.Dial("tcp", ap.String())
		took = time.Since(start)
		return
	})
	if err != nil {
		return took, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Write([]byte("ping")); err != nil {
		return took, err
	}
	buf := make([]byte, 4)
	_, err = c.Read(buf)
	return took, err
}

// udpProbe sends a datagram and waits for the echo or an error.
func udpProbe(s *netpolicy.Sandbox, ap netip.AddrPort) error {
	var c net.Conn
	if err := netpolicy.InNamedNS(s.NSPath(), func() (err error) { c, err = net.Dial("udp", ap.String()); return }); err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("ping")); err != nil {
		return err
	}
	buf := make([]byte, 4)
	_, err := c.Read(buf)
	return err
}

// ping sends one ICMP echo request from the sandbox and returns the type
// of the ICMP message that came back (0 echo reply, 1/3 unreachable), or
// -1 when nothing did.
func ping(t *testing.T, s *netpolicy.Sandbox, a netip.Addr) int {
	t.Helper()
	network, req := "ip4:icmp", []byte{8, 0, 0, 0, 0x12, 0x34, 0, 1}
	if a.Is6() {
		network, req = "ip6:ipv6-icmp", []byte{128, 0, 0, 0, 0x12, 0x34, 0, 1}
	}
	if a.Is4() {
		var sum uint32
		for i := 0; i < len(req); i += 2 {
			sum += uint32(req[i])<<8 | uint32(req[i+1])
		}
		sum = sum>>16 + sum&0xffff
		sum += sum >> 16
		req[2], req[3] = byte(^sum>>8), byte(^sum)
	}
	var c net.PacketConn
	if err := netpolicy.InNamedNS(s.NSPath(), func() (err error) { c, err = net.ListenPacket(network, ""); return }); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.WriteTo(req, &net.IPAddr{IP: a.AsSlice()}); err != nil {
		if errors.Is(err, syscall.EPERM) || errors.Is(err, syscall.EHOSTUNREACH) || errors.Is(err, syscall.EACCES) {
			return 3 // refused locally, as a reject in the output hook does
		}
		t.Fatalf("ping %v: %v", a, err)
	}
	c.SetReadDeadline(time.Now().Add(time.Second))
	buf := make([]byte, 1500)
	for {
		n, _, err := c.ReadFrom(buf)
		if err != nil {
			return -1
		}
		if n > 0 && buf[0] != 8 && buf[0] != 128 { // skip our own request looping back
			return int(buf[0])
		}
	}
}

func isRefused(err error) bool {
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.EHOSTUNREACH) || errors.Is(err, syscall.ENETUNREACH) || errors.Is(err, syscall.EACCES) || errors.Is(err, syscall.EPERM)
}

type auditLog struct {
	mu  sync.Mutex
	evs map[string][]netpolicy.AuditEvent
}

func (a *auditLog) add(id string, b netpolicy.AuditBatch) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.evs[id] = append(a.evs[id], b.Events...)
}

func (a *auditLog) has(id string, match func(netpolicy.AuditEvent) bool) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.ContainsFunc(a.evs[id], match)
}

func TestEgressPolicy(t *testing.T) {
	tp := New(t)
	al := &auditLog{evs: map[string][]netpolicy.AuditEvent{}}
	m := tp.Manager(t, 1, al.add)
	s, err := m.Claim(context.Background(), "sb-egress", netpolicy.Policy{})
	if err != nil {
		t.Fatal(err)
	}
	web := netip.AddrPortFrom(Web, 80)

	t.Run("allowed name resolves and connects", func(t *testing.T) {
		rc, addrs := lookup(t, s, "allowed.test", dns.TypeA)
		if rc != dns.RcodeSuccess || !slices.Contains(addrs, Web) {
			t.Fatalf("allowed.test: rcode %d, %v", rc, addrs)
		}
		if _, err := connect(s, web); err != nil {
			t.Fatalf("connect to %v after resolving: %v", web, err)
		}
		if err := udpProbe(s, web); err != nil {
			t.Fatalf("udp to %v after resolving: %v", web, err)
		}
		rc, addrs = lookup(t, s, "allowed.test", dns.TypeAAAA)
		if rc != dns.RcodeSuccess || !slices.Contains(addrs, Web6) {
			t.Fatalf("allowed.test AAAA: rcode %d, %v", rc, addrs)
		}
		if _, err := connect(s, netip.AddrPortFrom(Web6, 80)); err != nil {
			t.Fatalf("connect to [%v]:80 after resolving: %v", Web6, err)
		}
		if rc, addrs := lookup(t, s, "www.cdn.test", dns.TypeA); rc != dns.RcodeSuccess || len(addrs) != 1 {
			t.Fatalf("www.cdn.test (allowed as *.cdn.test): rcode %d, %v", rc, addrs)
		}
		if rc, _ := lookup(t, s, "cdn.test", dns.TypeA); rc != dns.RcodeNameError {
			t.Fatalf("cdn.test is not under *.cdn.test, got rcode %d", rc)
		}
	})

	t.Run("denied name does not resolve", func(t *testing.T) {
		if rc, addrs := lookup(t, s, "denied.test", dns.TypeA); rc != dns.RcodeNameError || len(addrs) != 0 {
			t.Fatalf("denied.test: rcode %d, %v; want NXDOMAIN", rc, addrs)
		}
	})

	t.Run("denied addresses are refused at once", func(t *testing.T) {
		for _, ap := range []netip.AddrPort{
			netip.AddrPortFrom(Other, 80),                 // never resolved
			netip.AddrPortFrom(Other6, 80),                // never resolved, IPv6
			netip.AddrPortFrom(Private, 80),               // private range
			netip.AddrPortFrom(NodeAddr, APIPort),         // the node's API
			netip.AddrPortFrom(NodeAddr, GossipPort),      // the node's gossip
			netip.AddrPortFrom(Web, GossipPort),           // a cluster port on an allowed host
			netip.AddrPortFrom(m.Resolver().Host4, 22),    // the resolver's address, another port
			netip.AddrPortFrom(s.Slot().Host4, 80),        // the node's end of the veth
			netip.MustParseAddrPort("169.254.169.254:80"), // metadata
			netip.AddrPortFrom(m.Resolver().Host6, 22),    // the resolver's IPv6 address, another port
		} {
			took, err := connect(s, ap)
			if err == nil {
				t.Errorf("connect to %v succeeded", ap)
				continue
			}
			if !isRefused(err) {
				t.Errorf("connect to %v: %v; want a reset or unreachable", ap, err)
			}
			if took > 100*time.Millisecond {
				t.Errorf("connect to %v failed after %v; want within 100ms", ap, took)
			}
		}
	})

	t.Run("udp and icmp to denied hosts fail", func(t *testing.T) {
		for _, ap := range []netip.AddrPort{netip.AddrPortFrom(Other, 80), netip.AddrPortFrom(Private, 80), netip.AddrPortFrom(NodeAddr, GossipPort), netip.AddrPortFrom(Other6, 80)} {
			err := udpProbe(s, ap)
			if err == nil || !isRefused(err) {
				t.Errorf("udp to %v: %v; want refused", ap, err)
			}
		}
		for _, a := range []netip.Addr{Other, Private, NodeAddr, Web, Other6} {
			if typ := ping(t, s, a); typ == 0 || typ == 129 {
				t.Errorf("ping %v got an echo reply", a)
			}
		}
	})

	t.Run("dns only to the resolver", func(t *testing.T) {
		if rc, _ := lookup(t, s, "allowed.test", dns.TypeA); rc != dns.RcodeSuccess {
			t.Fatal("allowed.test should resolve")
		}
		// The web host is allowed now, and it listens on 53 (TCP and
		// UDP): the sandbox may still not use it as a resolver.
		if _, err := connect(s, netip.AddrPortFrom(Web, 53)); err == nil || !isRefused(err) {
			t.Errorf("tcp to %v:53: %v; want refused", Web, err)
		}
		if err := udpProbe(s, netip.AddrPortFrom(Web, 53)); err == nil || !isRefused(err) {
			t.Errorf("udp to %v:53: %v; want refused", Web, err)
		}
	})

	t.Run("answers carry the time the sandbox may use them", func(t *testing.T) {
		// short.test's TTL is 1 s upstream; the allow set keeps it 5 s,
		// and the answer says so.
		rc, ttl := lookupTTL(t, s, "short.test")
		if rc != dns.RcodeSuccess || ttl != 5 {
			t.Fatalf("short.test: rcode %d, ttl %d; want 5", rc, ttl)
		}
	})

	t.Run("rebinding is blocked", func(t *testing.T) {
		if rc, addrs := lookup(t, s, "rebind.test", dns.TypeA); rc != dns.RcodeSuccess || !slices.Contains(addrs, Web) {
			t.Fatalf("rebind.test first: %d %v", rc, addrs)
		}
		tp.Zone.Set("rebind.test.", Private)
		rc, addrs := lookup(t, s, "rebind.test", dns.TypeA)
		if len(addrs) != 0 {
			t.Fatalf("rebind.test now answers %v (rcode %d); the private address must be dropped", addrs, rc)
		}
		if _, err := connect(s, netip.AddrPortFrom(Private, 80)); err == nil {
			t.Fatal("connected to the rebound private address")
		}
		// Every other always-denied answer is dropped the same way.
		for _, name := range []string{"node.test", "resolver.test", "loopback.test", "metadata.test", "mapped.test", "private-ula.test"} {
			for _, qt := range []uint16{dns.TypeA, dns.TypeAAAA} {
				if _, addrs := lookup(t, s, name, qt); len(addrs) != 0 {
					t.Errorf("%s answers %v", name, addrs)
				}
			}
		}
	})

	t.Run("live policy change holds for new connections", func(t *testing.T) {
		if rc, _ := lookup(t, s, "allowed.test", dns.TypeA); rc != dns.RcodeSuccess {
			t.Fatal("allowed.test should resolve before the change")
		}
		// An established connection survives; a new one does not.
		var c net.Conn
		if err := netpolicy.InNamedNS(s.NSPath(), func() (err error) { c, err = net.Dial("tcp", web.String()); return }); err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if err := s.SetPolicy(netpolicy.Policy{Profile: netpolicy.ProfileCustom, Allow: []string{"www.cdn.test"}}); err != nil {
			t.Fatal(err)
		}
		if rc, _ := lookup(t, s, "allowed.test", dns.TypeA); rc != dns.RcodeNameError {
			t.Fatalf("allowed.test after the change: rcode %d, want NXDOMAIN", rc)
		}
		if _, err := connect(s, web); err == nil || !isRefused(err) {
			t.Fatalf("new connection to %v after the change: %v; want refused", web, err)
		}
		c.SetDeadline(time.Now().Add(2 * time.Second))
		if _, err := c.Write([]byte("ping")); err != nil {
			t.Fatalf("established connection broke: %v", err)
		}
		if _, err := c.Read(make([]byte, 4)); err != nil {
			t.Fatalf("established connection broke: %v", err)
		}
		// Opening again: an explicit prefix reaches even a private host.
		if err := s.SetPolicy(netpolicy.Policy{Profile: netpolicy.ProfileCustom, AllowPrefixes: []netip.Prefix{netip.PrefixFrom(Private, 32)}}); err != nil {
			t.Fatal(err)
		}
		if _, err := connect(s, netip.AddrPortFrom(Private, 80)); err != nil {
			t.Fatalf("explicitly allowed %v: %v", Private, err)
		}
		if err := s.SetPolicy(netpolicy.Policy{Profile: netpolicy.ProfileNone}); err != nil {
			t.Fatal(err)
		}
		if _, err := connect(s, netip.AddrPortFrom(Private, 80)); err == nil {
			t.Fatal("profile none still reaches the private host")
		}
		if rc, _ := lookup(t, s, "www.cdn.test", dns.TypeA); rc != dns.RcodeNameError {
			t.Fatalf("profile none resolves www.cdn.test: rcode %d", rc)
		}
	})

	t.Run("a lookup under the old policy does not open the new one", func(t *testing.T) {
		if err := s.SetPolicy(netpolicy.Policy{}); err != nil { // registries: slow.test is on it
			t.Fatal(err)
		}
		tp.Zone.SetDelay("slow.test.", 400*time.Millisecond)
		done := make(chan int, 1)
		go func() {
			rc, _ := lookup(t, s, "slow.test", dns.TypeA)
			done <- rc
		}()
		time.Sleep(100 * time.Millisecond) // the lookup is upstream now
		if err := s.SetPolicy(netpolicy.Policy{Profile: netpolicy.ProfileCustom, Allow: []string{"www.cdn.test"}}); err != nil {
			t.Fatal(err)
		}
		if rc := <-done; rc == dns.RcodeSuccess {
			t.Error("the lookup begun under the old policy succeeded")
		}
		if _, err := connect(s, netip.AddrPortFrom(Other, 80)); err == nil {
			t.Errorf("slow.test's address %v is reachable after the policy changed", Other)
		}
	})

	t.Run("audit events for allowed and denied attempts", func(t *testing.T) {
		deadline := time.Now().Add(5 * time.Second)
		want := map[string]func(netpolicy.AuditEvent) bool{
			"allow tcp to web:80": func(e netpolicy.AuditEvent) bool {
				return e.Verdict == "allow" && e.Kind == "connect" && e.Addr == Web.String() && e.Proto == "tcp" && e.Port == 80
			},
			"allow udp to web:80": func(e netpolicy.AuditEvent) bool {
				return e.Verdict == "allow" && e.Proto == "udp" && e.Addr == Web.String()
			},
			"deny tcp to other:80": func(e netpolicy.AuditEvent) bool {
				return e.Verdict == "deny" && e.Kind == "connect" && e.Addr == Other.String() && e.Proto == "tcp" && e.Port == 80
			},
			"deny tcp to the node API": func(e netpolicy.AuditEvent) bool {
				return e.Verdict == "deny" && e.Addr == NodeAddr.String() && e.Port == APIPort
			},
			"deny icmp":     func(e netpolicy.AuditEvent) bool { return e.Verdict == "deny" && e.Proto == "icmp" },
			"deny ipv6 tcp": func(e netpolicy.AuditEvent) bool { return e.Verdict == "deny" && e.Addr == Other6.String() },
			"deny lookup of a name": func(e netpolicy.AuditEvent) bool {
				return e.Verdict == "deny" && e.Kind == "dns" && e.Name == "denied.test."
			},
			"deny rebinding answer": func(e netpolicy.AuditEvent) bool {
				return e.Verdict == "deny" && e.Kind == "dns" && e.Name == "rebind.test."
			},
			"allow lookup of a name": func(e netpolicy.AuditEvent) bool {
				return e.Verdict == "allow" && e.Kind == "dns" && e.Name == "allowed.test."
			},
		}
		for name, match := range want {
			for !al.has("sb-egress", match) {
				if time.Now().After(deadline) {
					t.Fatalf("no audit event: %s; got %+v", name, al.evs["sb-egress"])
				}
				time.Sleep(50 * time.Millisecond)
			}
		}
	})
}

// An address the node gains after the manager started is not in the
// sandboxes' deny sets (they are computed at start), yet a sandbox still
// cannot reach it: the node table rejects everything a sandbox sends to
// the node itself but DNS to the resolver. Even an address the resolver
// handed out (and so put in the sandbox's allow set) before the node took
// it is refused.
func TestNodeAddressAddedLaterIsRefused(t *testing.T) {
	tp := New(t)
	m := tp.Manager(t, 1, func(string, netpolicy.AuditBatch) {})
	s, err := m.Claim(context.Background(), "sb-later", netpolicy.Policy{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	later := netip.MustParseAddr("198.51.100.77")
	tp.Zone.Set("rebind.test.", later)
	if rc, addrs := lookup(t, s, "rebind.test", dns.TypeA); rc != dns.RcodeSuccess || !slices.Contains(addrs, later) {
		t.Fatalf("rebind.test before the node has %v: rcode %d, %v; want it allowed", later, rc, addrs)
	}
	tp.AddNodeAddr(t, later)
	ap := netip.AddrPortFrom(later, 80)
	// The address is live: the node reaches its own listener on it.
	if err := netpolicy.InNamedNS(tp.NodeNS, func() error {
		c, err := net.DialTimeout("tcp", ap.String(), 2*time.Second)
		if err == nil {
			c.Close()
		}
		return err
	}); err != nil {
		t.Fatalf("the node cannot reach its new address: %v", err)
	}
	took, err := connect(s, ap)
	if err == nil {
		t.Fatalf("the sandbox reached the node's new address %v", ap)
	}
	if !isRefused(err) || took > 100*time.Millisecond {
		t.Fatalf("connect to %v: %v after %v; want refused within 100ms", ap, err, took)
	}
	if err := udpProbe(s, ap); err == nil || !isRefused(err) {
		t.Fatalf("udp to %v: %v; want refused", ap, err)
	}
	// The sandbox's network still works otherwise.
	if rc, addrs := lookup(t, s, "www.cdn.test", dns.TypeA); rc != dns.RcodeSuccess || !slices.Contains(addrs, Web) {
		t.Fatalf("www.cdn.test: rcode %d, %v", rc, addrs)
	}
	if _, err := connect(s, netip.AddrPortFrom(Web, 80)); err != nil {
		t.Fatalf("connect to the web host: %v", err)
	}
}

// Config.NodeAddrs (--egress-node-addrs) denies addresses that are the
// node's without being on its links, such as a public address it is NATed
// to. Here the web host stands in for one: its name no longer resolves to
// it, and connecting to it is refused, while its IPv6 address still works.
func TestConfiguredNodeAddrsAreDenied(t *testing.T) {
	tp := New(t)
	cfg := tp.Config(1, func(string, netpolicy.AuditBatch) {})
	cfg.NodeAddrs = []netip.Addr{Web}
	m, err := netpolicy.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	s, err := m.Claim(context.Background(), "sb-nat", netpolicy.Policy{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	rc, addrs := lookup(t, s, "allowed.test", dns.TypeA)
	if slices.Contains(addrs, Web) {
		t.Fatalf("allowed.test answers the node's address %v (rcode %d, %v)", Web, rc, addrs)
	}
	if took, err := connect(s, netip.AddrPortFrom(Web, 80)); err == nil || !isRefused(err) || took > 100*time.Millisecond {
		t.Fatalf("connect to %v: %v after %v; want refused within 100ms", Web, err, took)
	}
	if rc, addrs := lookup(t, s, "allowed.test", dns.TypeAAAA); rc != dns.RcodeSuccess || !slices.Contains(addrs, Web6) {
		t.Fatalf("allowed.test AAAA: rcode %d, %v", rc, addrs)
	}
	if _, err := connect(s, netip.AddrPortFrom(Web6, 80)); err != nil {
		t.Fatalf("connect to [%v]:80: %v", Web6, err)
	}
}

// Collect returns every attempt not reported yet, more than one batch can
// hold, each once.
func TestCollectReportsEveryAttempt(t *testing.T) {
	tp := New(t)
	cfg := tp.Config(1, func(string, netpolicy.AuditBatch) { t.Error("a periodic report during the test") })
	cfg.AuditInterval = time.Hour
	m, err := netpolicy.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	s, err := m.Claim(context.Background(), "sb-collect", netpolicy.Policy{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const ports = 3 * netpolicy.MaxAuditEvents
	for i := range ports {
		if _, err := connect(s, netip.AddrPortFrom(Other, uint16(2000+i))); err == nil {
			t.Fatalf("connect to %v:%d succeeded", Other, 2000+i)
		}
	}
	bs, err := s.Collect()
	if err != nil {
		t.Fatal(err)
	}
	got := map[int]uint64{}
	add := func(evs []netpolicy.AuditEvent) {
		for _, e := range evs {
			if e.Kind == "connect" && e.Addr == Other.String() && e.Port >= 2000 && e.Port < 2000+ports {
				if e.Verdict != "deny" {
					t.Errorf("%s:%d reported as %s", e.Addr, e.Port, e.Verdict)
				}
				got[e.Port] += e.Count
			}
		}
	}
	for _, b := range bs {
		if len(b.Events) > netpolicy.MaxAuditEvents {
			t.Errorf("a collected batch has %d events", len(b.Events))
		}
		add(b.Events)
	}
	if len(bs) < 3 {
		t.Errorf("%d attempts came in %d batches", ports, len(bs))
	}
	for i := range ports {
		if got[2000+i] == 0 {
			t.Errorf("port %d: not reported", 2000+i)
		}
	}
	if len(got) != ports {
		t.Errorf("%d of %d ports reported", len(got), ports)
	}
	// Nothing is left for a later report.
	if bs, err := s.Collect(); err != nil || len(bs) != 0 {
		t.Fatalf("second collect: %d batches, %v", len(bs), err)
	}
}

// A later lookup of an allowed name renews its addresses in the allow
// sets (out and back in with the later time) in one netlink batch, so a
// connection made meanwhile, by another thread using its cached answer,
// is never refused.
func TestRenewingAnAddressKeepsItReachable(t *testing.T) {
	tp := New(t)
	m := tp.Manager(t, 1, func(string, netpolicy.AuditBatch) {})
	s, err := m.Claim(context.Background(), "sb-renew", netpolicy.Policy{})
	if err != nil {
		t.Fatal(err)
	}
	if rc, addrs := lookup(t, s, "allowed.test", dns.TypeA); rc != dns.RcodeSuccess || !slices.Contains(addrs, Web) {
		t.Fatalf("allowed.test: rcode %d, %v", rc, addrs)
	}
	web := netip.AddrPortFrom(Web, 80).String()
	stop := make(chan struct{})
	var total, fails atomic.Int64
	var firstErr atomic.Value
	done := make(chan error, 1)
	go func() {
		done <- netpolicy.InNamedNS(s.NSPath(), func() error {
			for {
				select {
				case <-stop:
					return nil
				default:
				}
				c, err := net.DialTimeout("tcp", web, time.Second)
				total.Add(1)
				if err != nil {
					if fails.Add(1) == 1 {
						firstErr.Store(err.Error())
					}
					continue
				}
				c.(*net.TCPConn).SetLinger(0)
				c.Close()
			}
		})
	}()
	lookups := 0
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline) && fails.Load() == 0; lookups++ {
		time.Sleep(2 * time.Millisecond) // each answer's time ends later than the last one's
		if rc, _ := lookup(t, s, "allowed.test", dns.TypeA); rc != dns.RcodeSuccess {
			close(stop)
			<-done
			t.Fatalf("allowed.test: rcode %d", rc)
		}
	}
	close(stop)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := fails.Load(); n > 0 {
		t.Fatalf("%d of %d connections to the allowed %s failed during %d lookups of its name; first: %v", n, total.Load(), web, lookups, firstErr.Load())
	}
}

// An address the kernel has already timed out, though the resolver
// thought it still in the allow sets (their clocks differ a little), is
// put back by the next lookup: the renewal's batch fails for the missing
// element, and the resolver adds it alone.
func TestRenewingAnAddressTheKernelDropped(t *testing.T) {
	tp := New(t)
	m := tp.Manager(t, 1, nil)
	s, err := m.Claim(context.Background(), "sb-renew-gone", netpolicy.Policy{})
	if err != nil {
		t.Fatal(err)
	}
	if rc, addrs := lookup(t, s, "allowed.test", dns.TypeA); rc != dns.RcodeSuccess || !slices.Contains(addrs, Web) {
		t.Fatalf("allowed.test: rcode %d, %v", rc, addrs)
	}
	// Take Web out of allow4 behind the resolver's back, as its timeout
	// would.
	ns, err := netns.GetFromPath(s.NSPath())
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	c, err := nftables.New(nftables.WithNetNSFd(int(ns)))
	if err != nil {
		t.Fatal(err)
	}
	set, err := c.GetSetByName(&nftables.Table{Name: "warren", Family: nftables.TableFamilyINet}, "allow4")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.SetDeleteElements(set, []nftables.SetElement{{Key: Web.AsSlice()}}); err != nil {
		t.Fatal(err)
	}
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	if _, err := connect(s, netip.AddrPortFrom(Web, 80)); err == nil {
		t.Fatal("the address is still reachable after its removal")
	}
	time.Sleep(2 * time.Millisecond) // the next answer's time ends later
	if rc, _ := lookup(t, s, "allowed.test", dns.TypeA); rc != dns.RcodeSuccess {
		t.Fatalf("allowed.test again: rcode %d", rc)
	}
	if _, err := connect(s, netip.AddrPortFrom(Web, 80)); err != nil {
		t.Fatalf("connect to %v after the lookup put it back: %v", Web, err)
	}
}

// The node's registries list is normalized like a policy's names: a
// registry written with capitals or a final dot matches its queries.
func TestNodeRegistriesAreNormalized(t *testing.T) {
	tp := New(t)
	cfg := tp.Config(0, nil)
	cfg.Registries = []string{"Allowed.TEST.", "*.CDN.test", "allowed.test"}
	m, err := netpolicy.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	s, err := m.Claim(context.Background(), "sb-registries", netpolicy.Policy{})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"allowed.test", "www.cdn.test"} {
		if rc, _ := lookup(t, s, name, dns.TypeA); rc != dns.RcodeSuccess {
			t.Errorf("%s is on the node's registries list %v, but its lookup gets rcode %d", name, cfg.Registries, rc)
		}
	}
	if rc, _ := lookup(t, s, "denied.test", dns.TypeA); rc != dns.RcodeNameError {
		t.Errorf("denied.test: rcode %d", rc)
	}
}

// New refuses a registries list with an entry that is no host name,
// naming the entry.
func TestNewRejectsABadRegistry(t *testing.T) {
	tp := New(t) // so that a New that accepts it sets up only the test's world
	cfg := tp.Config(0, nil)
	cfg.Registries = []string{"pypi.org", "a b.org"}
	m, err := netpolicy.New(cfg)
	if err == nil {
		m.Close()
	}
	if err == nil || !strings.Contains(err.Error(), `registries[1]: "a b.org"`) {
		t.Fatalf("New: %v; want an error naming registries[1]", err)
	}
}

// Collect returns every attempt the audit sets hold, however many
// batches that takes (far more than the periodic report drains).
func TestCollectReportsThousandsOfAttempts(t *testing.T) {
	tp := New(t)
	cfg := tp.Config(1, nil)
	cfg.AuditInterval = time.Hour
	m, err := netpolicy.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	s, err := m.Claim(context.Background(), "sb-collect-many", netpolicy.Policy{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const ports = 2300 // more than 64 batches
	if err := netpolicy.InNamedNS(s.NSPath(), func() error {
		for i := range ports {
			c, err := net.DialTimeout("tcp", netip.AddrPortFrom(Other, uint16(10000+i)).String(), time.Second)
			if err == nil {
				c.Close()
				t.Errorf("connect to %v:%d succeeded", Other, 10000+i)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	bs, err := s.Collect()
	if err != nil {
		t.Fatal(err)
	}
	got := map[int]bool{}
	for _, b := range bs {
		for _, e := range b.Events {
			if e.Kind == "connect" && e.Addr == Other.String() && e.Port >= 10000 && e.Port < 10000+ports {
				got[e.Port] = true
			}
		}
	}
	if len(got) != ports {
		last := bs[len(bs)-1]
		t.Fatalf("Collect returned %d batches with %d of %d attempts; the last batch says %d events (%d attempts) still wait", len(bs), len(got), ports, last.Omitted, last.OmittedCount)
	}
}

// A cluster port added while a Claim binds a pooled sandbox (out of the
// pool, not yet claimed) reaches that sandbox too. The node adds its
// kernel-picked sandbox-API port this way while the pool is being filled
// and claimed.
func TestClusterPortAddedDuringClaim(t *testing.T) {
	tp := New(t)
	m := tp.Manager(t, 1, nil)
	for deadline := time.Now().Add(10 * time.Second); m.Ready() < 1; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the pool never filled")
		}
	}
	s0 := m.Pooled()[0]
	release := s0.Hold() // the Claim's SetPolicy waits: the window stays open
	type res struct {
		s   *netpolicy.Sandbox
		err error
	}
	ch := make(chan res, 1)
	go func() {
		s, err := m.Claim(context.Background(), "sb-ports", netpolicy.Policy{})
		ch <- res{s, err}
	}()
	for slices.Contains(m.Pooled(), s0) {
		time.Sleep(time.Millisecond)
	}
	// s0 is out of the pool and not claimed yet: the Claim is binding it.
	err := m.AddClusterPorts(80)
	release()
	if err != nil {
		t.Fatal(err)
	}
	r := <-ch
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.s != s0 {
		t.Fatalf("the claim took another sandbox")
	}
	if rc, addrs := lookup(t, r.s, "allowed.test", dns.TypeA); rc != dns.RcodeSuccess || !slices.Contains(addrs, Web) {
		t.Fatalf("allowed.test: rcode %d, %v", rc, addrs)
	}
	if _, err := connect(r.s, netip.AddrPortFrom(Web, 80)); err == nil {
		t.Errorf("port 80 was added to the cluster ports, yet the sandbox claimed meanwhile reaches %v:80", Web)
	}
}

// A SetPolicy the kernel refuses leaves the sandbox's policy as it was.
// Before, the new policy (and its name matcher, which the resolver
// answers by) was in force in memory while the kernel kept the old rules.
func TestARefusedSetPolicyKeepsTheOldPolicy(t *testing.T) {
	tp := New(t)
	m := tp.Manager(t, 1, nil)
	s, err := m.Claim(context.Background(), "sb-policy-refused", netpolicy.Policy{})
	if err != nil {
		t.Fatal(err)
	}
	old := s.Policy()
	// Take the sandbox's table away behind its back: the next update of
	// its sets fails.
	ns, err := netns.GetFromPath(s.NSPath())
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	c, err := nftables.New(nftables.WithNetNSFd(int(ns)))
	if err != nil {
		t.Fatal(err)
	}
	c.DelTable(&nftables.Table{Name: "warren", Family: nftables.TableFamilyINet})
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := s.SetPolicy(netpolicy.Policy{Profile: netpolicy.ProfileCustom, Allow: []string{"www.cdn.test"}}); err == nil {
		t.Fatal("SetPolicy succeeded with the sandbox's table gone")
	}
	if got := s.Policy(); !reflect.DeepEqual(got, old) {
		t.Fatalf("policy after a refused SetPolicy: %+v, want the old %+v", got, old)
	}
}

// When an audit set is full (4,096 distinct destinations within its ten
// minutes), attempts to others are still filtered but not recorded: the
// report says so, once, first. Before, the audit just went quiet, so a
// guest could fill the set and then probe unseen.
func TestAFullAuditSetIsReported(t *testing.T) {
	tp := New(t)
	// The periodic report (every 100 ms here) may read the full set
	// before Collect does: its batches count too.
	var mu sync.Mutex
	var reported []netpolicy.AuditBatch
	m := tp.Manager(t, 1, func(_ string, b netpolicy.AuditBatch) {
		mu.Lock()
		reported = append(reported, b)
		mu.Unlock()
	})
	s, err := m.Claim(context.Background(), "sb-audit-full", netpolicy.Policy{})
	if err != nil {
		t.Fatal(err)
	}
	// Denied datagrams to the topology's own denied host, from inside the
	// sandbox: the sandbox's rules refuse each, and record each port.
	err = netpolicy.InNamedNS(s.NSPath(), func() error {
		pc, err := net.ListenPacket("udp4", ":0")
		if err != nil {
			return err
		}
		defer pc.Close()
		for port := 1; port <= 4200; port++ {
			_, _ = pc.WriteTo([]byte("x"), net.UDPAddrFromAddrPort(netip.AddrPortFrom(Other, uint16(port))))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	bs, err := s.Collect()
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	bs = append(reported, bs...)
	mu.Unlock()
	var full []netpolicy.AuditEvent
	for _, b := range bs {
		for i, e := range b.Events {
			if e.Kind == "audit_full" {
				full = append(full, e)
				if i != 0 {
					t.Errorf("the audit_full event is its report's event %d, not its first", i)
				}
			}
		}
	}
	if len(full) != 1 || full[0].Verdict != "deny" || !strings.Contains(full[0].Reason, "IPv4") {
		t.Fatalf("audit_full events %+v, want one for the denied IPv4 set", full)
	}
	// Still full at the next read: not reported again.
	bs, err = s.Collect()
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range bs {
		for _, e := range b.Events {
			if e.Kind == "audit_full" {
				t.Fatalf("audit_full reported again while the set stayed full: %+v", e)
			}
		}
	}
}

// The resolver sends upstream the question and no more: before, it
// forwarded the sandbox's query as it came, so EDNS options of the
// sandbox's own (any bytes in a local option, a client subnet) and records
// in its additional section reached the upstream resolver, a channel out
// of the sandbox beside the names its policy allows.
func TestTheUpstreamGetsOnlyTheQuestion(t *testing.T) {
	tp := New(t)
	m := tp.Manager(t, 1, func(string, netpolicy.AuditBatch) {})
	s, err := m.Claim(context.Background(), "sb-edns", netpolicy.Policy{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	c := dialResolver(t, s)
	defer c.Close()
	q := new(dns.Msg)
	q.SetQuestion("www.cdn.test.", dns.TypeA)
	q.AuthenticatedData = true // a stub asking for AD in the answer
	q.SetEdns0(4096, true)
	opt := q.IsEdns0()
	opt.Option = append(opt.Option,
		&dns.EDNS0_LOCAL{Code: dns.EDNS0LOCALSTART, Data: []byte("secret from the sandbox")},
		&dns.EDNS0_SUBNET{Code: dns.EDNS0SUBNET, Family: 1, SourceNetmask: 24, Address: net.IPv4(203, 0, 113, 0).To4()})
	q.Extra = append(q.Extra, &dns.TXT{Hdr: dns.RR_Header{Name: "x.", Rrtype: dns.TypeTXT, Class: dns.ClassINET}, Txt: []string{"more secrets"}})
	resp, _, err := (&dns.Client{Timeout: 3 * time.Second}).ExchangeWithConn(q, &dns.Conn{Conn: c})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Rcode != dns.RcodeSuccess || len(resp.Answer) == 0 {
		t.Fatalf("the sandbox's answer: rcode %d, %v", resp.Rcode, resp.Answer)
	}
	up := tp.Zone.LastQuery("www.cdn.test.")
	if up == nil {
		t.Fatal("the upstream got no query")
	}
	o := up.IsEdns0()
	if len(up.Extra) != 1 || o == nil || len(o.Option) != 0 {
		t.Fatalf("the upstream got additional records %v, want EDNS without options alone", up.Extra)
	}
	if o.UDPSize() != 1232 || !o.Do() || !up.RecursionDesired || !up.AuthenticatedData || len(up.Question) != 1 {
		t.Errorf("the upstream got UDP size %d, DO %v, RD %v, AD %v, %d questions; want 1232, true, true, true, 1", o.UDPSize(), o.Do(), up.RecursionDesired, up.AuthenticatedData, len(up.Question))
	}
	if resp.Id != q.Id {
		t.Errorf("the answer's id %d, want the query's %d", resp.Id, q.Id)
	}
}

// A container cannot open a way out by sending itself, over loopback, a
// datagram from a spoofed IPv6 source (IPV6_FREEBIND needs no capability)
// and then "replying" to that address: its answer was established traffic,
// accepted before every set and the audit, and reached any IPv6 host over
// UDP both ways.
func TestASpoofedSeedOverLoopbackOpensNoWayOut(t *testing.T) {
	tp := New(t)
	al := &auditLog{evs: map[string][]netpolicy.AuditEvent{}}
	m := tp.Manager(t, 1, al.add)
	s, err := m.Claim(context.Background(), "sb-seed", netpolicy.Policy{})
	if err != nil {
		t.Fatal(err)
	}
	target := netip.AddrPortFrom(Other6, 80) // denied; a UDP echo serves there
	if err := udpProbe(s, target); err == nil {
		t.Fatalf("UDP to %v is not denied to begin with: the test proves nothing", target)
	}
	// A few tries, each from a port of its own: the first exchanges of a
	// sandbox just made can be lost while its neighbours are found.
	waitLocal(t, s)
	for port := uint16(5555); port < 5560; port++ {
		self := netip.AddrPortFrom(s.Slot().Sandbox6, port)
		var got error
		if err := netpolicy.InNamedNS(s.NSPath(), func() error {
			// The seed: from the target's address, to the sandbox's own.
			if err := sendSpoofed(target, self); err != nil {
				return err
			}
			// The "reply", and the target's echo of it.
			c, err := net.ListenUDP("udp6", net.UDPAddrFromAddrPort(self))
			if err != nil {
				return fmt.Errorf("listen: %w", err)
			}
			defer c.Close()
			if _, err := c.WriteToUDPAddrPort([]byte("ping"), target); err != nil {
				got = err
				return nil
			}
			c.SetReadDeadline(time.Now().Add(time.Second))
			buf := make([]byte, 16)
			_, _, got = c.ReadFromUDPAddrPort(buf)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if got == nil {
			t.Fatalf("a UDP exchange from port %d with %v, which the policy denies, after a spoofed seed over loopback", port, target)
		}
	}
}

// Nor does such a seed open a way in: once the sandbox has tried to
// "reply" (refused, but conntrack saw it), the spoofed address's own
// datagrams to the sandbox were established traffic, which the namespace
// let in from any host that can route to the sandbox.
func TestASpoofedSeedOverLoopbackOpensNoWayIn(t *testing.T) {
	tp := New(t)
	m := tp.Manager(t, 1, nil)
	s, err := m.Claim(context.Background(), "sb-seed-in", netpolicy.Policy{})
	if err != nil {
		t.Fatal(err)
	}
	// The outside world routes the sandboxes' prefix to the node (as a
	// host on the node's network could), 2001:db8:113::2 being the
	// node's address in netpolicytest.
	if err := netpolicy.InNamedNS(tp.InetNS, func() error {
		return netlink.RouteAdd(&netlink.Route{Dst: netipx(netip.PrefixFrom(s.Slot().Sandbox6, 126)), Gw: net.ParseIP("2001:db8:113::2")})
	}); err != nil {
		t.Fatal(err)
	}
	far := netip.AddrPortFrom(Other6, 81)
	var outside *net.UDPConn
	if err := netpolicy.InNamedNS(tp.InetNS, func() (err error) {
		outside, err = net.ListenUDP("udp6", net.UDPAddrFromAddrPort(far))
		return
	}); err != nil {
		t.Fatal(err)
	}
	defer outside.Close()
	waitLocal(t, s)
	for port := uint16(5555); port < 5560; port++ {
		self := netip.AddrPortFrom(s.Slot().Sandbox6, port)
		var got error
		if err := netpolicy.InNamedNS(s.NSPath(), func() error {
			if err := sendSpoofed(far, self); err != nil {
				return err
			}
			c, err := net.ListenUDP("udp6", net.UDPAddrFromAddrPort(self))
			if err != nil {
				return err
			}
			defer c.Close()
			c.WriteToUDPAddrPort([]byte("reply"), far) // refused: egress
			time.Sleep(50 * time.Millisecond)
			if _, err := outside.WriteToUDPAddrPort([]byte("in"), self); err != nil {
				return err
			}
			c.SetReadDeadline(time.Now().Add(time.Second))
			buf := make([]byte, 16)
			for {
				n, from, err := c.ReadFromUDPAddrPort(buf)
				if err != nil {
					got = err
					return nil
				}
				if from == far && string(buf[:n]) == "in" {
					return nil
				}
			}
		}); err != nil {
			t.Fatal(err)
		}
		if got == nil {
			t.Fatalf("a datagram from %v, which the policy denies, reached the sandbox's port %d after a spoofed seed over loopback", far, port)
		}
	}
}

// sendSpoofed sends one datagram "seed" from from, an IPv6 address the
// sending namespace need not hold (IPV6_FREEBIND, no capability needed),
// to to. It runs in the caller's namespace.
func sendSpoofed(from, to netip.AddrPort) error {
	fd, err := unix.Socket(unix.AF_INET6, unix.SOCK_DGRAM, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_FREEBIND, 1); err != nil {
		return err
	}
	if err := unix.Bind(fd, &unix.SockaddrInet6{Port: int(from.Port()), Addr: from.Addr().As16()}); err != nil {
		return fmt.Errorf("bind: %w", err)
	}
	if err := unix.Sendto(fd, []byte("seed"), 0, &unix.SockaddrInet6{Port: int(to.Port()), Addr: to.Addr().As16()}); err != nil {
		return fmt.Errorf("seed: %w", err)
	}
	return nil
}

// waitLocal waits until the sandbox's own IPv6 address takes datagrams
// over loopback: right after a claim, a send to it may still be routed
// out (and refused) for a few milliseconds.
func waitLocal(t *testing.T, s *netpolicy.Sandbox) {
	t.Helper()
	self := netip.AddrPortFrom(s.Slot().Sandbox6, 5550)
	deadline := time.Now().Add(5 * time.Second)
	for {
		var err error
		if ierr := netpolicy.InNamedNS(s.NSPath(), func() error {
			c, lerr := net.ListenUDP("udp6", net.UDPAddrFromAddrPort(self))
			if lerr != nil {
				return lerr
			}
			defer c.Close()
			_, err = c.WriteToUDPAddrPort([]byte("self"), self)
			return nil
		}); ierr != nil {
			t.Fatal(ierr)
		}
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the sandbox's own address %v takes no datagram: %v", self.Addr(), err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func netipx(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}
