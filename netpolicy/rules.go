package netpolicy

import (
	"net/netip"
	"slices"
)

// Interface names inside every sandbox namespace. A container's
// processes share the namespace and use eth0 directly (their packets pass
// the output hook); a microVM sits behind tap0 and its packets are
// forwarded to eth0 and masqueraded. One rule set serves both, so a pooled
// namespace suits either driver.
const (
	IfaceUplink = "eth0" // the veth to the node
	IfaceGuest  = "tap0" // a microVM's link
)

// Rules is everything the nftables table of one sandbox namespace holds,
// as data. It is computed by computeRules and applied by the nft layer;
// the only parts that change on a live sandbox are AllowPrefixes and the
// resolver's allow sets.
type Rules struct {
	// Resolver4 and Resolver6 are the only addresses DNS (port 53, UDP and
	// TCP) may go to.
	Resolver4, Resolver6 netip.Addr
	// Deny4 and Deny6 are the always-denied destinations as sorted,
	// disjoint inclusive ranges.
	Deny4, Deny6 []addrRange
	// Allow4 and Allow6 are the policy's explicitly allowed prefixes, as
	// ranges; they take precedence over Deny and ClusterPorts.
	Allow4, Allow6 []addrRange
	// ClusterPorts are denied on every destination, TCP and UDP.
	ClusterPorts []uint16
}

// computeRules derives a sandbox's rules from the node's settings and the
// sandbox's (normalized) policy.
func computeRules(resolver Slot, nodeAddrs []netip.Addr, pools []netip.Prefix, clusterPorts []uint16, p Policy) Rules {
	deny := slices.Clone(deniedRanges)
	deny = append(deny, pools...)
	for _, a := range nodeAddrs {
		a = a.Unmap()
		deny = append(deny, netip.PrefixFrom(a, a.BitLen()))
	}
	ports := slices.Clone(clusterPorts)
	slices.Sort(ports)
	ports = slices.Compact(ports)
	return Rules{
		Resolver4:    resolver.Host4,
		Resolver6:    resolver.Host6,
		Deny4:        ranges(deny, false),
		Deny6:        ranges(deny, true),
		Allow4:       ranges(p.AllowPrefixes, false),
		Allow6:       ranges(p.AllowPrefixes, true),
		ClusterPorts: ports,
	}
}
