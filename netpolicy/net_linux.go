package netpolicy

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// This file creates and removes namespaces and links with netlink.

// netnsDir is where named namespaces are bind-mounted, as by `ip netns`.
const netnsDir = "/run/netns"

// onThread runs fn on a goroutine locked to an OS thread of its own, which
// fn may move into another network namespace; the thread then goes back to
// the namespace it started in. If it cannot, the goroutine exits still
// locked and the runtime ends the thread, so no other goroutine ever runs
// in the wrong namespace.
func onThread(fn func() error) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			done <- fmt.Errorf("netns: current: %w", err)
			return
		}
		defer orig.Close()
		ferr := fn()
		if err := netns.Set(orig); err != nil {
			done <- errors.Join(ferr, fmt.Errorf("netns: return: %w", err))
			return // still locked: the thread goes with the goroutine
		}
		runtime.UnlockOSThread()
		done <- ferr
	}()
	return <-done
}

// inNS runs fn on an OS thread that is in ns (see onThread).
func inNS(ns netns.NsHandle, fn func() error) error {
	return onThread(func() error {
		if err := netns.Set(ns); err != nil {
			return fmt.Errorf("netns: enter: %w", err)
		}
		return fn()
	})
}

// createNS makes a new named namespace and returns a handle to it.
func createNS(name string) (netns.NsHandle, error) {
	if err := os.MkdirAll(netnsDir, 0o755); err != nil {
		return netns.None(), err
	}
	ns := netns.None()
	err := onThread(func() (err error) {
		ns, err = netns.NewNamed(name) // moves the thread into ns
		return err
	})
	if err != nil {
		if ns.IsOpen() {
			ns.Close()
		}
		return netns.None(), fmt.Errorf("netns: create %s: %w", name, err)
	}
	return ns, nil
}

// deleteNS unmounts and removes a named namespace; the kernel frees it,
// with its links and nftables table, once nothing holds it.
func deleteNS(name string) error {
	p := filepath.Join(netnsDir, name)
	if err := unix.Unmount(p, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("netns: unmount %s: %w", name, err)
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("netns: remove %s: %w", name, err)
	}
	return nil
}

// listNS returns the named namespaces whose names start with prefix.
func listNS(prefix string) ([]string, error) {
	ents, err := os.ReadDir(netnsDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), prefix) {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

func prefixOf(a netip.Addr, bits int) *netlink.Addr {
	return &netlink.Addr{IPNet: netipToNet(netip.PrefixFrom(a, bits)), Flags: unix.IFA_F_NODAD}
}

func netipToNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// wireSlot gives a fresh namespace its veth to the node, addresses, routes
// and forwarding.
func wireSlot(host *netlink.Handle, ns netns.NsHandle, hostIf string, s Slot) error {
	inner, err := netlink.NewHandleAt(ns)
	if err != nil {
		return fmt.Errorf("netlink handle: %w", err)
	}
	defer inner.Close()
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: hostIf}, PeerName: IfaceUplink, PeerNamespace: netlink.NsFd(int(ns))}
	if err := host.LinkAdd(veth); err != nil {
		return fmt.Errorf("veth %s: %w", hostIf, err)
	}
	hl, err := host.LinkByName(hostIf)
	if err != nil {
		return fmt.Errorf("veth %s: %w", hostIf, err)
	}
	for _, a := range []*netlink.Addr{prefixOf(s.Host4, 32-slotBits4), prefixOf(s.Host6, 128-slotBits6)} {
		if err := host.AddrAdd(hl, a); err != nil {
			return fmt.Errorf("veth %s: address %v: %w", hostIf, a.IPNet, err)
		}
	}
	if err := host.LinkSetUp(hl); err != nil {
		return fmt.Errorf("veth %s: up: %w", hostIf, err)
	}
	lo, err := inner.LinkByName("lo")
	if err != nil {
		return err
	}
	if err := inner.LinkSetUp(lo); err != nil {
		return fmt.Errorf("lo: up: %w", err)
	}
	el, err := inner.LinkByName(IfaceUplink)
	if err != nil {
		return fmt.Errorf("%s: %w", IfaceUplink, err)
	}
	for _, a := range []*netlink.Addr{prefixOf(s.Sandbox4, 32-slotBits4), prefixOf(s.Sandbox6, 128-slotBits6)} {
		if err := inner.AddrAdd(el, a); err != nil {
			return fmt.Errorf("%s: address %v: %w", IfaceUplink, a.IPNet, err)
		}
	}
	if err := inner.LinkSetUp(el); err != nil {
		return fmt.Errorf("%s: up: %w", IfaceUplink, err)
	}
	for _, gw := range []netip.Addr{s.Host4, s.Host6} {
		r := &netlink.Route{LinkIndex: el.Attrs().Index, Gw: gw.AsSlice()}
		if err := inner.RouteAdd(r); err != nil {
			return fmt.Errorf("default route via %v: %w", gw, err)
		}
	}
	return inNS(ns, func() error { return enableForwarding() })
}

