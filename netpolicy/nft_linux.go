package netpolicy

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// This file is the thin layer between Rules (data) and nftables: it turns
// them into one table per sandbox namespace and edits that table's sets.

const tableName = "warren"

// Registers: a 16-byte register for single values, 4-byte registers for
// the audit sets' concatenated keys (address . protocol . port).
const (
	reg1      = 1
	regAddr   = 8 // NFT_REG32_00
	regProto4 = 9
	regPort4  = 10
	regProto6 = 12 // after a 16-byte address in 8..11
	regPort6  = 13
)

// nftSets are the named sets of a sandbox table.
type nftSets struct {
	table                  *nftables.Table
	allow4, allow6         *nftables.Set // resolver-handed addresses, with timeouts
	pfx4, pfx6             *nftables.Set // explicitly allowed ranges
	deny4, deny6           *nftables.Set // always-denied ranges
	ports                  *nftables.Set // cluster ports
	auditOK4, auditOK6     *nftables.Set // attempts let through
	auditDeny4, auditDeny6 *nftables.Set // attempts refused
}

// auditTTL is how long an attempt stays in an audit set after its last
// packet; the auditor reads the sets far more often than that.
const auditTTL = 10 * time.Minute

// maxAllowed bounds each allow set: a name whose DNS an attacker controls
// cannot grow the node's kernel memory without end.
const maxAllowed = 4096

// auditSize bounds each audit set; when one is full, new attempts are still
// filtered, only not recorded: the auditor reports that once, as an
// audit_full event (Sandbox.noteFull).
const auditSize = 4096

func newSets() *nftSets {
	t := &nftables.Table{Name: tableName, Family: nftables.TableFamilyINet}
	audit := func(name string, addr nftables.SetDatatype) *nftables.Set {
		return &nftables.Set{Table: t, Name: name, KeyType: nftables.MustConcatSetType(addr, nftables.TypeInetProto, nftables.TypeInetService),
			Concatenation: true, Dynamic: true, HasTimeout: true, Timeout: auditTTL, Counter: true, Size: auditSize}
	}
	s := &nftSets{
		table:      t,
		allow4:     &nftables.Set{Table: t, Name: "allow4", KeyType: nftables.TypeIPAddr, HasTimeout: true, Size: maxAllowed},
		allow6:     &nftables.Set{Table: t, Name: "allow6", KeyType: nftables.TypeIP6Addr, HasTimeout: true, Size: maxAllowed},
		pfx4:       &nftables.Set{Table: t, Name: "pfx4", KeyType: nftables.TypeIPAddr, Interval: true},
		pfx6:       &nftables.Set{Table: t, Name: "pfx6", KeyType: nftables.TypeIP6Addr, Interval: true},
		deny4:      &nftables.Set{Table: t, Name: "deny4", KeyType: nftables.TypeIPAddr, Interval: true},
		deny6:      &nftables.Set{Table: t, Name: "deny6", KeyType: nftables.TypeIP6Addr, Interval: true},
		ports:      &nftables.Set{Table: t, Name: "ports", KeyType: nftables.TypeInetService},
		auditOK4:   audit("audit_ok4", nftables.TypeIPAddr),
		auditOK6:   audit("audit_ok6", nftables.TypeIP6Addr),
		auditDeny4: audit("audit_deny4", nftables.TypeIPAddr),
		auditDeny6: audit("audit_deny6", nftables.TypeIP6Addr),
	}
	// Number the sets here: google/nftables numbers sets left at 0 from a
	// package global without a lock, which races between connections.
	// IDs need only be unique within one batch.
	for i, set := range []*nftables.Set{s.allow4, s.allow6, s.pfx4, s.pfx6, s.deny4, s.deny6, s.ports, s.auditOK4, s.auditOK6, s.auditDeny4, s.auditDeny6} {
		set.ID = uint32(i + 1)
	}
	return s
}

// installRules creates the sandbox table in the namespace c talks to, in
// one netlink batch.
func installRules(c *nftables.Conn, r Rules) (*nftSets, error) {
	s := newSets()
	if err := addRules(c, s, r); err != nil {
		return nil, err
	}
	if err := c.Flush(); err != nil {
		return nil, fmt.Errorf("nftables: install table %s: %w", tableName, err)
	}
	return s, nil
}

