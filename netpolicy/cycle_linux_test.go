package netpolicy_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
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
		if x == "warren-"+tp.Tag+"-77" || x == "link w"+tp.Tag+"-77" {
			t.Fatalf("restart left %s: %v", x, got)
		}
	}
	m.Close()
	if got := leftovers(t, tp); len(got) != 0 {
		t.Fatalf("after Close: %v", got)
	}
}

// A node that restarts (its egress manager detached, as for an upgrade in
// place, or killed) takes back
// the network of a sandbox its driver re-adopts, policy and established
// connections included, and removes the one no driver took back.
func TestRestartTakesBackNetworks(t *testing.T) {
	tp := New(t)
	cfg := tp.Config(0, nil)
	cfg.StateDir = t.TempDir()
	m1, err := netpolicy.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	keep, err := m1.Claim(ctx, "sb-keep", netpolicy.Policy{Profile: netpolicy.ProfileCustom, Allow: []string{"www.cdn.test"}})
	if err != nil {
		t.Fatal(err)
	}
	gone, err := m1.Claim(ctx, "sb-gone", netpolicy.Policy{})
	if err != nil {
		t.Fatal(err)
	}
	if rc, _ := lookup(t, keep, "www.cdn.test", dns.TypeA); rc != dns.RcodeSuccess {
		t.Fatalf("www.cdn.test: rcode %d", rc)
	}
	var c net.Conn
	if err := netpolicy.InNamedNS(keep.NSPath(), func() (err error) {
		c, err = net.Dial("tcp", netip.AddrPortFrom(Web, 80).String())
		return
	}); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	m1.Detach()

	m2, err := netpolicy.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer m2.Close()
	s, err := m2.Reattach(keep.NSPath())
	if err != nil {
		t.Fatal(err)
	}
	if s.ID() != "sb-keep" || s.Policy().Profile != netpolicy.ProfileCustom {
		t.Fatalf("reattached %q with %+v", s.ID(), s.Policy())
	}
	c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Write([]byte("ping")); err != nil {
		t.Fatalf("established connection after the restart: %v", err)
	}
	if _, err := c.Read(make([]byte, 4)); err != nil {
		t.Fatalf("established connection after the restart: %v", err)
	}
	if rc, _ := lookup(t, s, "www.cdn.test", dns.TypeA); rc != dns.RcodeSuccess {
		t.Errorf("www.cdn.test after the restart: rcode %d", rc)
	}
	if rc, _ := lookup(t, s, "allowed.test", dns.TypeA); rc != dns.RcodeNameError {
		t.Errorf("allowed.test after the restart: rcode %d; the custom policy must hold", rc)
	}
	if _, err := connect(s, netip.AddrPortFrom(Other, 80)); err == nil {
		t.Error("the rules are gone after the restart")
	}
	if _, err := m2.Reattach(gone.NSPath() + "-no-such"); err == nil {
		t.Error("reattached a namespace that does not exist")
	}
	if err := m2.ReapOrphans(); err != nil {
		t.Fatal(err)
	}
	got := leftovers(t, tp)
	for _, x := range got {
		if x == "warren-"+tp.Tag+"-"+strconv.Itoa(gone.Slot().Index) || x == "link w"+tp.Tag+"-"+strconv.Itoa(gone.Slot().Index) {
			t.Errorf("the untaken network is left: %s (all: %v)", x, got)
		}
	}
	if err := m2.Close(); err != nil {
		t.Fatal(err)
	}
	if got := leftovers(t, tp); len(got) != 0 {
		t.Fatalf("after Close: %v", got)
	}
	if ents, _ := os.ReadDir(cfg.StateDir); len(ents) != 0 {
		t.Errorf("state files left: %d", len(ents))
	}
}