// enableForwarding turns on IPv4 and IPv6 forwarding in the calling
// thread's namespace (sysctls under /proc/sys/net are per namespace).
func enableForwarding() error {
	for _, p := range []string{"/proc/sys/net/ipv4/ip_forward", "/proc/sys/net/ipv6/conf/all/forwarding"} {
		if err := os.WriteFile(p, []byte("1"), 0o644); err != nil {
			return fmt.Errorf("sysctl %s: %w", p, err)
		}
	}
	return nil
}

// forwardingState is what the node's forwarding sysctls were before the
// first manager changed them: the values to restore, and whether the node
// forwarded IPv4 and IPv6 itself (a router, which keeps forwarding what it
// did). A manager keeps it in its StateDir, so that a start after an
// unclean exit (a crash, Detach), which finds forwarding on because the
// last run turned it on, still knows the node was no router.
type forwardingState struct {
	Changed map[string]string `json:"changed"`
	Router4 bool              `json:"router4"`
	Router6 bool              `json:"router6"`
}

// hostForwarding turns on IPv4 and IPv6 forwarding in the current
// namespace, noting in st (nil: a new state, read from the node as it is)
// each value it changes. Interfaces that accept router advertisements
// while the node forwards no IPv6 (accept_ra 1, which the kernel ignores
// with forwarding on) get accept_ra 2, so the node keeps its SLAAC
// addresses and routes.
func hostForwarding(st *forwardingState) (*forwardingState, error) {
	read := func(p string) string { b, _ := os.ReadFile(p); return strings.TrimSpace(string(b)) }
	v4, v6 := "/proc/sys/net/ipv4/ip_forward", "/proc/sys/net/ipv6/conf/all/forwarding"
	if st == nil {
		st = &forwardingState{Router4: read(v4) == "1", Router6: read(v6) == "1"}
	}
	if st.Changed == nil {
		st.Changed = map[string]string{}
	}
	set := func(p, v string) error {
		old := read(p)
		if old == v {
			return nil
		}
		if err := os.WriteFile(p, []byte(v), 0o644); err != nil {
			return fmt.Errorf("sysctl %s: %w", p, err)
		}
		if _, seen := st.Changed[p]; !seen {
			st.Changed[p] = old
		}
		return nil
	}
	if !st.Router6 {
		ents, _ := os.ReadDir("/proc/sys/net/ipv6/conf")
		for _, e := range ents {
			p := filepath.Join("/proc/sys/net/ipv6/conf", e.Name(), "accept_ra")
			if read(p) == "1" {
				if err := set(p, "2"); err != nil {
					return st, err
				}
			}
		}
	}
	for _, p := range []string{v4, v6} {
		if err := set(p, "1"); err != nil {
			return st, err
		}
	}
	return st, nil
}