// rebuildRules replaces the sandbox table an earlier run of the node made
// (with that run's rules: an older binary's, or other node addresses or
// cluster ports) by r's, in one netlink batch, so no packet meets a
// table half built: it deletes the table's chains, with their rules, and
// its sets but the audit sets, then adds what installRules would, and
// puts back into the allow sets the addresses of allowed (when each
// leaves them) with the time they have left. The audit sets stay as they
// are, counters and all: the attempts in them not yet reported are
// reported by this run. If the kernel refuses that batch (an audit set
// this binary defines otherwise), the whole table is replaced in one
// batch instead, and kept is false: the audit sets start empty.
// Connections go on either way: conntrack is not in the table.
func rebuildRules(c *nftables.Conn, r Rules, allowed map[netip.Addr]time.Time) (s *nftSets, kept bool, err error) {
	s = newSets()
	if err = replaceRules(c, s, r, allowed); err == nil {
		return s, true, nil
	}
	c.DelTable(s.table)
	if err := addRules(c, s, r); err != nil {
		return nil, false, err
	}
	if err := addAllowed(c, s, allowed); err != nil {
		return nil, false, err
	}
	if err2 := c.Flush(); err2 != nil {
		return nil, false, fmt.Errorf("nftables: replace table %s: %w (replacing its rules alone: %v)", tableName, err2, err)
	}
	return s, false, nil
}

// replaceRules is rebuildRules' first try: the table's audit sets kept.
func replaceRules(c *nftables.Conn, s *nftSets, r Rules, allowed map[netip.Addr]time.Time) error {
	chains, err := c.ListChainsOfTableFamily(s.table.Family)
	if err != nil {
		return fmt.Errorf("nftables: list chains: %w", err)
	}
	sets, err := c.GetSets(s.table)
	if err != nil {
		return fmt.Errorf("nftables: list sets: %w", err)
	}
	// Every rule first: a chain that another's rules jump to, or a set
	// that rules look up, can only go once those rules have.
	var ours []*nftables.Chain
	for _, ch := range chains {
		if ch.Table != nil && ch.Table.Name == s.table.Name {
			ours = append(ours, ch)
			c.FlushChain(ch)
		}
	}
	for _, ch := range ours {
		c.DelChain(ch)
	}
	audit := map[string]bool{}
	for _, set := range []*nftables.Set{s.auditOK4, s.auditOK6, s.auditDeny4, s.auditDeny6} {
		audit[set.Name] = true
	}
	for _, set := range sets {
		if !set.Anonymous && !audit[set.Name] {
			c.DelSet(set)
		}
	}
	// Adding a set that exists (an audit set) keeps it, elements and all.
	if err := addRules(c, s, r); err != nil {
		return err
	}
	if err := addAllowed(c, s, allowed); err != nil {
		return err
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("nftables: replace the rules of table %s: %w", tableName, err)
	}
	return nil
}

// addAllowed queues allowed's addresses into the allow sets, each for
// the time it has left (one that has none left stays out).
func addAllowed(c *nftables.Conn, s *nftSets, allowed map[netip.Addr]time.Time) error {
	var els []nftables.SetElement
	for a, until := range allowed {
		left := time.Until(until).Round(time.Millisecond)
		if left <= 0 {
			continue // an element without a timeout would never leave
		}
		els = append(els, nftables.SetElement{Key: a.AsSlice(), Timeout: left})
	}
	return queueAllow(c, s, els)
}

// queueAllow queues els (keys of 4 or 16 bytes) into the allow set of
// their family, without sending them.
func queueAllow(c *nftables.Conn, s *nftSets, els []nftables.SetElement) error {
	var e4, e6 []nftables.SetElement
	for _, el := range els {
		if len(el.Key) == 4 {
			e4 = append(e4, el)
		} else {
			e6 = append(e6, el)
		}
	}
	if len(e4) > 0 {
		if err := c.SetAddElements(s.allow4, e4); err != nil {
			return err
		}
	}
	if len(e6) > 0 {
		if err := c.SetAddElements(s.allow6, e6); err != nil {
			return err
		}
	}
	return nil
}

