package driver

import (
	"context"
	"os"

	"github.com/warrenhq/warren/guest"
	"github.com/warrenhq/warren/netpolicy"
)

// Network is one sandbox's network, handed out by the node's egress
// policy (netpolicy): a namespace whose rules deny everything until the
// node binds the sandbox and sets its policy.
type Network interface {
	// NSPath is the namespace's path; a container runtime joins it.
	NSPath() string
	// OpenTap creates the microVM link in the namespace and returns its
	// file for the VMM. Call it each time a VMM starts, after the previous
	// one has exited.
	OpenTap() (*os.File, error)
	// GuestConfig is what the guest agent sets at claim: for a microVM
	// (tap) its NIC's addresses and routes, for a container only DNS.
	GuestConfig(tap bool) guest.NetConfig
	// Close removes the network.
	Close() error
}

// Networks hands out networks. A driver whose config has none gives its
// sandboxes no network at all.
type Networks interface {
	Attach(ctx context.Context) (Network, error)
}

// Reattacher is Networks that can give back, after a node restart, the
// network of a sandbox the driver re-adopts (by its NSPath).
type Reattacher interface {
	Reattach(nsPath string) (Network, error)
}

// Networked is a sandbox that has a network.
type Networked interface {
	Network() Network
}

// PolicyNetworks hands out networks of the node's egress policy: each is a
// netpolicy namespace that allows nothing until the node sets its policy.
type PolicyNetworks struct{ M *netpolicy.Manager }

// Attach claims a namespace from the manager's pool.
func (p PolicyNetworks) Attach(ctx context.Context) (Network, error) {
	s, err := p.M.Claim(ctx, "", netpolicy.Policy{Profile: netpolicy.ProfileNone})
	if err != nil {
		return nil, err
	}
	return PolicyNetwork{s}, nil
}

// Reattach takes back a re-adopted sandbox's network.
func (p PolicyNetworks) Reattach(nsPath string) (Network, error) {
	s, err := p.M.Reattach(nsPath)
	if err != nil {
		return nil, err
	}
	return PolicyNetwork{s}, nil
}

// PolicyNetwork is a netpolicy sandbox network as a Network.
type PolicyNetwork struct{ *netpolicy.Sandbox }

// GuestConfig is the guest's side of the network: eth0's addresses and
// routes (for a microVM) and the node's resolver.
func (n PolicyNetwork) GuestConfig(tap bool) guest.NetConfig { return guestConfig(n.Guest(tap)) }

// TapGuest is Networks whose microVM guests all get the same network
// settings (see netpolicy.Manager.GuestTap), known before any is attached.
type TapGuest interface {
	TapGuestConfig() guest.NetConfig
}

// TapGuestConfig is the guest side of every microVM network of p.
func (p PolicyNetworks) TapGuestConfig() guest.NetConfig { return guestConfig(p.M.GuestTap()) }

func guestConfig(g netpolicy.GuestNet) guest.NetConfig {
	c := guest.NetConfig{Iface: netpolicy.IfaceUplink,
		Addrs:    []string{g.Addr4.String(), g.Addr6.String()},
		Gateways: []string{g.Gateway4.Addr().String(), g.Gateway6.Addr().String()}}
	for _, d := range g.DNS {
		c.DNS = append(c.DNS, d.String())
	}
	return c
}
