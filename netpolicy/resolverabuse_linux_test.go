package netpolicy_test

import (
	"context"
	"net"
	"net/netip"
	"runtime"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/vishvananda/netlink"

	"github.com/warrenhq/warren/netpolicy"
	. "github.com/warrenhq/warren/netpolicy/netpolicytest"
)

// A sandbox flooding its resolver while its lock is held (an audit read's
// netlink dumps hold it) does not pile up a goroutine per query: past a
// bound, queries are dropped unanswered. Before, each of thousands of
// queries waited on the lock in a goroutine of its own. Lookups work again
// once the lock is let go.
func TestAResolverFloodPilesUpNoGoroutines(t *testing.T) {
	tp := New(t)
	m := tp.Manager(t, 0, nil)
	s, err := m.Claim(context.Background(), "sb-flood", netpolicy.Policy{})
	if err != nil {
		t.Fatal(err)
	}
	c := dialResolver(t, s)
	defer c.Close()
	q := new(dns.Msg)
	q.SetQuestion("denied.test.", dns.TypeA)
	b, err := q.Pack()
	if err != nil {
		t.Fatal(err)
	}
	base := runtime.NumGoroutine()
	release := s.Hold()
	peak := 0
	for i := 0; i < 4000; i++ {
		c.Write(b)
		if i%100 == 99 {
			time.Sleep(2 * time.Millisecond) // the socket's buffer drains
			peak = max(peak, runtime.NumGoroutine()-base)
		}
	}
	time.Sleep(200 * time.Millisecond)
	peak = max(peak, runtime.NumGoroutine()-base)
	release()
	if peak > 1000 {
		t.Errorf("%d more goroutines while 4,000 queries met a held lock; want a bound well under that", peak)
	}
	// Lookups work again once the flood's backlog is served; until then a
	// query may be dropped, and a client asks again, as this one does.
	q.SetQuestion("allowed.test.", dns.TypeA)
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, _, err := (&dns.Client{Timeout: time.Second}).ExchangeWithConn(q, &dns.Conn{Conn: c})
		if err == nil && resp.Id == q.Id {
			if resp.Rcode != dns.RcodeSuccess || len(resp.Answer) == 0 {
				t.Errorf("allowed.test after the flood: rcode %d, %v", resp.Rcode, resp.Answer)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("allowed.test after the flood: no answer within 30 s (last: %v)", err)
		}
		q.Id = dns.Id()
	}
}

// A host on the node's network with a route to the resolver's addresses
// cannot reach the resolver: it is the sandboxes' alone. Before, such a
// host's TCP connections were accepted and counted against the
// resolver's places, so enough of them cut DNS over TCP off for every
// sandbox.
func TestTheResolverIsUnreachableFromTheNodesNetwork(t *testing.T) {
	tp := New(t)
	m := tp.Manager(t, 0, nil)
	res := m.Resolver()
	h := HandleAt(t, tp.InetNS)
	down, err := h.LinkByName("down0")
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []struct{ dst, via netip.Addr }{{res.Host4, NodeAddr}, {res.Host6, netip.MustParseAddr("2001:db8:113::2")}} {
		bits := r.dst.BitLen()
		if err := h.RouteAdd(&netlink.Route{LinkIndex: down.Attrs().Index, Dst: &net.IPNet{IP: r.dst.AsSlice(), Mask: net.CIDRMask(bits, bits)}, Gw: r.via.AsSlice()}); err != nil {
			t.Fatal(err)
		}
	}
	for _, a := range []netip.Addr{res.Host4, res.Host6} {
		var c net.Conn
		err := netpolicy.InNamedNS(tp.InetNS, func() (err error) {
			c, err = (&net.Dialer{Timeout: 2 * time.Second}).Dial("tcp", netip.AddrPortFrom(a, 53).String())
			return
		})
		if err == nil {
			c.Close()
			t.Errorf("a host on the node's network connected to the resolver at %v", a)
		}
	}
}