// addRules queues the sandbox table, its sets and its chains, with r's
// rules, without sending them.
func addRules(c *nftables.Conn, s *nftSets, r Rules) error {
	t := c.AddTable(s.table)
	for _, set := range []*nftables.Set{s.allow4, s.allow6, s.ports, s.auditOK4, s.auditOK6, s.auditDeny4, s.auditDeny6} {
		if err := c.AddSet(set, nil); err != nil {
			return fmt.Errorf("set %s: %w", set.Name, err)
		}
	}
	for _, x := range []struct {
		set *nftables.Set
		rs  []addrRange
	}{{s.pfx4, r.Allow4}, {s.pfx6, r.Allow6}, {s.deny4, r.Deny4}, {s.deny6, r.Deny6}} {
		if err := c.AddSet(x.set, intervalElems(x.rs)); err != nil {
			return fmt.Errorf("set %s: %w", x.set.Name, err)
		}
	}
	if len(r.ClusterPorts) > 0 {
		var els []nftables.SetElement
		for _, p := range r.ClusterPorts {
			els = append(els, nftables.SetElement{Key: binaryutil.BigEndian.PutUint16(p)})
		}
		if err := c.SetAddElements(s.ports, els); err != nil {
			return err
		}
	}

	drop, accept := nftables.ChainPolicyDrop, nftables.ChainPolicyAccept
	egress := c.AddChain(&nftables.Chain{Name: "egress", Table: t})
	allow := c.AddChain(&nftables.Chain{Name: "allow", Table: t})
	deny := c.AddChain(&nftables.Chain{Name: "deny", Table: t})
	in := c.AddChain(&nftables.Chain{Name: "in", Table: t, Type: nftables.ChainTypeFilter, Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter, Policy: &drop})
	out := c.AddChain(&nftables.Chain{Name: "out", Table: t, Type: nftables.ChainTypeFilter, Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityFilter, Policy: &drop})
	fwd := c.AddChain(&nftables.Chain{Name: "fwd", Table: t, Type: nftables.ChainTypeFilter, Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &drop})
	add := func(ch *nftables.Chain, e ...expr.Any) { c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: e}) }

	// Inbound: replies only (to connections the sandbox opened: egress),
	// and related ICMP errors. Neighbour discovery keeps IPv6 working.
	add(in, ctState(expr.CtStateBitRELATED, verdict(expr.VerdictAccept))...)
	add(in, ctState(expr.CtStateBitESTABLISHED, ctDirection(1, verdict(expr.VerdictAccept))...)...)
	add(in, ifname(expr.MetaKeyIIFNAME, "lo", verdict(expr.VerdictAccept))...)
	add(in, ndp(verdict(expr.VerdictAccept))...)
	// The kernels' own multicast membership reports (MLD, IGMP), which
	// never leave the link: dropped without a word, not recorded as
	// denials the sandbox never attempted.
	for _, r := range groupReports(verdict(expr.VerdictDrop)) {
		add(in, r...)
		add(out, r...)
		add(fwd, r...)
	}
	// A microVM poking its own gateway is refused like any denied
	// destination.
	add(in, ifname(expr.MetaKeyIIFNAME, IfaceGuest, goTo(deny))...)

	add(out, ifname(expr.MetaKeyOIFNAME, "lo", verdict(expr.VerdictAccept))...)
	add(out, ndp(verdict(expr.VerdictAccept))...)
	// Toward a microVM the namespace itself sends only rejections.
	add(out, ifname(expr.MetaKeyOIFNAME, IfaceGuest, verdict(expr.VerdictAccept))...)
	// Everything else a container's processes send is egress.
	add(out, goTo(egress))
	// A microVM's traffic is forwarded from tap0 to eth0 and masqueraded.
	add(fwd, ifname(expr.MetaKeyIIFNAME, IfaceGuest, goTo(egress))...)
	add(fwd, append(ifname(expr.MetaKeyOIFNAME, IfaceGuest), ctState(expr.CtStateBitRELATED, verdict(expr.VerdictAccept))...)...)
	add(fwd, append(ifname(expr.MetaKeyOIFNAME, IfaceGuest), ctState(expr.CtStateBitESTABLISHED, ctDirection(1, verdict(expr.VerdictAccept))...)...)...)
	post := c.AddChain(&nftables.Chain{Name: "post", Table: t, Type: nftables.ChainTypeNAT, Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource, Policy: &accept})
	add(post, ifname(expr.MetaKeyOIFNAME, IfaceUplink, &expr.Masq{})...)

	// egress: every new connection attempt the sandbox makes. An
	// established connection goes on only in the direction the sandbox
	// opened it: a container could otherwise send itself, over lo (which
	// out accepts), a datagram from a spoofed source (IPv6 lets a
	// process send from an address it does not hold, IPV6_FREEBIND), and
	// its "reply" to that address was established traffic, past every set
	// and the audit: UDP to any IPv6 host.
	add(egress, ctState(expr.CtStateBitRELATED, verdict(expr.VerdictAccept))...)
	add(egress, ctState(expr.CtStateBitESTABLISHED, ctDirection(0, verdict(expr.VerdictAccept))...)...)
	add(egress, ctState(expr.CtStateBitINVALID, verdict(expr.VerdictDrop))...)
	for _, res := range []netip.Addr{r.Resolver4, r.Resolver6} {
		if !res.IsValid() {
			continue
		}
		for _, proto := range []byte{unix.IPPROTO_UDP, unix.IPPROTO_TCP} {
			add(egress, dnsTo(res, proto, verdict(expr.VerdictAccept))...)
		}
	}
	add(egress, inSet(false, s.pfx4, goTo(allow))...)
	add(egress, inSet(true, s.pfx6, goTo(allow))...)
	for _, proto := range []byte{unix.IPPROTO_TCP, unix.IPPROTO_UDP} {
		e := append(l4proto(proto), dport(reg1), &expr.Lookup{SourceRegister: reg1, SetName: s.ports.Name, SetID: s.ports.ID})
		add(egress, append(e, goTo(deny))...)
	}
	add(egress, inSet(false, s.deny4, goTo(deny))...)
	add(egress, inSet(true, s.deny6, goTo(deny))...)
	// DNS goes to the node's resolver only, even to an allowed address.
	for _, proto := range []byte{unix.IPPROTO_TCP, unix.IPPROTO_UDP} {
		e := append(l4proto(proto), dport(reg1), &expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: binaryutil.BigEndian.PutUint16(53)})
		add(egress, append(e, goTo(deny))...)
	}
	for _, proto := range []byte{unix.IPPROTO_TCP, unix.IPPROTO_UDP} {
		add(egress, append(l4proto(proto), inSet(false, s.allow4, goTo(allow))...)...)
		add(egress, append(l4proto(proto), inSet(true, s.allow6, goTo(allow))...)...)
	}
	add(egress, goTo(deny))

	for _, e := range auditRules(s.auditOK4, s.auditOK6) {
		add(allow, e...)
	}
	add(allow, verdict(expr.VerdictAccept))
	for _, e := range auditRules(s.auditDeny4, s.auditDeny6) {
		add(deny, e...)
	}
	add(deny, append(l4proto(unix.IPPROTO_TCP), &expr.Reject{Type: unix.NFT_REJECT_TCP_RST})...)
	add(deny, &expr.Reject{Type: unix.NFT_REJECT_ICMPX_UNREACH, Code: unix.NFT_REJECT_ICMPX_ADMIN_PROHIBITED})
	return nil
}