// A restarted node that takes a network back does not report again the
// attempts its earlier run reported: the audit sets outlive the node, and
// so does what was reported of them.
func TestRestartDoesNotReportAgain(t *testing.T) {
	tp := New(t)
	cfg := tp.Config(0, nil)
	cfg.StateDir = t.TempDir()
	cfg.AuditInterval = time.Hour
	m1, err := netpolicy.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s1, err := m1.Claim(context.Background(), "sb-dup", netpolicy.Policy{})
	if err != nil {
		t.Fatal(err)
	}
	count := func(bs []netpolicy.AuditBatch, port int) (n uint64) {
		for _, b := range bs {
			for _, e := range b.Events {
				if e.Kind == "connect" && e.Addr == Other.String() && e.Port == port {
					n += e.Count
				}
			}
		}
		return n
	}
	if _, err := connect(s1, netip.AddrPortFrom(Other, 4242)); err == nil {
		t.Fatal("connect to the denied host succeeded")
	}
	bs, err := s1.Collect()
	if err != nil {
		t.Fatal(err)
	}
	if n := count(bs, 4242); n != 1 {
		t.Fatalf("before the restart: %d attempts reported, want 1", n)
	}
	// One more attempt, not reported before the restart: the next run
	// reports it.
	if _, err := connect(s1, netip.AddrPortFrom(Other, 4243)); err == nil {
		t.Fatal("connect to the denied host succeeded")
	}
	m1.Detach()
	m2, err := netpolicy.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer m2.Close()
	s2, err := m2.Reattach(s1.NSPath())
	if err != nil {
		t.Fatal(err)
	}
	bs, err = s2.Collect()
	if err != nil {
		t.Fatal(err)
	}
	if n := count(bs, 4242); n != 0 {
		t.Errorf("after the restart the attempt to %v:4242, already reported, is reported again (%d)", Other, n)
	}
	if n := count(bs, 4243); n != 1 {
		t.Errorf("after the restart the attempt to %v:4243, not reported before, is reported %d times; want 1", Other, n)
	}
}

// A sandbox's record whose namespace is gone (a reboot empties /run/netns)
// is removed when the manager starts: a new sandbox in its slot would
// otherwise be taken back, after a crash, under the old one's id and
// policy.
func TestStateWithoutANamespaceIsRemoved(t *testing.T) {
	tp := New(t)
	cfg := tp.Config(0, nil)
	cfg.StateDir = t.TempDir()
	stale := filepath.Join(cfg.StateDir, "warren-"+tp.Tag+"-3.json")
	other := filepath.Join(cfg.StateDir, "unrelated.json")
	for _, f := range []string{stale, other} {
		if err := os.WriteFile(f, []byte(`{"id":"sb-old"}`), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	m, err := netpolicy.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Errorf("the record of a namespace that is gone is still there: %v", err)
	}
	if _, err := os.Stat(other); err != nil {
		t.Errorf("a file that is not a sandbox's record was removed: %v", err)
	}
}

// A network taken back after a restart knows which addresses its allow
// sets hold and until when, as the run before did: a lookup then renews
// an address still there (out and back in, in one batch) instead of
// adding it again, which a kernel that keeps an element's first timeout
// would ignore while the resolver recorded the later time and skipped
// every renewal up to it.
func TestATakenBackNetworkKnowsItsAllowedAddresses(t *testing.T) {
	tp := New(t)
	cfg := tp.Config(0, nil)
	cfg.StateDir = t.TempDir()
	m1, err := netpolicy.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s1, err := m1.Claim(context.Background(), "sb-allowed-back", netpolicy.Policy{})
	if err != nil {
		t.Fatal(err)
	}
	if rc, addrs := lookup(t, s1, "allowed.test", dns.TypeA); rc != dns.RcodeSuccess || !slices.Contains(addrs, Web) {
		t.Fatalf("allowed.test: rcode %d, %v", rc, addrs)
	}
	until, ok := s1.AllowedUntil(Web)
	if !ok {
		t.Fatalf("%v is not recorded as allowed after its lookup", Web)
	}
	m1.Detach()
	m2, err := netpolicy.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer m2.Close()
	s2, err := m2.Reattach(s1.NSPath())
	if err != nil {
		t.Fatal(err)
	}
	got, ok := s2.AllowedUntil(Web)
	if !ok {
		t.Fatalf("after the restart %v, still in the allow set, is not recorded as allowed", Web)
	}
	if d := got.Sub(until); d < -2*time.Second || d > 2*time.Second {
		t.Fatalf("after the restart %v is recorded as allowed until %v, the run before until %v", Web, got, until)
	}
}

// stateFile is a sandbox's record in dir, and a stamp of the file that
// changes with each write (a write renames a new file over it).
func stateFile(t *testing.T, dir string, s *netpolicy.Sandbox) (path, stamp string) {
	t.Helper()
	path = filepath.Join(dir, filepath.Base(s.NSPath())+".json")
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return path, fmt.Sprintf("ino %d mtime %d.%09d ctime %d.%09d", st.Ino, st.Mtim.Sec, st.Mtim.Nsec, st.Ctim.Sec, st.Ctim.Nsec)
}

// portReports counts the audit's connect events to Other, by port.
type portReports struct {
	mu sync.Mutex
	n  map[int]int // reports naming the port
}

func (l *portReports) sink(_ string, b netpolicy.AuditBatch) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, e := range b.Events {
		if e.Kind == "connect" && e.Addr == Other.String() {
			l.n[e.Port]++
		}
	}
}

