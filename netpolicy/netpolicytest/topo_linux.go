// Package netpolicytest builds the egress tests' own little world out of
// network namespaces, so tests of netpolicy and of the sandbox drivers can
// check egress from inside a real sandbox without a packet leaving the
// namespaces they make:
//
//	node ns (stands in for the node's own): uplink 203.0.113.2/24 and
//	  2001:db8:113::2/64, plus what netpolicy adds
//	inet ns: 203.0.113.1 and 2001:db8:113::1 toward the node, and the test
//	  hosts on its loopback: web 198.51.100.10 and 2001:db8:100::10
//	  (allowed by name), other 198.51.100.20 and 2001:db8:100::20 (never
//	  allowed), dns 198.51.100.53 (the upstream) and private 10.99.0.10.
//
// Every host echoes TCP and UDP on port 80 and GossipPort; the node ns
// listens on APIPort and GossipPort at its uplink address.
package netpolicytest

import (
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"github.com/warrenhq/warren/netpolicy"
	"golang.org/x/sys/unix"
)

// The test hosts.
var (
	Web       = netip.MustParseAddr("198.51.100.10")
	Web6      = netip.MustParseAddr("2001:db8:100::10")
	Other     = netip.MustParseAddr("198.51.100.20")
	Other6    = netip.MustParseAddr("2001:db8:100::20")
	DNS       = netip.MustParseAddr("198.51.100.53")
	Private   = netip.MustParseAddr("10.99.0.10")
	NodeAddr  = netip.MustParseAddr("203.0.113.2")
	inetAddr  = netip.MustParseAddr("203.0.113.1")
	node6Addr = netip.MustParseAddr("2001:db8:113::2")
	inet6Addr = netip.MustParseAddr("2001:db8:113::1")
)

// Ports the test's node pretends its API and gossip listen on.
const (
	APIPort    = 7700
	GossipPort = 7946
)

// Registries is the registries list tests give the manager: names the
// zone answers for.
var Registries = []string{"allowed.test", "*.cdn.test", "rebind.test", "slow.test", "short.test",
	"node.test", "resolver.test", "loopback.test", "metadata.test", "mapped.test", "private-ula.test"}

// Topo is one test's world. Everything goes at the test's cleanup.
type Topo struct {
	Tag              string // the manager's tag, unique to this topology
	NodeNS, InetNS   string // paths of the namespaces
	nodeName, inName string
	Zone             *Zone
	closers          []func()
}

// NeedRoot skips a test that cannot make namespaces here.
func NeedRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (network namespaces, veth, nftables)")
	}
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		t.Skip("needs /dev/net/tun")
	}
}

// New builds a topology.
func New(t testing.TB) *Topo {
	t.Helper()
	NeedRoot(t)
	// Tests in several packages run at once, each with its own world:
	// 36³ tags keep their names apart.
	tag := strconv.FormatInt(rand.Int64N(36*36*36), 36)
	tp := &Topo{Tag: "t" + strings.Repeat("0", 3-len(tag)) + tag, Zone: NewZone()}
	t.Cleanup(tp.close)
	tp.nodeName, tp.inName = "wt-node-"+tp.Tag, "wt-inet-"+tp.Tag
	tp.NodeNS, tp.InetNS = "/run/netns/"+tp.nodeName, "/run/netns/"+tp.inName
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range []string{tp.nodeName, tp.inName} {
		netpolicy.DeleteNamedNS(n)
		must(netpolicy.NewNamedNS(n))
		tp.closers = append(tp.closers, func() { netpolicy.DeleteNamedNS(n) })
	}
	node, err := netns.GetFromPath(tp.NodeNS)
	must(err)
	defer node.Close()
	inet, err := netns.GetFromPath(tp.InetNS)
	must(err)
	defer inet.Close()
	nh, err := netlink.NewHandleAt(node)
	must(err)
	defer nh.Close()
	ih, err := netlink.NewHandleAt(inet)
	must(err)
	defer ih.Close()
	must(nh.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "up0"}, PeerName: "down0", PeerNamespace: netlink.NsFd(int(inet))}))
	up, _ := nh.LinkByName("up0")
	down, _ := ih.LinkByName("down0")
	lo, _ := ih.LinkByName("lo")
	nlo, _ := nh.LinkByName("lo")
	must(nh.AddrAdd(up, addr(NodeAddr, 24)))
	must(nh.AddrAdd(up, addr(node6Addr, 64)))
	must(ih.AddrAdd(down, addr(inetAddr, 24)))
	must(ih.AddrAdd(down, addr(inet6Addr, 64)))
	for _, a := range []netip.Addr{Web, Web6, Other, Other6, DNS, Private} {
		must(ih.AddrAdd(lo, addr(a, a.BitLen())))
	}
	for _, l := range []netlink.Link{up, nlo} {
		must(nh.LinkSetUp(l))
	}
	for _, l := range []netlink.Link{down, lo} {
		must(ih.LinkSetUp(l))
	}
	must(nh.RouteAdd(&netlink.Route{LinkIndex: up.Attrs().Index, Gw: inetAddr.AsSlice()}))
	must(nh.RouteAdd(&netlink.Route{LinkIndex: up.Attrs().Index, Gw: inet6Addr.AsSlice()}))

	for _, a := range []netip.Addr{Web, Web6, Other, Other6, Private} {
		for _, port := range []uint16{80, GossipPort} {
			tp.serve(t, tp.InetNS, netip.AddrPortFrom(a, port))
		}
	}
	tp.serve(t, tp.InetNS, netip.AddrPortFrom(Web, 53)) // DNS to anyone but the resolver is refused
	tp.serve(t, tp.NodeNS, netip.AddrPortFrom(NodeAddr, APIPort))
	tp.serve(t, tp.NodeNS, netip.AddrPortFrom(NodeAddr, GossipPort))
	var pc net.PacketConn
	must(netpolicy.InNamedNS(tp.InetNS, func() (err error) {
		pc, err = net.ListenPacket("udp", net.JoinHostPort(DNS.String(), "53"))
		return
	}))
	srv := &dns.Server{PacketConn: pc, Handler: tp.Zone}
	// (miekg serves each query on its own goroutine: a delayed answer
	// does not hold up the others.)
	go srv.ActivateAndServe()
	tp.closers = append(tp.closers, func() { srv.Shutdown() })
	return tp
}