// auditRules record an attempt's (address, protocol, port) with a packet
// counter in the v4 or v6 set; the port is 0 for protocols without one.
func auditRules(set4, set6 *nftables.Set) [][]expr.Any {
	var out [][]expr.Any
	for _, v6 := range []bool{false, true} {
		set, rp, rport := set4, uint32(regProto4), uint32(regPort4)
		if v6 {
			set, rp, rport = set6, regProto6, regPort6
		}
		key := func() []expr.Any {
			e := nfproto(v6)
			e = append(e, daddr(v6, regAddr), &expr.Meta{Key: expr.MetaKeyL4PROTO, Register: rp})
			return e
		}
		dyn := &expr.Dynset{SrcRegKey: regAddr, SetName: set.Name, SetID: set.ID, Operation: uint32(unix.NFT_DYNSET_OP_UPDATE), Timeout: auditTTL, Exprs: []expr.Any{&expr.Counter{}}}
		for _, proto := range []byte{unix.IPPROTO_TCP, unix.IPPROTO_UDP} {
			e := key()
			e = append(e, &expr.Cmp{Op: expr.CmpOpEq, Register: rp, Data: []byte{proto}})
			e = append(e, &expr.Payload{OperationType: expr.PayloadLoad, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2, DestRegister: rport}, dyn)
			out = append(out, e)
		}
		e := key()
		e = append(e, &expr.Cmp{Op: expr.CmpOpNeq, Register: rp, Data: []byte{unix.IPPROTO_TCP}},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: rp, Data: []byte{unix.IPPROTO_UDP}},
			&expr.Immediate{Register: rport, Data: []byte{0, 0, 0, 0}}, dyn)
		out = append(out, e)
	}
	return out
}

