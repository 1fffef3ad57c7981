// Package netpolicy owns per-sandbox networking on a node: the network
// namespace each sandbox runs in, its links (veth to the node, tap to a
// microVM), addresses from the node's pool, the nftables rules that deny
// egress by default, the DNS allowlist resolver that opens the way to
// allowed names, and the egress audit.
//
// The rules are computed as data (Rules, from a Policy and a Slot) and one
// thin layer applies them with google/nftables and vishvananda/netlink over
// netlink; nothing shells out to nft or ip.
//
// netpolicy is a leaf: it imports no other warren package.
package netpolicy
