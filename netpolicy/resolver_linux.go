package netpolicy

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"
)

// The DNS allowlist resolver: one per node, listening on the resolver slot's
// addresses in the node's namespace. It knows the asking sandbox by its
// source address, answers only names on that sandbox's list (forwarding
// them upstream), drops answers that point at always-denied or node
// addresses (DNS rebinding), and puts the addresses it hands out into the
// sandbox's allow sets before it replies.

const (
	minAllowTTL     = 5 * time.Second // a TTL of 0 or 1 would close the door before the connect
	maxAllowTTL     = time.Hour
	upstreamTimeout = 3 * time.Second
	maxLookups      = 8  // upstream calls in flight per sandbox; more get SERVFAIL
	maxQueries      = 64 // queries in flight per sandbox; more are dropped unanswered
	maxAnswerAddrs  = 32 // addresses taken from one answer; the rest are dropped
)

type resolver struct {
	m       *Manager
	servers []*dns.Server
	wg      sync.WaitGroup
}

func startResolver(m *Manager) (*resolver, error) {
	r := &resolver{m: m}
	for _, a := range []netip.Addr{m.resolver.Host4, m.resolver.Host6} {
		addr := net.JoinHostPort(a.String(), "53")
		var pc net.PacketConn
		var l net.Listener
		err := inNS(m.host, func() error {
			var err error
			if pc, err = net.ListenPacket("udp", addr); err != nil {
				return err
			}
			if l, err = net.Listen("tcp", addr); err != nil {
				pc.Close()
			}
			return err
		})
		if err != nil {
			r.close()
			return nil, fmt.Errorf("netpolicy: resolver on %s: %w", addr, err)
		}
		lim := newLimitListener(l, maxTCPConnsPerSource, maxTCPConns)
		for _, srv := range []*dns.Server{{PacketConn: pc, Handler: r}, {Listener: lim, Handler: r}} {
			started := make(chan struct{})
			srv.NotifyStartedFunc = func() { close(started) }
			r.servers = append(r.servers, srv)
			r.wg.Add(1)
			go func() {
				defer r.wg.Done()
				srv.ActivateAndServe()
			}()
			// Shutdown refuses a server that has not started, so a later
			// failure's close must not find one starting.
			<-started
		}
	}
	return r, nil
}

func (r *resolver) close() {
	for _, s := range r.servers {
		s.Shutdown()
	}
	r.wg.Wait()
}

