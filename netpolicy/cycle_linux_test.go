package netpolicy_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"github.com/warrenhq/warren/netpolicy"
	. "github.com/warrenhq/warren/netpolicy/netpolicytest"
)

// leftovers lists what the manager with tag owns in the test's node
// namespace: named namespaces, links and nftables tables.
func leftovers(t *testing.T, tp *Topo) []string {
	t.Helper()
	var out []string
	ents, err := os.ReadDir("/run/netns")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "warren-"+tp.Tag+"-") {
			out = append(out, e.Name())
		}
	}
	node, err := netns.GetFromPath(tp.NodeNS)
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close()
	h, err := netlink.NewHandleAt(node)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	links, err := h.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range links {
		if strings.HasPrefix(l.Attrs().Name, "w"+tp.Tag+"-") {
			out = append(out, "link "+l.Attrs().Name)
		}
	}
	c, err := nftables.New(nftables.WithNetNSFd(int(node)))
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
	tp := New(t)
	for _, pool := range []int{0, 4} {
		m := tp.Manager(t, pool, nil)
		for i := range 200 {
			s, err := m.Claim(context.Background(), fmt.Sprintf("sb-%d", i), netpolicy.Policy{})
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
		for deadline := time.Now().Add(10 * time.Second); m.Ready() < pool && time.Now().Before(deadline); {
			time.Sleep(10 * time.Millisecond)
		}
		got := leftovers(t, tp)
		if want := 2*pool + 2 + 1; len(got) != want {
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
	tp := New(t)
	// What a killed node daemon leaves: a namespace, its veth and the
	// node table.
	if err := netpolicy.NewNamedNS("warren-" + tp.Tag + "-77"); err != nil {
		t.Fatal(err)
	}
	ns, _ := netns.GetFromPath("/run/netns/warren-" + tp.Tag + "-77")
	node, _ := netns.GetFromPath(tp.NodeNS)
	defer node.Close()
	h, _ := netlink.NewHandleAt(node)
	defer h.Close()
	if err := h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "w" + tp.Tag + "-77"}, PeerName: netpolicy.IfaceUplink, PeerNamespace: netlink.NsFd(int(ns))}); err != nil {
		t.Fatal(err)
	}
	ns.Close()
	c, _ := nftables.New(nftables.WithNetNSFd(int(node)))
	c.AddTable(&nftables.Table{Name: "warren-" + tp.Tag, Family: nftables.TableFamilyINet})
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	if got := leftovers(t, tp); len(got) != 3 {
		t.Fatalf("setup: %v", got)
	}
	m := tp.Manager(t, 0, nil)
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
