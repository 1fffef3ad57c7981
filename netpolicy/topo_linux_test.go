package netpolicy

import (
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// topo is the tests' own little world, all in namespaces the test makes
// and removes; no packet leaves them:
//
//	node ns (the node's "root"): uplink 203.0.113.2/24, 2001:db8:113::2/64,
//	  plus the manager's resolver link and sandbox veths
//	inet ns: 203.0.113.1 and 2001:db8:113::1 toward the node, and the test
//	  hosts on its loopback: web 198.51.100.10 and 2001:db8:100::10
//	  (allowed by name), other 198.51.100.20 and 2001:db8:100::20 (never
//	  allowed), dns 198.51.100.53 (the upstream), private 10.99.0.10.
type topo struct {
	tag              string
	node, inet       netns.NsHandle
	nodeName, inName string
	zone             *zone
	closers          []func()
}

var (
	webAddr     = netip.MustParseAddr("198.51.100.10")
	web6Addr    = netip.MustParseAddr("2001:db8:100::10")
	otherAddr   = netip.MustParseAddr("198.51.100.20")
	other6Addr  = netip.MustParseAddr("2001:db8:100::20")
	dnsAddr     = netip.MustParseAddr("198.51.100.53")
	privateAddr = netip.MustParseAddr("10.99.0.10")
	nodeUplink  = netip.MustParseAddr("203.0.113.2")
)

// Ports the test's node pretends its API and gossip listen on.
const (
	apiPort    = 7700
	gossipPort = 7946
)

func needRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (network namespaces, veth, nftables)")
	}
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		t.Skip("needs /dev/net/tun")
	}
}

func newTopo(t testing.TB) *topo {
	t.Helper()
	needRoot(t)
	tp := &topo{tag: fmt.Sprintf("t%03d", rand.IntN(1000)), zone: newZone()}
	t.Cleanup(tp.close)
	var err error
	tp.nodeName, tp.inName = "wt-node-"+tp.tag, "wt-inet-"+tp.tag
	deleteNS(tp.nodeName)
	deleteNS(tp.inName)
	if tp.node, err = createNS(tp.nodeName); err != nil {
		t.Fatal(err)
	}
	tp.closers = append(tp.closers, func() { tp.node.Close(); deleteNS(tp.nodeName) })
	if tp.inet, err = createNS(tp.inName); err != nil {
		t.Fatal(err)
	}
	tp.closers = append(tp.closers, func() { tp.inet.Close(); deleteNS(tp.inName) })
	nh, _ := netlink.NewHandleAt(tp.node)
	defer nh.Close()
	ih, _ := netlink.NewHandleAt(tp.inet)
	defer ih.Close()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(nh.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "up0"}, PeerName: "down0", PeerNamespace: netlink.NsFd(int(tp.inet))}))
	up, _ := nh.LinkByName("up0")
	down, _ := ih.LinkByName("down0")
	lo, _ := ih.LinkByName("lo")
	nlo, _ := nh.LinkByName("lo")
	must(nh.AddrAdd(up, prefixOf(nodeUplink, 24)))
	must(nh.AddrAdd(up, prefixOf(netip.MustParseAddr("2001:db8:113::2"), 64)))
	must(ih.AddrAdd(down, prefixOf(netip.MustParseAddr("203.0.113.1"), 24)))
	must(ih.AddrAdd(down, prefixOf(netip.MustParseAddr("2001:db8:113::1"), 64)))
	for _, a := range []netip.Addr{webAddr, web6Addr, otherAddr, other6Addr, dnsAddr, privateAddr} {
		must(ih.AddrAdd(lo, prefixOf(a, a.BitLen())))
	}
	for _, l := range []netlink.Link{up, nlo} {
		must(nh.LinkSetUp(l))
	}
	for _, l := range []netlink.Link{down, lo} {
		must(ih.LinkSetUp(l))
	}
	must(nh.RouteAdd(&netlink.Route{LinkIndex: up.Attrs().Index, Gw: netip.MustParseAddr("203.0.113.1").AsSlice()}))
	must(nh.RouteAdd(&netlink.Route{LinkIndex: up.Attrs().Index, Gw: netip.MustParseAddr("2001:db8:113::1").AsSlice()}))

	// The hosts: TCP and UDP echo on web, other and private (port 80 and
	// the cluster ports), and the upstream DNS server.
	for _, a := range []netip.Addr{webAddr, web6Addr, otherAddr, other6Addr, privateAddr} {
		for _, port := range []int{80, gossipPort} {
			tp.serve(t, tp.inet, netip.AddrPortFrom(a, uint16(port)))
		}
	}
	// The node's own API and gossip ports.
	tp.serve(t, tp.node, netip.AddrPortFrom(nodeUplink, apiPort))
	tp.serve(t, tp.node, netip.AddrPortFrom(nodeUplink, gossipPort))
	var pc net.PacketConn
	must(inNS(tp.inet, func() (err error) {
		pc, err = net.ListenPacket("udp", net.JoinHostPort(dnsAddr.String(), "53"))
		return
	}))
	srv := &dns.Server{PacketConn: pc, Handler: tp.zone}
	go srv.ActivateAndServe()
	tp.closers = append(tp.closers, func() { srv.Shutdown() })
	return tp
}