// ServeDNS answers one query from a sandbox.
func (r *resolver) ServeDNS(w dns.ResponseWriter, q *dns.Msg) {
	reply := func(rcode int) {
		m := new(dns.Msg)
		m.SetRcode(q, rcode)
		m.RecursionAvailable = true
		w.WriteMsg(m)
	}
	src, _ := netip.ParseAddrPort(w.RemoteAddr().String())
	s := r.m.bySource(src.Addr())
	if s == nil {
		reply(dns.RcodeRefused)
		return
	}
	// miekg serves each datagram on a goroutine of its own, and every
	// query below takes the sandbox's lock, which an audit read holds for
	// netlink dumps: a sandbox flooding its resolver piled up a goroutine
	// per query. Past maxQueries in flight a query is dropped unanswered
	// (its client asks again) before it waits on anything.
	select {
	case s.queries <- struct{}{}:
		defer func() { <-s.queries }()
	default:
		return
	}
	if q.Opcode != dns.OpcodeQuery || len(q.Question) != 1 {
		reply(dns.RcodeFormatError)
		return
	}
	name := q.Question[0].Name
	s.mu.Lock()
	matcher, policy, gen := s.matcher, s.policy, s.gen
	s.mu.Unlock()
	if !matcher.Allowed(name) {
		s.noteDNS(AuditEvent{Verdict: "deny", Kind: "dns", Name: name, Reason: "not on the allowlist"})
		reply(dns.RcodeNameError)
		return
	}
	select {
	case s.lookups <- struct{}{}:
		defer func() { <-s.lookups }()
	default:
		reply(dns.RcodeServerFailure) // too many in flight: the client retries
		return
	}
	_, tcp := w.RemoteAddr().(*net.TCPAddr)
	resp, err := r.forward(upstreamQuery(q), tcp)
	if err != nil {
		r.m.log.Debug("resolver: upstream", "name", name, "err", err)
		reply(dns.RcodeServerFailure)
		return
	}
	var addrs []netip.Addr
	ttl := maxAllowTTL
	dropped := 0
	keep := func(rr dns.RR) bool {
		var ip net.IP
		switch v := rr.(type) {
		case *dns.A:
			ip = v.A
		case *dns.AAAA:
			ip = v.AAAA
		default:
			return true
		}
		a, ok := netip.AddrFromSlice(ip)
		if !ok || len(addrs) >= maxAnswerAddrs {
			return false
		}
		a = a.Unmap()
		if !r.m.allowedAnswer(a, policy) {
			dropped++
			return false
		}
		addrs = append(addrs, a)
		ttl = min(ttl, time.Duration(rr.Header().Ttl)*time.Second)
		return true
	}
	resp.Answer = filterRR(resp.Answer, keep)
	resp.Extra = filterRR(resp.Extra, func(rr dns.RR) bool { t := rr.Header().Rrtype; return t != dns.TypeA && t != dns.TypeAAAA })
	resp.Ns = filterRR(resp.Ns, func(rr dns.RR) bool { t := rr.Header().Rrtype; return t != dns.TypeA && t != dns.TypeAAAA })
	if dropped > 0 {
		s.noteDNS(AuditEvent{Verdict: "deny", Kind: "dns", Name: name, Reason: "answer pointed at a private, link-local or node address (DNS rebinding)"})
	}
	if len(addrs) > 0 {
		ttl = max(ttl, minAllowTTL)
		// The client caches the answer as long as the sandbox may use it.
		for _, rr := range resp.Answer {
			if t := rr.Header().Rrtype; t == dns.TypeA || t == dns.TypeAAAA {
				rr.Header().Ttl = uint32(ttl / time.Second)
			}
		}
		s.mu.Lock()
		switch {
		case s.closed:
			err = ErrClosed
		case s.gen != gen:
			err = errors.New("the policy changed during the lookup")
		default:
			err = s.allow(addrs, ttl)
		}
		s.mu.Unlock()
		if err != nil {
			r.m.log.Debug("resolver: allow addresses", "sandbox", s.ID(), "err", err)
			reply(dns.RcodeServerFailure)
			return
		}
	}
	s.noteDNS(AuditEvent{Verdict: "allow", Kind: "dns", Name: name})
	resp.Id = q.Id
	if !tcp {
		size := dns.MinMsgSize
		if o := q.IsEdns0(); o != nil {
			size = max(int(o.UDPSize()), dns.MinMsgSize)
		}
		resp.Truncate(size)
	}
	w.WriteMsg(resp)
}

// expirySkew is how long after s.allowed's time an allow set's element
// may still be there.
const expirySkew = time.Second

// allow puts addrs in the allow sets until now+ttl (s.mu held). An address
// already there until later is left alone; one there until sooner is
// renewed: taken out and put back with the later time, in one batch, since
// a kernel may keep an element's first timeout when it is added again.
func (s *Sandbox) allow(addrs []netip.Addr, ttl time.Duration) error {
	now := time.Now()
	until := now.Add(ttl)
	var add, renew []netip.Addr
	for _, a := range addrs {
		exp, ok := s.allowed[a]
		switch {
		case ok && exp.After(now) && !until.After(exp):
			continue
		case ok && exp.After(now.Add(-expirySkew)):
			// Also one whose time passed a moment ago: the kernel's
			// element may outlive it by a few ms (its clock, jiffies),
			// and adding it again there would keep its old timeout.
			renew = append(renew, a)
		}
		add = append(add, a)
	}
	if len(add) == 0 {
		return nil
	}
	err := renewAddrs(s.nft, s.sets, renew, add, ttl)
	if errors.Is(err, unix.ENOENT) {
		// An address of renew timed out just now (the kernel's clock is
		// not quite ours), which undid the batch. The error does not say
		// which: renew each address alone, and add alone the one that is
		// gone.
		err = nil
		for _, a := range add {
			one := []netip.Addr{a}
			if !slices.Contains(renew, a) {
				err = errors.Join(err, allowAddrs(s.nft, s.sets, one, ttl))
				continue
			}
			e := renewAddrs(s.nft, s.sets, one, one, ttl)
			if errors.Is(e, unix.ENOENT) {
				e = allowAddrs(s.nft, s.sets, one, ttl)
			}
			err = errors.Join(err, e)
		}
	}
	if err != nil {
		return err
	}
	for _, a := range add {
		s.allowed[a] = until
	}
	for a, exp := range s.allowed { // forget what the kernel has timed out
		if exp.Before(now) {
			delete(s.allowed, a)
		}
	}
	return nil
}

