package microvm

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warrenhq/warren/netpolicy"
	"github.com/warrenhq/warren/netpolicy/netpolicytest"
	"github.com/warrenhq/warren/noded/driver"
)

// Issue 6's acceptance from inside a real microVM: the guest's NIC sits
// on a tap in the sandbox's namespace, its DNS goes to the node's
// allowlist resolver, and everything else is refused.
func TestEgressFromMicroVM(t *testing.T) {
	needVM(t)
	tp := netpolicytest.New(t)
	var mu sync.Mutex
	var audit []netpolicy.AuditEvent
	m := tp.Manager(t, 1, func(_ string, b netpolicy.AuditBatch) {
		mu.Lock()
		audit = append(audit, b.Events...)
		mu.Unlock()
	})
	d, err := New(Config{ImageDir: imageDir(), StateDir: t.TempDir(), Accel: os.Getenv("WARREN_TEST_ACCEL"),
		Networks: driver.PolicyNetworks{M: m}, Logger: slog.New(slog.NewTextHandler(tlog{t}, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer assertNothingLeft(t, d)
	// Booted, the claim sets the guest's network; restored from the
	// snapshot, the clone has it already.
	for _, start := range []driver.Start{driver.StartBoot, driver.StartRestore} {
		t.Run(string(start), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			if start == driver.StartRestore {
				// The snapshot's guest set this node's network before it was
				// saved; the clone's claim finds it in place and sets nothing.
				if err := d.EnsureSnapshot(ctx, ""); err != nil {
					t.Fatal(err)
				}
				ts, err := d.template("")
				if err != nil {
					t.Fatal(err)
				}
				if snap := d.snapshotFor(ts); snap == nil || snap.Meta.GuestNet == "" {
					t.Fatalf("snapshot without the network: %+v", snap)
				}
			}
			mu.Lock()
			audit = nil
			mu.Unlock()
			sb, err := d.Claim(ctx, driver.ClaimRequest{ID: "sb-egress-" + string(start), Force: start})
			if err != nil {
				t.Fatal(err)
			}
			defer sb.Destroy()
			if got := sb.(*VM).start; got != start {
				t.Fatalf("the sandbox started %q, want %q", got, start)
			}
			assertQuietIPv6(t, sb, start == driver.StartRestore)
			nw := sb.(driver.Networked).Network().(driver.PolicyNetwork)
			nw.Bind(sb.ID())
			if err := nw.SetPolicy(netpolicy.Policy{}); err != nil {
				t.Fatal(err)
			}
			try := func(args string) []string {
				return netpolicytest.Probe(t, func(script string) (string, int) { return run(t, sb, script) }, args)
			}
			if f := try("allowed.test"); f[0] != "ok" || f[1] != netpolicytest.Web.String() {
				t.Errorf("allowed.test: %v; want ok via %v", f, netpolicytest.Web)
			}
			if f := try("denied.test"); f[0] != "noname" {
				t.Errorf("denied.test: %v; want no name", f)
			}
			for _, target := range []string{
				netpolicytest.Other.String(),
				netpolicytest.Private.String(),
				fmt.Sprintf("%s %d", netpolicytest.NodeAddr, netpolicytest.APIPort),
				fmt.Sprintf("%s %d", netpolicytest.NodeAddr, netpolicytest.GossipPort),
				"169.254.169.254",
				netpolicy.GuestGateway4.String(),
			} {
				f := try(target)
				if f[0] != "refused" || f[3] != "ConnectionRefusedError" {
					t.Errorf("%s: %v; want ConnectionRefusedError (a reset)", target, f)
					continue
				}
				if ms, err := strconv.ParseFloat(f[2], 64); err != nil || ms > 100 {
					t.Errorf("%s: refused after %s ms; want within 100 ms", target, f[2])
				}
			}
			// UDP and ICMP to a denied host fail; the same to the allowed one
			// pass for UDP.
			out, _ := run(t, sb, fmt.Sprintf(`python3 -c '
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(2); s.connect(("%s", 80)); s.send(b"x")
try:
    s.recv(4); print("udp-answered")
except Exception as e:
    print("udp", type(e).__name__)
r = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP); r.settimeout(2)
req = bytearray(b"\x08\x00\x00\x00\x12\x34\x00\x01")
c = sum(req[i] << 8 | req[i+1] for i in range(0, 8, 2)); c = (c >> 16) + (c & 0xffff); c = ~(c + (c >> 16)) & 0xffff
req[2], req[3] = c >> 8, c & 0xff
try:
    r.sendto(bytes(req), ("%s", 0))
    while True:
        d = r.recv(1500); t = d[(d[0] & 15) * 4]
        if t != 8:
            print("icmp-type", t); break
except Exception as e:
    print("icmp", type(e).__name__)
'`, netpolicytest.Other, netpolicytest.Other))
			t.Logf("udp/icmp to %v: %s", netpolicytest.Other, strings.TrimSpace(out))
			if !strings.Contains(out, "udp OSError") && !strings.Contains(out, "udp ConnectionRefusedError") || !strings.Contains(out, "icmp-type 3") {
				t.Errorf("udp or icmp to a denied host got through: %s", out)
			}
			// A live change: allowed.test is off the list for new connections.
			if err := nw.SetPolicy(netpolicy.Policy{Profile: netpolicy.ProfileCustom, Allow: []string{"www.cdn.test"}}); err != nil {
				t.Fatal(err)
			}
			if f := try("allowed.test"); f[0] != "noname" {
				t.Errorf("allowed.test after the change: %v; want no name", f)
			}
			if f := try(netpolicytest.Web.String()); f[0] != "refused" {
				t.Errorf("%v after the change: %v; want refused", netpolicytest.Web, f)
			}
			deadline := time.Now().Add(5 * time.Second)
			for {
				mu.Lock()
				var allow, deny bool
				for _, e := range audit {
					allow = allow || e.Verdict == "allow" && e.Kind == "connect" && e.Addr == netpolicytest.Web.String()
					deny = deny || e.Verdict == "deny" && e.Kind == "connect" && e.Addr == netpolicytest.Other.String()
				}
				mu.Unlock()
				if allow && deny {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("audit: allow %v, deny %v: %+v", allow, deny, audit)
				}
				time.Sleep(50 * time.Millisecond)
			}
		})
	}
}

// assertQuietIPv6 checks that a claimed sandbox's kernel is done with
// bringing its link up, or soon is: the link is up with a link-local
// address that is not tentative (at once in a restored clone: the
// snapshot waited for it), and from then on, over a second and a half,
// the guest sends no IPv6 packet of its own (router solicitations, MLD
// reports). A clone that still had that work pending from its snapshot
// would run it during its claim (guest.ipv6Quiet, waitLinkReady).
func assertQuietIPv6(t *testing.T, sb driver.Sandbox, restored bool) {
	t.Helper()
	const script = `cat /sys/class/net/eth0/operstate; cat /proc/net/if_inet6; echo sent $(grep '^Ip6OutRequests ' /proc/net/dev_snmp6/eth0)`
	read := func() (ready bool, why, sent string) {
		out, _ := run(t, sb, script)
		lines := strings.SplitN(out, "\n", 2)
		if len(lines) != 2 {
			t.Fatalf("unexpected output: %q", out)
		}
		if i := strings.LastIndex(out, "sent "); i >= 0 {
			sent = strings.TrimSpace(out[i:])
		}
		if lines[0] != "up" {
			return false, "operstate " + lines[0], sent
		}
		ready, why = linkLocalReady(lines[1], "eth0")
		return ready, why, sent
	}
	deadline := time.Now().Add(5 * time.Second)
	for first := true; ; first = false {
		ready, why, _ := read()
		if ready {
			break
		}
		if restored && first {
			t.Errorf("a restored clone's link is not ready at its claim: %s", why)
		}
		if time.Now().After(deadline) {
			t.Fatalf("link not ready 5s after the claim: %s", why)
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond)
	_, _, before := read()
	time.Sleep(1500 * time.Millisecond)
	ready, why, after := read()
	t.Logf("IPv6 packets sent by the guest: %q, 1.5s later %q", before, after)
	if !ready {
		t.Errorf("link no longer ready: %s", why)
	}
	if before == "" || before != after {
		t.Errorf("the guest sent IPv6 packets of its own after its link was ready: %q, then %q", before, after)
	}
}

// A node restart (driver and egress manager detached, as for an upgrade in
// place) keeps a running sandbox's network: the next run re-adopts the VM
// and takes back its namespace with its policy; pausing to disk and
// resuming gives QEMU a new tap in the same namespace.
func TestEgressSurvivesRestart(t *testing.T) {
	needVM(t)
	tp := netpolicytest.New(t)
	cfg := tp.Config(0, nil)
	cfg.StateDir = t.TempDir()
	m1, err := netpolicy.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	state := t.TempDir()
	newD := func(m *netpolicy.Manager) *Driver {
		d, err := New(Config{ImageDir: imageDir(), StateDir: state, Accel: os.Getenv("WARREN_TEST_ACCEL"),
			Networks: driver.PolicyNetworks{M: m}, Logger: slog.New(slog.NewTextHandler(tlog{t}, nil))})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	d1 := newD(m1)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	sb, err := d1.Claim(ctx, driver.ClaimRequest{ID: "sb-egress-restart", TTL: time.Hour})
	if err != nil {
		d1.Close()
		t.Fatal(err)
	}
	nw := sb.(driver.Networked).Network().(driver.PolicyNetwork)
	nw.Bind(sb.ID())
	if err := nw.SetPolicy(netpolicy.Policy{Profile: netpolicy.ProfileCustom, Allow: []string{"www.cdn.test"}}); err != nil {
		t.Fatal(err)
	}
	try := func(sb driver.Sandbox, args string) []string {
		return netpolicytest.Probe(t, func(script string) (string, int) { return run(t, sb, script) }, args)
	}
	if f := try(sb, "www.cdn.test"); f[0] != "ok" {
		t.Fatalf("before the restart: %v", f)
	}
	d1.Detach()
	m1.Detach()

	m2, err := netpolicy.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer m2.Close()
	d2 := newD(m2)
	defer assertNothingLeft(t, d2)
	if err := m2.ReapOrphans(); err != nil {
		t.Fatal(err)
	}
	got, ok := d2.Get("sb-egress-restart")
	if !ok {
		t.Fatal("the sandbox was not re-adopted")
	}
	n2, ok := got.(driver.Networked).Network().(driver.PolicyNetwork)
	if !ok || n2.Policy().Profile != netpolicy.ProfileCustom {
		t.Fatalf("the re-adopted sandbox's network: %v %+v", ok, n2)
	}
	if f := try(got, "www.cdn.test"); f[0] != "ok" {
		t.Errorf("after the restart: %v", f)
	}
	if f := try(got, "allowed.test"); f[0] != "noname" {
		t.Errorf("allowed.test after the restart: %v; the custom policy must hold", f)
	}
	ia := got.(driver.Interactive)
	if err := ia.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	if err := ia.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	if f := try(got, "www.cdn.test"); f[0] != "ok" {
		t.Errorf("after pause and resume: %v", f)
	}
	if f := try(got, netpolicytest.Other.String()); f[0] != "refused" {
		t.Errorf("%v after pause and resume: %v", netpolicytest.Other, f)
	}
	got.Destroy()
}