// restoreSysctls writes back what hostForwarding changed, forwarding first.
func restoreSysctls(changed map[string]string) error {
	var errs []error
	for _, p := range []string{"/proc/sys/net/ipv4/ip_forward", "/proc/sys/net/ipv6/conf/all/forwarding"} {
		if v, ok := changed[p]; ok {
			errs = append(errs, os.WriteFile(p, []byte(v), 0o644))
			delete(changed, p)
		}
	}
	for p, v := range changed {
		// An interface gone since (the resolver's link, torn down just
		// before) has nothing to restore.
		if err := os.WriteFile(p, []byte(v), 0o644); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// openTap creates tap0 in ns with the guest gateway's addresses and returns
// its file, which a VMM takes as its network backend. The link lives as
// long as some process holds the file.
func openTap(ns netns.NsHandle) (*os.File, error) {
	var f *os.File
	err := inNS(ns, func() error {
		// netlink opens /dev/net/tun in this thread's namespace; without
		// persist, the link lives as long as a process holds its file.
		tap := &netlink.Tuntap{LinkAttrs: netlink.LinkAttrs{Name: IfaceGuest}, Mode: netlink.TUNTAP_MODE_TAP,
			Flags: netlink.TUNTAP_NO_PI, Queues: 1, NonPersist: true}
		if err := netlink.LinkAdd(tap); err != nil {
			return fmt.Errorf("tap %s: %w", IfaceGuest, err)
		}
		if len(tap.Fds) != 1 {
			for _, fd := range tap.Fds {
				fd.Close()
			}
			return fmt.Errorf("tap %s: %d files, want 1", IfaceGuest, len(tap.Fds))
		}
		f = tap.Fds[0]
		return nil
	})
	if err != nil {
		if f != nil { // made, but the thread could not come back
			f.Close()
		}
		return nil, err
	}
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		f.Close()
		return nil, err
	}
	defer h.Close()
	fail := func(err error) (*os.File, error) { f.Close(); return nil, fmt.Errorf("%s: %w", IfaceGuest, err) }
	l, err := h.LinkByName(IfaceGuest)
	if err != nil {
		return fail(err)
	}
	// The same MAC every time: a guest paused to disk and resumed behind a
	// new tap still has the old one in its neighbour cache.
	if err := h.LinkSetHardwareAddr(l, gatewayMAC); err != nil {
		return fail(err)
	}
	for _, a := range []*netlink.Addr{prefixOf(GuestGateway4, 30), prefixOf(GuestGateway6, 126)} {
		if err := h.AddrAdd(l, a); err != nil {
			return fail(err)
		}
	}
	if err := h.LinkSetUp(l); err != nil {
		return fail(err)
	}
	return f, nil
}

// gatewayMAC is tap0's address in every namespace (locally administered).
var gatewayMAC = net.HardwareAddr{0x52, 0x54, 0x00, 0x77, 0x00, 0x01}

// nodeAddrs lists the addresses on every link of the namespace h talks to.
func nodeAddrs(h *netlink.Handle) ([]netip.Addr, error) {
	as, err := h.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return nil, err
	}
	var out []netip.Addr
	for _, a := range as {
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			out = append(out, ip.Unmap())
		}
	}
	return out, nil
}

// NewNamedNS creates an empty named network namespace under /run/netns
// (as `ip netns add` does). Tests and benchmarks build their own worlds
// with it.
func NewNamedNS(name string) error {
	ns, err := createNS(name)
	if err != nil {
		return err
	}
	return ns.Close()
}

// DeleteNamedNS removes a named namespace made by NewNamedNS.
func DeleteNamedNS(name string) error { return deleteNS(name) }

// InNamedNS runs fn on a thread in the namespace at path (a named
// namespace's /run/netns/NAME, or a Sandbox's NSPath): sockets fn opens
// stay in that namespace.
func InNamedNS(path string, fn func() error) error {
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return fmt.Errorf("netns %s: %w", path, err)
	}
	defer ns.Close()
	return inNS(ns, fn)
}
