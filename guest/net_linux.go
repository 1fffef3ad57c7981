package guest

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// SetNetwork brings the interface up with its addresses and default
// routes (not in a container: the node configured its interface) and
// points /etc/resolv.conf at the node's resolver. A claim may run it again
// on the same guest, so existing addresses and routes are replaced.
func (s *LinuxSystem) SetNetwork(c NetConfig) error {
	if !s.Container {
		l, err := netlink.LinkByName(c.Iface)
		if err != nil {
			return fmt.Errorf("%s: %w", c.Iface, err)
		}
		for _, a := range c.Addrs {
			p := netip.MustParsePrefix(a)
			addr := &netlink.Addr{IPNet: &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}, Flags: unix.IFA_F_NODAD}
			if err := netlink.AddrReplace(l, addr); err != nil {
				return fmt.Errorf("%s: address %s: %w", c.Iface, a, err)
			}
		}
		if err := netlink.LinkSetUp(l); err != nil {
			return fmt.Errorf("%s: up: %w", c.Iface, err)
		}
		for _, g := range c.Gateways {
			gw := netip.MustParseAddr(g)
			r := &netlink.Route{LinkIndex: l.Attrs().Index, Gw: gw.AsSlice()}
			if err := netlink.RouteReplace(r); err != nil && !errors.Is(err, unix.EEXIST) {
				return fmt.Errorf("%s: default route via %s: %w", c.Iface, g, err)
			}
		}
	}
	if len(c.DNS) == 0 {
		return nil
	}
	var b strings.Builder
	b.WriteString("# written by warren-guest: the node's DNS allowlist resolver\n")
	for _, d := range c.DNS {
		fmt.Fprintf(&b, "nameserver %s\n", d)
	}
	b.WriteString("options edns0 timeout:2 attempts:2\n")
	// /etc/resolv.conf may be a symlink (systemd-resolved's) or a bind
	// mount; replace a symlink, write through anything else.
	if fi, err := os.Lstat("/etc/resolv.conf"); err == nil && fi.Mode()&os.ModeSymlink != 0 {
		os.Remove("/etc/resolv.conf")
	}
	return os.WriteFile("/etc/resolv.conf", []byte(b.String()), 0o644)
}