func verdict(k expr.VerdictKind) expr.Any { return &expr.Verdict{Kind: k} }
func goTo(ch *nftables.Chain) expr.Any    { return &expr.Verdict{Kind: expr.VerdictGoto, Chain: ch.Name} }

func ctState(bits uint32, then ...expr.Any) []expr.Any {
	return append([]expr.Any{
		&expr.Ct{Register: reg1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4, Mask: binaryutil.NativeEndian.PutUint32(bits), Xor: binaryutil.NativeEndian.PutUint32(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: reg1, Data: binaryutil.NativeEndian.PutUint32(0)},
	}, then...)
}

// ctDirection matches a packet of its connection's direction dir (0: the
// original one, the way it was opened; 1: the reply).
func ctDirection(dir byte, then ...expr.Any) []expr.Any {
	return append([]expr.Any{
		&expr.Ct{Register: reg1, Key: expr.CtKeyDIRECTION},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: []byte{dir}},
	}, then...)
}

func ifname(key expr.MetaKey, name string, then ...expr.Any) []expr.Any {
	return append([]expr.Any{&expr.Meta{Key: key, Register: reg1}, &expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: ifnameBytes(name)}}, then...)
}

// ifnameBytes is an interface name as the kernel compares it.
func ifnameBytes(name string) []byte {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, name)
	return b
}

func nfproto(v6 bool) []expr.Any {
	fam := byte(unix.NFPROTO_IPV4)
	if v6 {
		fam = unix.NFPROTO_IPV6
	}
	return []expr.Any{&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: reg1}, &expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: []byte{fam}}}
}

func l4proto(p byte) []expr.Any {
	return []expr.Any{&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg1}, &expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: []byte{p}}}
}

func daddr(v6 bool, reg uint32) expr.Any {
	if v6 {
		return &expr.Payload{OperationType: expr.PayloadLoad, Base: expr.PayloadBaseNetworkHeader, Offset: 24, Len: 16, DestRegister: reg}
	}
	return &expr.Payload{OperationType: expr.PayloadLoad, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4, DestRegister: reg}
}

func dport(reg uint32) expr.Any {
	return &expr.Payload{OperationType: expr.PayloadLoad, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2, DestRegister: reg}
}

func inSet(v6 bool, set *nftables.Set, then ...expr.Any) []expr.Any {
	e := nfproto(v6)
	e = append(e, daddr(v6, reg1), &expr.Lookup{SourceRegister: reg1, SetName: set.Name, SetID: set.ID})
	return append(e, then...)
}

// ndp matches IPv6 neighbour and router discovery (ICMPv6 types 133–137)
// with a hop limit of 255, which only a neighbour's packets have: such a
// packet is never forwarded, so it cannot carry data anywhere.
func ndp(then ...expr.Any) []expr.Any {
	e := append(nfproto(true), l4proto(unix.IPPROTO_ICMPV6)...)
	e = append(e, &expr.Payload{OperationType: expr.PayloadLoad, Base: expr.PayloadBaseNetworkHeader, Offset: 7, Len: 1, DestRegister: reg1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: []byte{255}})
	e = append(e, &expr.Payload{OperationType: expr.PayloadLoad, Base: expr.PayloadBaseTransportHeader, Offset: 0, Len: 1, DestRegister: reg1},
		&expr.Range{Op: expr.CmpOpEq, Register: reg1, FromData: []byte{133}, ToData: []byte{137}})
	return append(e, then...)
}

// groupReports are rules matching the multicast group management a
// kernel sends by itself on a link: IGMP (TTL 1) and MLD (ICMPv6 types
// 130–132 and 143, hop limit 1). Such a packet is never forwarded, so it
// carries nothing anywhere.
func groupReports(then ...expr.Any) [][]expr.Any {
	hops := func(v6 bool) []expr.Any {
		off := uint32(8) // IPv4's TTL
		if v6 {
			off = 7 // IPv6's hop limit
		}
		return []expr.Any{&expr.Payload{OperationType: expr.PayloadLoad, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: 1, DestRegister: reg1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: []byte{1}}}
	}
	icmpType := &expr.Payload{OperationType: expr.PayloadLoad, Base: expr.PayloadBaseTransportHeader, Offset: 0, Len: 1, DestRegister: reg1}
	rule := func(parts ...[]expr.Any) []expr.Any {
		var e []expr.Any
		for _, p := range parts {
			e = append(e, p...)
		}
		return append(e, then...)
	}
	igmp := rule(nfproto(false), l4proto(unix.IPPROTO_IGMP), hops(false))
	mld := func(match expr.Any) []expr.Any {
		return rule(nfproto(true), l4proto(unix.IPPROTO_ICMPV6), hops(true), []expr.Any{icmpType, match})
	}
	return [][]expr.Any{igmp,
		mld(&expr.Range{Op: expr.CmpOpEq, Register: reg1, FromData: []byte{130}, ToData: []byte{132}}),
		mld(&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: []byte{143}}),
	}
}

