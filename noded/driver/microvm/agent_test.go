package microvm

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/warrenhq/warren/guest"
)

// fakeAgentSocket listens where QEMU's agent socket would be. The first
// connection is swallowed, as by an agent that lost the host's first calls
// (its ping is never answered); it reports on hungUp when the host hangs
// it up. Later connections are served by a guest.Server (pings only).
func fakeAgentSocket(t *testing.T, s vmSpec) (hungUp <-chan struct{}) {
	t.Helper()
	ln, err := net.Listen("unix", s.agentPath())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	hung := make(chan struct{})
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		_, _ = io.Copy(io.Discard, c) // until the host hangs up
		c.Close()
		close(hung)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { _ = (&guest.Server{}).Serve(c) }()
		}
	}()
	return hung
}

// A ping the agent never answers is retried on a new connection, after
// the host hangs up on the first, instead of holding the claim for the
// whole wait.
func TestWaitAgentRetriesAnUnansweredPing(t *testing.T) {
	s := vmSpec{ID: "w", Dir: t.TempDir()}
	hungUp := fakeAgentSocket(t, s)
	var logs bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := waitAgent(ctx, s, make(chan struct{}), 200*time.Millisecond, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatalf("waitAgent: %v\n%s", err, logs.String())
	}
	defer c.Close()
	select {
	case <-hungUp:
	default:
		t.Fatal("the first, unanswered connection was not hung up")
	}
	if !strings.Contains(logs.String(), "reconnecting") {
		t.Errorf("the retry was not logged: %q", logs.String())
	}
}

// A VM whose QEMU exits ends the wait at once, with QEMU's log.
func TestWaitAgentEndsWhenQEMUExits(t *testing.T) {
	s := vmSpec{ID: "w", Dir: t.TempDir()}
	fakeAgentSocket(t, s)
	exited := make(chan struct{})
	time.AfterFunc(300*time.Millisecond, func() { close(exited) })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err := waitAgent(ctx, s, exited, 10*time.Second, slog.New(slog.DiscardHandler))
	if err == nil || !strings.Contains(err.Error(), "qemu exited") {
		t.Fatalf("waitAgent after QEMU exited: %v, want qemu exited", err)
	}
	if ctx.Err() != nil {
		t.Fatal("waitAgent waited out its context")
	}
}

// A QEMU that exits before its QMP socket answers (here one that cannot
// start: the binary is /bin/false) fails the launch at once, with its
// log, instead of leaving the caller waiting for QMP until its deadline.
func TestLaunchEndsWhenQEMUExits(t *testing.T) {
	d := &Driver{cfg: Config{QEMU: "/bin/false"}, log: slog.New(slog.DiscardHandler)}
	vm := &VM{d: d, id: "x", spec: vmSpec{ID: "x", Dir: t.TempDir(), MemMB: 64, VCPUs: 1, Accel: "tcg"}}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err := vm.launch(ctx, "")
	if err == nil || !strings.Contains(err.Error(), "qemu exited") {
		t.Fatalf("launch of a QEMU that exits: %v, want qemu exited", err)
	}
	if ctx.Err() != nil {
		t.Fatal("launch waited out its context")
	}
}