func (l *portReports) reports(port int) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.n[port]
}

// A guest that keeps sending to a destination already reported does not
// make the node rewrite its sandbox's record (every attempt still in the
// audit sets, up to a megabyte) at every audit interval: a report writes
// it at most every stateSaveEvery (30 s).
func TestAReportDoesNotRewriteTheStateEachInterval(t *testing.T) {
	tp := New(t)
	log := &portReports{n: map[int]int{}}
	cfg := tp.Config(0, log.sink)
	cfg.StateDir = t.TempDir()
	m, err := netpolicy.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	s, err := m.Claim(context.Background(), "sb-quiet-state", netpolicy.Policy{})
	if err != nil {
		t.Fatal(err)
	}
	ports := []int{4242, 4243, 4244, 4245}
	for _, p := range ports {
		if _, err := connect(s, netip.AddrPortFrom(Other, uint16(p))); err == nil {
			t.Fatalf("connect to the denied %v:%d succeeded", Other, p)
		}
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		done := true
		for _, p := range ports {
			done = done && log.reports(p) > 0
		}
		if done {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the denied attempts were not reported")
		}
	}
	_, stamp := stateFile(t, cfg.StateDir, s)
	before, writes := log.reports(4242), 0
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end); {
		if _, err := connect(s, netip.AddrPortFrom(Other, 4242)); err == nil {
			t.Fatalf("connect to the denied %v:4242 succeeded", Other)
		}
		time.Sleep(cfg.AuditInterval)
		if _, now := stateFile(t, cfg.StateDir, s); now != stamp {
			writes++
			stamp = now
		}
	}
	if n := log.reports(4242) - before; n < 5 {
		t.Fatalf("%d reports of the repeated attempt in 2 s at a %v interval; the test needs more", n, cfg.AuditInterval)
	}
	if writes > 1 {
		t.Errorf("the sandbox's record was written %d times in 2 s of reports of one destination already reported; want at most 1", writes)
	}
}

// A record that lags the reports is written by a later report once
// stateSaveEvery has passed, even if that report has nothing new, so a
// crash re-reports at most that long's worth of attempts.
func TestALaggingStateIsWrittenLater(t *testing.T) {
	tp := New(t)
	cfg := tp.Config(0, nil)
	cfg.StateDir = t.TempDir()
	netpolicy.SetStateSaveEvery(&cfg, time.Second)
	m, err := netpolicy.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	s, err := m.Claim(context.Background(), "sb-lagging-state", netpolicy.Policy{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := connect(s, netip.AddrPortFrom(Other, 4242)); err == nil {
		t.Fatalf("connect to the denied %v:4242 succeeded", Other)
	}
	path, _ := stateFile(t, cfg.StateDir, s)
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		type seen struct {
			Addr    netip.Addr
			Port    int
			Packets uint64
		}
		var st struct{ Seen []seen }
		if err := json.Unmarshal(b, &st); err != nil {
			t.Fatal(err)
		}
		if slices.ContainsFunc(st.Seen, func(a seen) bool { return a.Addr == Other && a.Port == 4242 && a.Packets > 0 }) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the reported attempt to %v:4242 is not in the sandbox's record after 5 s: %s", Other, b)
		}
	}
}