// intervalElems encodes ranges for an interval set: each range's first
// address, and the address after its last flagged as an interval end
// (none when the range runs to the family's last address).
func intervalElems(rs []addrRange) []nftables.SetElement {
	var els []nftables.SetElement
	for _, r := range rs {
		els = append(els, nftables.SetElement{Key: r.from.AsSlice()})
		if next := r.to.Next(); next.IsValid() {
			els = append(els, nftables.SetElement{Key: next.AsSlice(), IntervalEnd: true})
		}
	}
	return els
}

// setAllowPrefixes replaces the explicitly allowed ranges and forgets every
// address the resolver let through, so a live policy change holds for the
// next connection (established ones keep going).
func setAllowPrefixes(c *nftables.Conn, s *nftSets, r Rules) error {
	c.FlushSet(s.pfx4)
	c.FlushSet(s.pfx6)
	c.FlushSet(s.allow4)
	c.FlushSet(s.allow6)
	if els := intervalElems(r.Allow4); len(els) > 0 {
		if err := c.SetAddElements(s.pfx4, els); err != nil {
			return err
		}
	}
	if els := intervalElems(r.Allow6); len(els) > 0 {
		if err := c.SetAddElements(s.pfx6, els); err != nil {
			return err
		}
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("nftables: update allowed prefixes: %w", err)
	}
	return nil
}

// allowAddrs lets the sandbox reach addrs (TCP and UDP, every port) for ttl.
func allowAddrs(c *nftables.Conn, s *nftSets, addrs []netip.Addr, ttl time.Duration) error {
	els := make([]nftables.SetElement, 0, len(addrs))
	for _, a := range addrs {
		els = append(els, nftables.SetElement{Key: a.Unmap().AsSlice(), Timeout: ttl})
	}
	if err := queueAllow(c, s, els); err != nil {
		return err
	}
	return c.Flush()
}

// addPorts adds cluster ports to the denied ports.
func addPorts(c *nftables.Conn, s *nftSets, ports []uint16) error {
	var els []nftables.SetElement
	for _, p := range ports {
		els = append(els, nftables.SetElement{Key: binaryutil.BigEndian.PutUint16(p)})
	}
	if err := c.SetAddElements(s.ports, els); err != nil {
		return err
	}
	return c.Flush()
}

// renewAddrs does what allowAddrs does, and first takes renew (addresses
// of addrs already in the allow sets) out, in the same batch: a kernel may
// keep an element's first timeout when it is added again. The kernel
// applies a batch at once, so a connection never finds a renewed address
// missing. If an element of renew is gone (timed out), the batch fails
// with ENOENT and changes nothing.
func renewAddrs(c *nftables.Conn, s *nftSets, renew, addrs []netip.Addr, ttl time.Duration) error {
	for _, a := range renew {
		set := s.allow4
		if a.Is6() {
			set = s.allow6
		}
		if err := c.SetDeleteElements(set, []nftables.SetElement{{Key: a.AsSlice()}}); err != nil {
			return err
		}
	}
	return allowAddrs(c, s, addrs, ttl)
}

// Attempt is one destination a sandbox tried, as its audit set counts it.
type Attempt struct {
	Allowed bool
	Addr    netip.Addr
	Proto   uint8  // IP protocol number
	Port    uint16 // 0 for protocols without ports
	Packets uint64 // packets of new connections counted so far
}

