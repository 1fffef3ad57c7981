package netpolicy

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
)

// leftovers lists what the manager with tag owns in the test's node
// namespace: named namespaces, links and nftables tables.
func leftovers(t *testing.T, tp *topo) []string {
	t.Helper()
	var out []string
	names, err := listNS("warren-" + tp.tag + "-")
	if err != nil {
		t.Fatal(err)
	}
	out = append(out, names...)
	h, err := netlink.NewHandleAt(tp.node)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	links, err := h.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range links {
		if strings.HasPrefix(l.Attrs().Name, "w"+tp.tag+"-") {
			out = append(out, "link "+l.Attrs().Name)
		}
	}
	c, err := nftables.New(nftables.WithNetNSFd(int(tp.node)))
	if err != nil {
		t.Fatal(err)
	}
	tables, err := c.ListTables()
	if err != nil {
		t.Fatal(err)
	}
	for _, tb := range tables {
		out = append(out, "table "+tb.Name)
	}
	return out
}

func TestCreateDestroyLeavesNothing(t *testing.T) {
	tp := newTopo(t)
	for _, pool := range []int{0, 4} {
		m := tp.manager(t, pool, nil)
		for i := range 200 {
			s, err := m.Claim(context.Background(), fmt.Sprintf("sb-%d", i), Policy{})
			if err != nil {
				t.Fatalf("pool %d, cycle %d: %v", pool, i, err)
			}
			if i%50 == 0 { // now and then with a microVM's tap in it
				f, err := s.OpenTap()
				if err != nil {
					t.Fatal(err)
				}
				f.Close()
			}
			if err := s.Close(); err != nil {
				t.Fatalf("pool %d, cycle %d: close: %v", pool, i, err)
			}
		}
		// While running: the pool's namespaces, their veths, the resolver
		// link pair and the node table, nothing more.
		got := leftovers(t, tp)
		if want := 2*m.Ready() + 2 + 1; len(got) != want {
			t.Errorf("pool %d: %d objects while running, want %d: %v", pool, len(got), want, got)
		}
		if err := m.Close(); err != nil {
			t.Fatal(err)
		}
		if got := leftovers(t, tp); len(got) != 0 {
			t.Fatalf("pool %d: left after 200 cycles and Close: %v", pool, got)
		}
	}
}

func TestRestartReconciles(t *testing.T) {
	tp := newTopo(t)
	// What a killed node daemon leaves: a namespace, its veth and the
	// node table.
	ns, err := createNS("warren-" + tp.tag + "-77")
	if err != nil {
		t.Fatal(err)
	}
	h, _ := netlink.NewHandleAt(tp.node)
	defer h.Close()
	if err := h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "w" + tp.tag + "-77"}, PeerName: IfaceUplink, PeerNamespace: netlink.NsFd(int(ns))}); err != nil {
		t.Fatal(err)
	}
	ns.Close()
	c, _ := nftables.New(nftables.WithNetNSFd(int(tp.node)))
	c.AddTable(&nftables.Table{Name: "warren-" + tp.tag, Family: nftables.TableFamilyINet})
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	if got := leftovers(t, tp); len(got) != 3 {
		t.Fatalf("setup: %v", got)
	}
	m := tp.manager(t, 0, nil)
	got := leftovers(t, tp)
	for _, x := range got {
		if strings.Contains(x, "77") {
			t.Fatalf("restart left %s: %v", x, got)
		}
	}
	m.Close()
	if got := leftovers(t, tp); len(got) != 0 {
		t.Fatalf("after Close: %v", got)
	}
}
