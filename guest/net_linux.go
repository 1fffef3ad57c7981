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
		idx, err := ifIndex(c.Iface)
		if err != nil {
			return fmt.Errorf("%s: %w", c.Iface, err)
		}
		l := &netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: idx, Name: c.Iface}}
		if err := quietIPv6(c.Iface); err != nil {
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

// ipv6Quiet is the interface's IPv6 settings that SetNetwork writes
// before it brings the interface up. The sandbox's network is static (the
// node's point-to-point link, addresses from the claim), so the kernel's
// autoconfiguration has nothing to find, yet by default it keeps timers
// running for seconds after the link comes up: duplicate address
// detection of the link-local address, router solicitations (forever,
// with back-off), and MLD reports repeated up to a second apart. A
// template's snapshot is taken about a second after its network came up,
// so every clone ran those timers during its claim: about 1,300 blocks
// of network code translated afresh in each clone under TCG
// (bench/README.md, twenty-fourth session). With these, the link-local
// address is usable at once, no solicitation is sent, and the MLD reports
// go out within milliseconds, before the snapshot.
var ipv6Quiet = []struct{ name, value string }{
	{"accept_dad", "0"},
	{"accept_ra", "0"},
	{"router_solicitations", "0"},
	{"mldv1_unsolicited_report_interval", "1"},
	{"mldv2_unsolicited_report_interval", "1"},
}

// quietIPv6 writes ipv6Quiet for iface. A kernel without IPv6 has no
// such files, and that is no error.
func quietIPv6(iface string) error {
	dir := "/proc/sys/net/ipv6/conf/" + iface
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	for _, q := range ipv6Quiet {
		if err := os.WriteFile(dir+"/"+q.name, []byte(q.value), 0o644); err != nil {
			return fmt.Errorf("ipv6 %s: %w", q.name, err)
		}
	}
	return nil
}

// ifIndex is the index of the interface name, by SIOCGIFINDEX. It stands
// for netlink.LinkByName, which has the kernel fill in and the library
// decode every attribute of the link: under TCG, a restored clone
// translates all that code at its claim, about 50 ms.
func ifIndex(name string) (int, error) {
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		return 0, err
	}
	// Any socket takes the device ioctls; a route netlink socket is the
	// kind the calls after this one open.
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFINDEX, ifr); err != nil {
		return 0, err
	}
	return int(ifr.Uint32()), nil
}