// readAttempts lists the four audit sets.
func readAttempts(c *nftables.Conn, s *nftSets) (out []Attempt, full []auditSet, err error) {
	for _, x := range []struct {
		set     *nftables.Set
		allowed bool
		alen    int
	}{{s.auditOK4, true, 4}, {s.auditDeny4, false, 4}, {s.auditOK6, true, 16}, {s.auditDeny6, false, 16}} {
		els, err := c.GetSetElements(x.set)
		if err != nil {
			return nil, nil, fmt.Errorf("nftables: read %s: %w", x.set.Name, err)
		}
		if len(els) >= auditSize {
			full = append(full, auditSet{name: x.set.Name, allowed: x.allowed, v6: x.alen == 16})
		}
		for _, el := range els {
			if len(el.Key) < x.alen+6 {
				continue
			}
			a, _ := netip.AddrFromSlice(el.Key[:x.alen])
			at := Attempt{Allowed: x.allowed, Addr: a, Proto: el.Key[x.alen], Port: uint16(el.Key[x.alen+4])<<8 | uint16(el.Key[x.alen+5])}
			if el.Counter != nil {
				at.Packets = el.Counter.Packets
			}
			out = append(out, at)
		}
	}
	return out, full, nil
}

// auditSet names one of a sandbox's four audit sets.
type auditSet struct {
	name        string
	allowed, v6 bool
}

// installHostRules creates the node's own table (named after the manager's
// tag) in the node's namespace: masquerade sandbox traffic to the uplink,
// and let sandboxes reach nothing on the node but the resolver, nor each
// other. The sandbox tables already deny all of this; this is the second
// wall.
//
// A sandbox's packets must come from its pool address (the namespace
// masquerades a microVM's; a container cannot forge one without
// CAP_NET_RAW, which it lacks): others are dropped, so no sandbox can pass
// for another at the resolver. In each family the node did not forward
// before (router4, router6 false), it forwards only to and from sandboxes.
func installHostRules(c *nftables.Conn, name, ifPrefix string, res Slot, p4, p6 netip.Prefix, router4, router6 bool) error {
	t := &nftables.Table{Name: name, Family: nftables.TableFamilyINet}
	c.DelTable(t)
	_ = c.Flush() // absent is fine
	t = c.AddTable(t)
	accept := nftables.ChainPolicyAccept
	post := c.AddChain(&nftables.Chain{Name: "post", Table: t, Type: nftables.ChainTypeNAT, Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource, Policy: &accept})
	in := c.AddChain(&nftables.Chain{Name: "in", Table: t, Type: nftables.ChainTypeFilter, Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter, Policy: &accept})
	fwd := c.AddChain(&nftables.Chain{Name: "fwd", Table: t, Type: nftables.ChainTypeFilter, Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &accept})
	add := func(ch *nftables.Chain, e ...expr.Any) { c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: e}) }
	fromSandbox := ifnamePrefix(expr.MetaKeyIIFNAME, ifPrefix, expr.CmpOpEq)
	toSandbox := ifnamePrefix(expr.MetaKeyOIFNAME, ifPrefix, expr.CmpOpEq)
	cat := func(parts ...[]expr.Any) []expr.Any {
		var e []expr.Any
		for _, p := range parts {
			e = append(e, p...)
		}
		return e
	}
	reject := func(e []expr.Any) {
		add(in, cat(e, l4proto(unix.IPPROTO_TCP), []expr.Any{&expr.Reject{Type: unix.NFT_REJECT_TCP_RST}})...)
		add(in, cat(e, []expr.Any{&expr.Reject{Type: unix.NFT_REJECT_ICMPX_UNREACH, Code: unix.NFT_REJECT_ICMPX_ADMIN_PROHIBITED}})...)
	}
	for _, p := range []netip.Prefix{p4, p6} {
		add(post, cat(saddrIn(p, expr.CmpOpEq), ifnamePrefix(expr.MetaKeyOIFNAME, ifPrefix, expr.CmpOpNeq), []expr.Any{&expr.Masq{}})...)
	}
	// A sandbox's address from anywhere but a sandbox link (a host on the
	// node's network, forging it to act as that sandbox at the resolver)
	// is dropped: the resolver and the sets know a sandbox by its source.
	// The node's own packets to its resolver come over lo.
	notLo := []expr.Any{&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: reg1},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: reg1, Data: ifnameBytes("lo")}}
	for _, p := range []netip.Prefix{p4, p6} {
		forged := cat(ifnamePrefix(expr.MetaKeyIIFNAME, ifPrefix, expr.CmpOpNeq), notLo, saddrIn(p, expr.CmpOpEq), []expr.Any{verdict(expr.VerdictDrop)})
		add(in, forged...)
		add(fwd, forged...)
	}
	// The resolver is the sandboxes' alone: anything else sent to its
	// addresses from elsewhere than a sandbox link or lo (a host on the
	// node's network with a route to them) is dropped. Before, such a
	// host could hold all of the resolver's TCP connections, which it
	// counts before it refuses a stranger, and cut DNS over TCP off for
	// every sandbox.
	for _, a := range []netip.Addr{res.Host4, res.Host6} {
		toResolver := cat(nfproto(a.Is6()), []expr.Any{daddr(a.Is6(), reg1), &expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: a.AsSlice()}})
		add(in, cat(ifnamePrefix(expr.MetaKeyIIFNAME, ifPrefix, expr.CmpOpNeq), notLo, toResolver, []expr.Any{verdict(expr.VerdictDrop)})...)
	}
	for _, p := range []netip.Prefix{p4, p6} {
		spoofed := cat(fromSandbox, saddrIn(p, expr.CmpOpNeq), []expr.Any{verdict(expr.VerdictDrop)})
		if p.Addr().Is6() {
			// Neighbour discovery from the link-local address is no spoof.
			add(in, cat(fromSandbox, ndp(verdict(expr.VerdictAccept)))...)
		}
		add(in, spoofed...)
		add(fwd, spoofed...)
	}
	// Forwarding that is not to or from a sandbox, in each family the node
	// did not forward before: dropped.
	notSandboxes := cat(ifnamePrefix(expr.MetaKeyIIFNAME, ifPrefix, expr.CmpOpNeq), ifnamePrefix(expr.MetaKeyOIFNAME, ifPrefix, expr.CmpOpNeq),
		[]expr.Any{verdict(expr.VerdictDrop)})
	switch {
	case !router4 && !router6:
		add(fwd, notSandboxes...)
	case !router4:
		add(fwd, cat(nfproto(false), notSandboxes)...)
	case !router6:
		add(fwd, cat(nfproto(true), notSandboxes)...)
	}
	add(in, cat(fromSandbox, ctState(expr.CtStateBitESTABLISHED|expr.CtStateBitRELATED, verdict(expr.VerdictAccept)))...)
	for _, a := range []netip.Addr{res.Host4, res.Host6} {
		for _, proto := range []byte{unix.IPPROTO_UDP, unix.IPPROTO_TCP} {
			add(in, cat(fromSandbox, dnsTo(a, proto, verdict(expr.VerdictAccept)))...)
		}
	}
	reject(fromSandbox)
	add(fwd, cat(fromSandbox, toSandbox, []expr.Any{verdict(expr.VerdictDrop)})...)
	if err := c.Flush(); err != nil {
		return fmt.Errorf("nftables: install table %s: %w", name, err)
	}
	return nil
}

