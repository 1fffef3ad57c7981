package netpolicy

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"
)

// Slot is one sandbox's place in the node's address pool. Slot i owns the
// i-th /30 of the IPv4 pool and the i-th /126 of the IPv6 pool: the node's
// end of the sandbox's veth is the first address, the sandbox's end the
// second. Slot 0 is the resolver's: its first addresses are where every
// sandbox sends DNS.
type Slot struct {
	Index    int
	Host4    netip.Addr // node side of the veth
	Sandbox4 netip.Addr // sandbox side (the netns's eth0)
	Host6    netip.Addr
	Sandbox6 netip.Addr
}

// Default pools. Both are private, so every sandbox's rules deny them.
var (
	DefaultPrefix4 = netip.MustParsePrefix("10.213.0.0/16")
	DefaultPrefix6 = netip.MustParsePrefix("fd77:6172:7265::/64")
)

// The guest link of a microVM, inside its namespace: the same addresses in
// every namespace, masqueraded to the slot's address on the way out.
var (
	GuestGateway4 = netip.MustParseAddr("169.254.77.1")
	GuestAddr4    = netip.MustParseAddr("169.254.77.2")
	GuestGateway6 = netip.MustParseAddr("fdff:77::1")
	GuestAddr6    = netip.MustParseAddr("fdff:77::2")
)

const (
	slotBits4 = 2 // a /30 per slot
	slotBits6 = 2 // a /126 per slot
)

// pool maps slot indexes to addresses and back. It is pure arithmetic.
type pool struct {
	p4, p6 netip.Prefix
	n      int // number of slots, slot 0 included
}

func newPool(p4, p6 netip.Prefix) (pool, error) {
	if !p4.IsValid() || !p4.Addr().Is4() {
		return pool{}, fmt.Errorf("prefix4: %v is not an IPv4 prefix", p4)
	}
	if !p6.IsValid() || !p6.Addr().Is6() || p6.Addr().Is4In6() {
		return pool{}, fmt.Errorf("prefix6: %v is not an IPv6 prefix", p6)
	}
	if p4.Bits() > 28 {
		return pool{}, fmt.Errorf("prefix4: %v is too small; it needs at least a /28", p4)
	}
	if p6.Bits() > 124 {
		return pool{}, fmt.Errorf("prefix6: %v is too small; it needs at least a /124", p6)
	}
	n := 1 << min(32-p4.Bits()-slotBits4, 20)
	if m := 1 << min(128-p6.Bits()-slotBits6, 20); m < n {
		n = m
	}
	return pool{p4: p4.Masked(), p6: p6.Masked(), n: n}, nil
}

// slots is how many sandboxes the pool can hold (slot 0 is the resolver's).
func (p pool) slots() int { return p.n - 1 }

func (p pool) slot(i int) Slot {
	b4 := p.p4.Addr().As4()
	v := uint32(b4[0])<<24 | uint32(b4[1])<<16 | uint32(b4[2])<<8 | uint32(b4[3])
	v += uint32(i) << slotBits4
	h4 := netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v + 1)})
	s4 := netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v + 2)})
	b6 := p.p6.Addr().As16()
	lo := binary.BigEndian.Uint64(b6[8:]) + uint64(i)<<slotBits6
	h6, s6 := b6, b6
	binary.BigEndian.PutUint64(h6[8:], lo+1)
	binary.BigEndian.PutUint64(s6[8:], lo+2)
	return Slot{Index: i, Host4: h4, Sandbox4: s4, Host6: netip.AddrFrom16(h6), Sandbox6: netip.AddrFrom16(s6)}
}

// slotOf returns the slot whose sandbox side is a, if any.
func (p pool) slotOf(a netip.Addr) (int, bool) {
	a = a.Unmap()
	switch {
	case a.Is4() && p.p4.Contains(a):
		b, base := a.As4(), p.p4.Addr().As4()
		v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
		w := uint32(base[0])<<24 | uint32(base[1])<<16 | uint32(base[2])<<8 | uint32(base[3])
		i := int((v - w) >> slotBits4)
		if i > 0 && i < p.n && p.slot(i).Sandbox4 == a {
			return i, true
		}
	case a.Is6() && p.p6.Contains(a):
		b, base := a.As16(), p.p6.Addr().As16()
		d := binary.BigEndian.Uint64(b[8:]) - binary.BigEndian.Uint64(base[8:])
		i := int(d >> slotBits6)
		if i > 0 && i < p.n && p.slot(i).Sandbox6 == a {
			return i, true
		}
	}
	return 0, false
}

// Always-denied destinations: private, shared, loopback, link-local (and
// with it the cloud metadata address 169.254.169.254), multicast and
// reserved ranges, over IPv4 and IPv6, and the IPv6 ranges that embed or
// translate IPv4 addresses (so none reaches a private one). The documentation ranges
// (192.0.2.0/24, 198.51.100.0/24, 203.0.113.0/24, 2001:db8::/32) are not on
// the list: nothing on the Internet uses them, so the tests' own hosts live
// there.
var deniedRanges = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),
	netip.MustParsePrefix("10.0.0.0/8"),
	netip.MustParsePrefix("100.64.0.0/10"),
	netip.MustParsePrefix("127.0.0.0/8"),
	netip.MustParsePrefix("169.254.0.0/16"),
	netip.MustParsePrefix("172.16.0.0/12"),
	netip.MustParsePrefix("192.0.0.0/24"),
	netip.MustParsePrefix("192.168.0.0/16"),
	netip.MustParsePrefix("198.18.0.0/15"),
	netip.MustParsePrefix("224.0.0.0/4"),
	netip.MustParsePrefix("240.0.0.0/4"),
	netip.MustParsePrefix("::/96"),     // unspecified, loopback and IPv4-compatible
	netip.MustParsePrefix("2001::/32"), // Teredo, which can embed private IPv4
	netip.MustParsePrefix("2002::/16"), // 6to4, likewise
	netip.MustParsePrefix("fec0::/10"), // old site-local
	netip.MustParsePrefix("::ffff:0:0/96"),
	netip.MustParsePrefix("64:ff9b::/96"),
	netip.MustParsePrefix("64:ff9b:1::/48"),
	netip.MustParsePrefix("100::/64"),
	netip.MustParsePrefix("fc00::/7"),
	netip.MustParsePrefix("fe80::/10"),
	netip.MustParsePrefix("ff00::/8"),
}

// Denied reports whether a is in the always-denied ranges (the node's own
// addresses aside). The resolver drops such answers.
func Denied(a netip.Addr) bool {
	a = a.Unmap()
	for _, p := range deniedRanges {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// addrRange is an inclusive range of addresses of one family.
type addrRange struct{ from, to netip.Addr }

// ranges turns prefixes of one family into sorted, disjoint, merged
// inclusive ranges, which is what an nftables interval set holds.
func ranges(pfxs []netip.Prefix, v6 bool) []addrRange {
	var rs []addrRange
	for _, p := range pfxs {
		p = p.Masked()
		if p.Addr().Is6() != v6 {
			continue
		}
		rs = append(rs, addrRange{p.Addr(), lastAddr(p)})
	}
	slices.SortFunc(rs, func(a, b addrRange) int { return a.from.Compare(b.from) })
	var out []addrRange
	for _, r := range rs {
		if n := len(out); n > 0 {
			last := &out[n-1]
			if next := last.to.Next(); !next.IsValid() || r.from.Compare(next) <= 0 {
				if r.to.Compare(last.to) > 0 {
					last.to = r.to
				}
				continue
			}
		}
		out = append(out, r)
	}
	return out
}

func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}