// A restarted node that takes a network back puts its own rules in the
// namespace, not those of the run that made it (an older binary, other
// node addresses or cluster ports), in one batch: connections, allowed
// addresses and the audit sets go on.
func TestRestartReplacesTheRules(t *testing.T) {
	tp := New(t)
	cfg := tp.Config(0, nil)
	cfg.StateDir = t.TempDir()
	cfg.AuditInterval = time.Hour // only Collect reports
	m1, err := netpolicy.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s1, err := m1.Claim(context.Background(), "sb-old-rules", netpolicy.Policy{})
	if err != nil {
		t.Fatal(err)
	}
	if rc, addrs := lookup(t, s1, "allowed.test", dns.TypeA); rc != dns.RcodeSuccess || !slices.Contains(addrs, Web) {
		t.Fatalf("allowed.test: rcode %d, %v", rc, addrs)
	}
	if err := udpProbe(s1, netip.AddrPortFrom(Web, 53)); err == nil || !isRefused(err) {
		t.Fatalf("udp to %v:53 before the restart: %v; want refused", Web, err)
	}
	var c net.Conn
	if err := netpolicy.InNamedNS(s1.NSPath(), func() (err error) {
		c, err = net.Dial("tcp", netip.AddrPortFrom(Web, 80).String())
		return
	}); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// An attempt the run before did not report: this run does.
	if _, err := connect(s1, netip.AddrPortFrom(Other, 4244)); err == nil {
		t.Fatalf("connect to the denied %v:4244 succeeded", Other)
	}
	m1.Detach()

	// An older binary's rules: DNS to an allowed address not refused.
	ns, err := netns.GetFromPath(s1.NSPath())
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	nft, err := nftables.New(nftables.WithNetNSFd(int(ns)))
	if err != nil {
		t.Fatal(err)
	}
	rules, err := nft.GetRules(&nftables.Table{Name: "warren", Family: nftables.TableFamilyINet}, &nftables.Chain{Name: "egress"})
	if err != nil {
		t.Fatal(err)
	}
	dns53 := 0
	for _, r := range rules {
		var port53, toDeny bool
		for _, e := range r.Exprs {
			switch e := e.(type) {
			case *expr.Cmp:
				port53 = port53 || slices.Equal(e.Data, []byte{0, 53})
			case *expr.Verdict:
				toDeny = e.Kind == expr.VerdictGoto && e.Chain == "deny"
			}
		}
		if port53 && toDeny {
			if err := nft.DelRule(r); err != nil {
				t.Fatal(err)
			}
			dns53++
		}
	}
	if err := nft.Flush(); err != nil {
		t.Fatal(err)
	}
	if dns53 != 2 {
		t.Fatalf("%d rules sending port 53 to deny; want 2 (TCP, UDP)", dns53)
	}
	if err := udpProbe(s1, netip.AddrPortFrom(Web, 53)); err != nil {
		t.Fatalf("udp to %v:53 under the old rules: %v; the test wants it answered", Web, err)
	}

	m2, err := netpolicy.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer m2.Close()
	s2, err := m2.Reattach(s1.NSPath())
	if err != nil {
		t.Fatal(err)
	}
	if err := udpProbe(s2, netip.AddrPortFrom(Web, 53)); err == nil || !isRefused(err) {
		t.Errorf("udp to %v:53 after the restart: %v; want refused by this run's rules", Web, err)
	}
	if _, err := connect(s2, netip.AddrPortFrom(Web, 80)); err != nil {
		t.Errorf("%v, allowed before the restart, after it: %v", Web, err)
	}
	if _, err := connect(s2, netip.AddrPortFrom(Other, 80)); err == nil {
		t.Error("a denied host is reachable after the restart")
	}
	c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Write([]byte("ping")); err != nil {
		t.Fatalf("established connection after the restart: %v", err)
	}
	if _, err := c.Read(make([]byte, 4)); err != nil {
		t.Fatalf("established connection after the restart: %v", err)
	}
	bs, err := s2.Collect()
	if err != nil {
		t.Fatal(err)
	}
	var n uint64
	for _, b := range bs {
		for _, e := range b.Events {
			if e.Kind == "connect" && e.Addr == Other.String() && e.Port == 4244 {
				n += e.Count
			}
		}
	}
	if n != 1 {
		t.Errorf("the attempt to %v:4244 made before the restart is reported %d times after it; want 1 (the audit sets must outlive the new rules)", Other, n)
	}
}
