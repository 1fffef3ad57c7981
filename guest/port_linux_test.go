package guest

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// socketPair returns two connected stream sockets as files in Go's poller,
// as the port is: the guest's end (standing in for the port) and the
// host's.
func socketPair(t *testing.T) (guestEnd, hostEnd *os.File) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	g, h := os.NewFile(uintptr(fds[0]), "guest"), os.NewFile(uintptr(fds[1]), "host")
	t.Cleanup(func() { g.Close(); h.Close() })
	return g, h
}

// A session that reads its host's end of file leaves the port open for
// the next host, and refuses writes once it has ended.
func TestPortConnKeepsThePortAfterEndOfFile(t *testing.T) {
	g, h := socketPair(t)
	srv := &Server{}
	done := make(chan struct{})
	pc := &portConn{f: g}
	go func() { defer close(done); _ = srv.Serve(pc) }()
	hc, err := NewClient(h)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := hc.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	// The guest may still be writing the tail of the ping's stream (its
	// close frame) after the answer arrived; a write under way when the
	// session ends closes the port by design. Wait until it has been idle
	// for 200 ms, so this test sees the case it is about.
	for idle := 0; idle < 10; {
		pc.mu.Lock()
		w := pc.writing
		pc.mu.Unlock()
		if idle++; w > 0 {
			idle = 0
		}
		if ctx.Err() != nil {
			t.Fatal("the guest kept writing after the ping")
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The host hangs up its writing half: the guest reads end of file.
	if err := control(h, func(fd int) error { return unix.Shutdown(fd, unix.SHUT_WR) }); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-ctx.Done():
		t.Fatal("the session did not end at end of file")
	}
	if !pc.kept() {
		t.Fatal("a session that ended at end of file closed the port")
	}
	if _, err := pc.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("write after the session ended: %v, want net.ErrClosed", err)
	}
	// The port itself still works.
	if _, err := g.Write([]byte("still open")); err != nil {
		t.Fatalf("the port was closed: %v", err)
	}
}

// A session that ends any other way closes the port, so what is left of
// its stream is dropped.
func TestPortConnClosesThePortOnABrokenStream(t *testing.T) {
	g, h := socketPair(t)
	srv := &Server{}
	done := make(chan struct{})
	pc := &portConn{f: g}
	go func() { defer close(done); _ = srv.Serve(pc) }()
	// Not yamux: the session ends with a protocol error.
	if _, err := h.Write([]byte("\xffnot a yamux frame header")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the session did not end on a broken stream")
	}
	if pc.kept() {
		t.Fatal("a broken session left the port open")
	}
	if _, err := g.Write([]byte("x")); err == nil {
		t.Fatal("the port is still open")
	}
}

// A write under way when the session ends is cut off with the port: with
// no host connected it would wait and reach the next host.
func TestPortConnCutsOffAWriteUnderWay(t *testing.T) {
	g, _ := socketPair(t)
	pc := &portConn{f: g, eof: true}
	// Fill the socket's buffer so the next write waits, as a port's does
	// with no host connected.
	buf := make([]byte, 64<<10)
	_ = control(g, func(fd int) error {
		for {
			if _, err := unix.Write(fd, buf); err != nil {
				return err
			}
		}
	})
	wrote := make(chan error, 1)
	go func() { _, err := pc.Write(buf); wrote <- err }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		pc.mu.Lock()
		w := pc.writing
		pc.mu.Unlock()
		if w > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the write did not start")
		}
		time.Sleep(time.Millisecond)
	}
	if err := pc.Close(); err != nil {
		t.Fatal(err)
	}
	if pc.kept() {
		t.Fatal("the port was kept with a write under way")
	}
	select {
	case err := <-wrote:
		if err == nil || errors.Is(err, io.ErrShortWrite) {
			t.Fatalf("the write under way was not cut off: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the write under way still waits")
	}
}