func filterRR(rrs []dns.RR, keep func(dns.RR) bool) []dns.RR {
	out := rrs[:0]
	for _, rr := range rrs {
		if keep(rr) {
			out = append(out, rr)
		}
	}
	return out
}

// allowedAnswer reports whether the resolver may hand out a: not in the
// always-denied ranges, not the node's, unless the policy allows it by
// prefix.
func (m *Manager) allowedAnswer(a netip.Addr, p Policy) bool {
	for _, pfx := range p.AllowPrefixes {
		if pfx.Contains(a) {
			return true
		}
	}
	if Denied(a) || m.pool.p4.Contains(a) || m.pool.p6.Contains(a) {
		return false
	}
	for _, d := range m.denied {
		if d == a {
			return false
		}
	}
	return true
}

// upstreamQuery is the query the resolver sends upstream for q: its
// question, its recursion, checking and authenticated-data flags (a stub
// sets AD to ask for it in the answer, RFC 6840 5.7), and EDNS with its
// UDP size (at most maxUpstreamUDP) and DNSSEC bit, under an id of its
// own; nothing else. q as sent would carry whatever the sandbox put in it
// to the upstream resolver: EDNS options of its own (arbitrary bytes in a
// local option, a client subnet), records in its additional section and
// its 16 bits of id, a channel out of the sandbox beside the names the
// policy allows. (The answer gets q's id back in ServeDNS.)
func upstreamQuery(q *dns.Msg) *dns.Msg {
	out := new(dns.Msg)
	out.Id = dns.Id()
	out.Opcode = dns.OpcodeQuery
	out.RecursionDesired = q.RecursionDesired
	out.CheckingDisabled = q.CheckingDisabled
	out.AuthenticatedData = q.AuthenticatedData
	out.Question = []dns.Question{q.Question[0]}
	if o := q.IsEdns0(); o != nil {
		out.SetEdns0(min(max(o.UDPSize(), dns.MinMsgSize), maxUpstreamUDP), o.Do())
	}
	return out
}

// maxUpstreamUDP bounds the UDP answer size the resolver asks upstream for
// (DNS flag day 2020's advice: no fragmented answers).
const maxUpstreamUDP = 1232

// forward asks the upstream from the node's namespace, over TCP when the
// sandbox asked over TCP or the UDP answer was truncated.
func (r *resolver) forward(q *dns.Msg, tcp bool) (*dns.Msg, error) {
	for attempt := 0; attempt < 2; attempt++ {
		network := "udp"
		if tcp {
			network = "tcp"
		}
		var c net.Conn
		dial := func() (err error) {
			c, err = net.DialTimeout(network, r.m.cfg.Upstream, upstreamTimeout)
			return err
		}
		var err error
		if r.m.cfg.HostNS == "" {
			err = dial() // this process's namespace is the node's
		} else {
			err = inNS(r.m.host, dial)
		}
		if err != nil {
			return nil, err
		}
		cl := &dns.Client{Net: network, Timeout: upstreamTimeout}
		resp, _, err := cl.ExchangeWithConn(q.Copy(), &dns.Conn{Conn: c})
		c.Close()
		if err != nil {
			return nil, err
		}
		if resp.Truncated && !tcp {
			tcp = true
			continue
		}
		return resp, nil
	}
	return nil, errors.New("upstream answer truncated over TCP")
}

// systemResolver is the first nameserver of /etc/resolv.conf.
func systemResolver() (string, error) {
	cc, err := dns.ClientConfigFromFile("/etc/resolv.conf")
	if err != nil {
		return "", err
	}
	if len(cc.Servers) == 0 {
		return "", errors.New("/etc/resolv.conf names no nameserver")
	}
	port := cc.Port
	if port == "" {
		port = strconv.Itoa(53)
	}
	return net.JoinHostPort(cc.Servers[0], port), nil
}