func (tp *topo) close() {
	for i := len(tp.closers) - 1; i >= 0; i-- {
		tp.closers[i]()
	}
}

// serve runs a TCP and a UDP echo server on ap in ns.
func (tp *topo) serve(t testing.TB, ns netns.NsHandle, ap netip.AddrPort) {
	var l net.Listener
	var pc net.PacketConn
	if err := inNS(ns, func() (err error) {
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

func (tp *topo) manager(t testing.TB, pool int, audit func(string, AuditBatch)) *Manager {
	t.Helper()
	m, err := New(Config{
		Tag: tp.tag, HostNS: "/run/netns/" + tp.nodeName,
		Upstream:     net.JoinHostPort(dnsAddr.String(), "53"),
		ClusterPorts: []uint16{apiPort, gossipPort},
		Registries: []string{"allowed.test", "*.cdn.test", "rebind.test",
			"node.test", "resolver.test", "loopback.test", "metadata.test", "mapped.test", "private-ula.test"},
		Pool: pool, AuditInterval: 100 * time.Millisecond, Audit: audit,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// zone is the upstream DNS server's data, changeable by the test.
type zone struct {
	mu sync.Mutex
	a  map[string][]netip.Addr
}

func newZone() *zone {
	return &zone{a: map[string][]netip.Addr{
		"allowed.test.":     {webAddr, web6Addr},
		"www.cdn.test.":     {webAddr},
		"denied.test.":      {otherAddr},
		"rebind.test.":      {webAddr},
		"short-ttl.test.":   {webAddr},
		"node.test.":        {nodeUplink},
		"resolver.test.":    {netip.MustParseAddr("10.213.0.1")},
		"loopback.test.":    {netip.MustParseAddr("127.0.0.1")},
		"metadata.test.":    {netip.MustParseAddr("169.254.169.254")},
		"mapped.test.":      {netip.MustParseAddr("::ffff:10.99.0.10")},
		"private-ula.test.": {netip.MustParseAddr("fd00::1")},
	}}
}

func (z *zone) set(name string, addrs ...netip.Addr) {
	z.mu.Lock()
	defer z.mu.Unlock()
	z.a[name] = addrs
}

func (z *zone) ServeDNS(w dns.ResponseWriter, q *dns.Msg) {
	m := new(dns.Msg)
	m.SetReply(q)
	z.mu.Lock()
	addrs, ok := z.a[q.Question[0].Name]
	z.mu.Unlock()
	if !ok {
		m.Rcode = dns.RcodeNameError
	}
	for _, a := range addrs {
		hdr := dns.RR_Header{Name: q.Question[0].Name, Class: dns.ClassINET, Ttl: 30}
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
