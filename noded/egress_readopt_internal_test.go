package noded

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/warrenhq/warren/netpolicy"
	"github.com/warrenhq/warren/netpolicy/netpolicytest"
	"github.com/warrenhq/warren/noded/driver"
)

// netSandbox is a sandbox with only a network, for bind.
type netSandbox struct {
	id string
	n  driver.Network
}

func (s *netSandbox) ID() string              { return s.id }
func (s *netSandbox) Warm() bool              { return false }
func (s *netSandbox) Network() driver.Network { return s.n }
func (s *netSandbox) Destroy() error          { return s.n.Close() }
func (s *netSandbox) Exec(context.Context, driver.ExecRequest) (driver.ExecResult, error) {
	return driver.ExecResult{}, errors.New("no guest")
}

// A task's sandbox tries a denied host and the node dies before reporting
// it. The next run's driver re-adopts the sandbox (Egress.Reattach); the
// task's actor destroys it, whose close reports the attempt, and binds a
// fresh sandbox under the same id (taskActor.start). The attempt reaches
// the task's sink, not the node's log: the audit is incremental, so the
// task's log would never have it.
func TestReadoptedTaskSandboxAuditReachesTheTask(t *testing.T) {
	netpolicytest.NeedRoot(t)
	tp := netpolicytest.New(t)
	cfg := tp.Config(0, nil)
	cfg.StateDir = t.TempDir()
	cfg.AuditInterval = time.Hour // only a close reports
	const id = "task-readopt-e3"
	ctx := context.Background()

	m1, err := netpolicy.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s1, err := m1.Claim(ctx, id, netpolicy.Policy{Profile: netpolicy.ProfileNone})
	if err != nil {
		m1.Close()
		t.Fatal(err)
	}
	denied := netip.AddrPortFrom(netpolicytest.Other, 4243)
	if err := netpolicy.InNamedNS(s1.NSPath(), func() error {
		d := net.Dialer{Timeout: 2 * time.Second}
		c, err := d.Dial("tcp", denied.String())
		if err == nil {
			c.Close()
			return errors.New("connected")
		}
		return nil
	}); err != nil {
		m1.Close()
		t.Fatalf("connect to %v, which the policy denies: %v", denied, err)
	}
	m1.Detach()

	var logged bytes.Buffer
	cfg.Logger = slog.New(slog.NewTextHandler(&logged, nil))
	e, err := NewEgress(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	old, err := e.Reattach(s1.NSPath())
	if err != nil {
		t.Fatal(err)
	}
	if err := old.Close(); err != nil { // destroyLeft
		t.Fatal(err)
	}
	fresh, err := e.Attach(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var got []netpolicy.AuditBatch
	sink := func(b netpolicy.AuditBatch) { mu.Lock(); got = append(got, b); mu.Unlock() }
	if err := e.bind(&netSandbox{id: id, n: fresh}, netpolicy.Policy{Profile: netpolicy.ProfileNone}, sink); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, b := range got {
		for _, ev := range b.Events {
			if ev.Verdict == "deny" && ev.Kind == "connect" && ev.Addr == denied.Addr().String() && ev.Port == int(denied.Port()) {
				return
			}
		}
	}
	t.Fatalf("the attempt to %v the re-adopted sandbox made never reached its task's sink (%d batches); the node's log:\n%s", denied, len(got), logged.String())
}