// dnsTo matches DNS (port 53 over proto) to the resolver address a.
func dnsTo(a netip.Addr, proto byte, then ...expr.Any) []expr.Any {
	e := append(nfproto(a.Is6()), l4proto(proto)...)
	e = append(e, daddr(a.Is6(), reg1), &expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: a.AsSlice()},
		dport(reg1), &expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: binaryutil.BigEndian.PutUint16(53)})
	return append(e, then...)
}

// saddrIn matches packets of p's family whose source is in p (op Eq) or
// not (op Neq).
func saddrIn(p netip.Prefix, op expr.CmpOp) []expr.Any {
	v6 := p.Addr().Is6()
	off, n := uint32(12), uint32(4)
	if v6 {
		off, n = 8, 16
	}
	return append(nfproto(v6),
		&expr.Payload{OperationType: expr.PayloadLoad, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: n, DestRegister: reg1},
		&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: n, Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen()), Xor: make([]byte, n)},
		&expr.Cmp{Op: op, Register: reg1, Data: p.Masked().Addr().AsSlice()})
}

// ifnamePrefix matches an interface name (key: IIFNAME or OIFNAME) that
// starts with prefix (op Eq) or does not (op Neq): the comparison covers
// only the prefix's bytes, as nft's "w*" does.
func ifnamePrefix(key expr.MetaKey, prefix string, op expr.CmpOp) []expr.Any {
	return []expr.Any{&expr.Meta{Key: key, Register: reg1}, &expr.Cmp{Op: op, Register: reg1, Data: []byte(prefix)}}
}

// deleteTable removes a table if it exists.
func deleteTable(c *nftables.Conn, name string) error {
	c.DelTable(&nftables.Table{Name: name, Family: nftables.TableFamilyINet})
	if err := c.Flush(); err != nil && !errors.Is(err, unix.ENOENT) {
		return err
	}
	return nil
}