// AddNodeAddr gives the node namespace another address, as a node gains
// one while it runs (after the manager started), and serves TCP and UDP
// echo on port 80 there.
func (tp *Topo) AddNodeAddr(t testing.TB, a netip.Addr) {
	t.Helper()
	nh := HandleAt(t, tp.NodeNS)
	lo, err := nh.LinkByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	if err := nh.AddrAdd(lo, addr(a, a.BitLen())); err != nil {
		t.Fatal(err)
	}
	tp.serve(t, tp.NodeNS, netip.AddrPortFrom(a, 80))
}

// addr is a/bits as a link address, without duplicate address detection.
// HandleAt is a netlink handle in the named namespace at path (NodeNS,
// InetNS), closed at the test's cleanup.
func HandleAt(t testing.TB, path string) *netlink.Handle {
	t.Helper()
	ns, err := netns.GetFromPath(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close() // the handle's sockets stay in the namespace
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	return h
}

func addr(a netip.Addr, bits int) *netlink.Addr {
	return &netlink.Addr{IPNet: &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(bits, a.BitLen())}, Flags: unix.IFA_F_NODAD}
}

func (tp *Topo) close() {
	for i := len(tp.closers) - 1; i >= 0; i-- {
		tp.closers[i]()
	}
}

// serve runs a TCP and a UDP echo server on ap in the namespace at path.
func (tp *Topo) serve(t testing.TB, path string, ap netip.AddrPort) {
	var l net.Listener
	var pc net.PacketConn
	if err := netpolicy.InNamedNS(path, func() (err error) {
		if l, err = net.Listen("tcp", ap.String()); err != nil {
			return err
		}
		pc, err = net.ListenPacket("udp", ap.String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	tp.closers = append(tp.closers, func() { l.Close(); pc.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				buf := make([]byte, 512)
				for {
					n, err := c.Read(buf)
					if err != nil {
						return
					}
					c.Write(buf[:n])
				}
			}()
		}
	}()
	go func() {
		buf := make([]byte, 512)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			pc.WriteTo(buf[:n], from)
		}
	}()
}

// Config is a manager config for this topology; the test adds to it.
func (tp *Topo) Config(pool int, audit func(string, netpolicy.AuditBatch)) netpolicy.Config {
	return netpolicy.Config{
		Tag: tp.Tag, HostNS: tp.NodeNS,
		Upstream:     net.JoinHostPort(DNS.String(), "53"),
		ClusterPorts: []uint16{APIPort, GossipPort},
		Registries:   Registries,
		Pool:         pool, AuditInterval: 100 * time.Millisecond, Audit: audit,
	}
}

// Manager starts a manager in this topology, closed at the test's end.
func (tp *Topo) Manager(t testing.TB, pool int, audit func(string, netpolicy.AuditBatch)) *netpolicy.Manager {
	t.Helper()
	m, err := netpolicy.New(tp.Config(pool, audit))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// Zone is the upstream DNS server's data, changeable by the test.
type Zone struct {
	mu    sync.Mutex
	a     map[string][]netip.Addr
	ttl   map[string]uint32        // default 30
	delay map[string]time.Duration // before answering
	last  map[string]*dns.Msg      // the last query for each name
}

// LastQuery is the last query the server got for name (with the final
// dot), as it came, or nil.
func (z *Zone) LastQuery(name string) *dns.Msg {
	z.mu.Lock()
	defer z.mu.Unlock()
	return z.last[name]
}

// NewZone holds the names the tests ask for: allowed.test and
// www.cdn.test (the web host), denied.test (other), rebind.test (web until
// a test changes it), and names that point at always-denied addresses.
func NewZone() *Zone {
	return &Zone{a: map[string][]netip.Addr{
		"allowed.test.":     {Web, Web6},
		"www.cdn.test.":     {Web},
		"denied.test.":      {Other},
		"rebind.test.":      {Web},
		"node.test.":        {NodeAddr},
		"resolver.test.":    {netip.MustParseAddr("10.213.0.1")},
		"loopback.test.":    {netip.MustParseAddr("127.0.0.1")},
		"metadata.test.":    {netip.MustParseAddr("169.254.169.254")},
		"mapped.test.":      {netip.MustParseAddr("::ffff:10.99.0.10")},
		"private-ula.test.": {netip.MustParseAddr("fd00::1")},
		"slow.test.":        {Other},
		"short.test.":       {Web},
	}, ttl: map[string]uint32{"short.test.": 1}, delay: map[string]time.Duration{}, last: map[string]*dns.Msg{}}
}

// SetDelay makes the server wait d before answering name.
func (z *Zone) SetDelay(name string, d time.Duration) {
	z.mu.Lock()
	defer z.mu.Unlock()
	z.delay[name] = d
}

// Set points name (with the final dot) at addrs.
func (z *Zone) Set(name string, addrs ...netip.Addr) {
	z.mu.Lock()
	defer z.mu.Unlock()
	z.a[name] = addrs
}

// ServeDNS answers A and AAAA from the zone, NXDOMAIN for other names.
func (z *Zone) ServeDNS(w dns.ResponseWriter, q *dns.Msg) {
	m := new(dns.Msg)
	m.SetReply(q)
	z.mu.Lock()
	name := q.Question[0].Name
	z.last[name] = q.Copy()
	addrs, ok := z.a[name]
	ttl, delay := z.ttl[name], z.delay[name]
	z.mu.Unlock()
	if ttl == 0 {
		ttl = 30
	}
	time.Sleep(delay)
	if !ok {
		m.Rcode = dns.RcodeNameError
	}
	for _, a := range addrs {
		hdr := dns.RR_Header{Name: name, Class: dns.ClassINET, Ttl: ttl}
		switch {
		case a.Is4() && q.Question[0].Qtype == dns.TypeA:
			hdr.Rrtype = dns.TypeA
			m.Answer = append(m.Answer, &dns.A{Hdr: hdr, A: a.AsSlice()})
		case a.Is6() && q.Question[0].Qtype == dns.TypeAAAA:
			hdr.Rrtype = dns.TypeAAAA
			m.Answer = append(m.Answer, &dns.AAAA{Hdr: hdr, AAAA: a.AsSlice()})
		}
	}
	w.WriteMsg(m)
}

// ProbePy is run by python3 inside the guest: it resolves a name or takes an
// address, connects over TCP to port 80, sends "ping" and reads the echo.
// It prints one line: "ok ADDR MS", "refused ADDR MS ERR" or "noname ERR".
const ProbePy = `
import socket, sys, time
host = sys.argv[1]
port = int(sys.argv[2]) if len(sys.argv) > 2 else 80
try:
    addr = socket.gethostbyname(host)
except Exception as e:
    print("noname", type(e).__name__); sys.exit(0)
s = socket.socket(); s.settimeout(3)
t = time.monotonic()
try:
    s.connect((addr, port)); s.send(b"ping"); d = s.recv(4)
    print("ok", addr, round((time.monotonic() - t) * 1000, 1), d.decode())
except Exception as e:
    print("refused", addr, round((time.monotonic() - t) * 1000, 1), type(e).__name__)
`

// Probe writes ProbePy into a sandbox (once per sandbox) and runs it with
// args through run, which executes a shell script in the sandbox and
// returns its output and exit code. It returns the printed fields.
func Probe(t testing.TB, run func(script string) (string, int), args string) []string {
	t.Helper()
	out, code := run("test -f /tmp/probe.py || cat > /tmp/probe.py <<'EOF'\n" + ProbePy + "EOF\npython3 /tmp/probe.py " + args)
	if code != 0 {
		t.Fatalf("probe %s: exit %d: %s", args, code, out)
	}
	t.Logf("probe %s: %s", args, strings.TrimSpace(out))
	return strings.Fields(out)
}
