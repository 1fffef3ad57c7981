package container

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/warrenhq/warren/netpolicy"
	"github.com/warrenhq/warren/netpolicy/netpolicytest"
	"github.com/warrenhq/warren/noded/driver"
)

// Issue 6's acceptance from inside a container: it shares its sandbox
// namespace's eth0, and the rules filter what its processes send.
func TestEgressFromContainer(t *testing.T) {
	d := newDriver(t)
	d.Close()
	tp := netpolicytest.New(t)
	m := tp.Manager(t, 0, nil)
	d, err := New(Config{Socket: d.cfg.Socket, ImageDir: imageDir(), StateDir: t.TempDir(), Namespace: "warren-test", Agent: agentBin,
		Networks: driver.PolicyNetworks{M: m}})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sb, err := d.Claim(ctx, driver.ClaimRequest{ID: "sb-ctr-egress"})
	if err != nil {
		t.Fatal(err)
	}
	nw := sb.(driver.Networked).Network().(driver.PolicyNetwork)
	nw.Bind(sb.ID())
	if err := nw.SetPolicy(netpolicy.Policy{}); err != nil {
		t.Fatal(err)
	}
	try := func(args string) []string {
		return netpolicytest.Probe(t, func(script string) (string, int) { return run(t, sb, script) }, args)
	}
	if f := try("allowed.test"); f[0] != "ok" {
		t.Errorf("allowed.test: %v; want ok", f)
	}
	if f := try("denied.test"); f[0] != "noname" {
		t.Errorf("denied.test: %v; want no name", f)
	}
	for _, target := range []string{netpolicytest.Other.String(), netpolicytest.Private.String(),
		fmt.Sprintf("%s %d", netpolicytest.NodeAddr, netpolicytest.APIPort), "169.254.169.254"} {
		if f := try(target); f[0] != "refused" || f[3] != "ConnectionRefusedError" {
			t.Errorf("%s: %v; want ConnectionRefusedError (a reset)", target, f)
		}
	}
	// The container cannot loosen its own rules (no CAP_NET_ADMIN) nor go
	// around them with a packet or raw socket (no CAP_NET_RAW).
	if out, _ := run(t, sb, "ip link set eth0 down 2>&1; echo rc=$?"); !strings.Contains(out, "rc=2") && !strings.Contains(out, "Operation not permitted") {
		t.Errorf("the container changed its link: %q", out)
	}
	out, _ := run(t, sb, `python3 -c '
import socket
for fam, typ in ((socket.AF_PACKET, socket.SOCK_RAW), (socket.AF_INET, socket.SOCK_RAW)):
    try:
        socket.socket(fam, typ, 0 if fam == socket.AF_PACKET else socket.IPPROTO_TCP); print("opened")
    except PermissionError:
        print("refused")
'`)
	if strings.TrimSpace(out) != "refused\nrefused" {
		t.Errorf("packet and raw sockets in the container: %q; want both refused", out)
	}
	dir := sb.(*Box).dir
	if err := sb.Destroy(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("box directory left: %v", err)
	}
}
