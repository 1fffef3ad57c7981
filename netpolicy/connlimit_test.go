package netpolicy

import (
	"io"
	"net"
	"net/netip"
	"testing"
	"time"
)

// The resolver's TCP listener keeps at most perSource connections from
// one address and closes the rest at once; a closed one frees its place.
func TestLimitListenerCapsConnectionsPerSource(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := newLimitListener(inner, 2, 10)
	defer l.Close()
	accepted := make(chan net.Conn, 10)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				close(accepted)
				return
			}
			accepted <- c
		}
	}()
	var clients []net.Conn
	for range 4 {
		c, err := net.Dial("tcp", inner.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		clients = append(clients, c)
	}
	var held []net.Conn
	for range 2 {
		select {
		case c := <-accepted:
			held = append(held, c)
		case <-time.After(5 * time.Second):
			t.Fatal("the first two connections were not accepted")
		}
	}
	// The two past the limit are closed by the listener: their reads end.
	closed := 0
	for _, c := range clients {
		c.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
		if _, err := c.Read(make([]byte, 1)); err == io.EOF {
			closed++
		}
	}
	if closed != 2 {
		t.Fatalf("%d connections closed by the listener, want the 2 past its limit of 2", closed)
	}
	select {
	case c := <-accepted:
		t.Fatalf("a connection past the limit was handed out: %v", c.RemoteAddr())
	default:
	}
	// One closed: the next is accepted.
	held[0].Close()
	held[0].Close() // twice gives back one place only
	c, err := net.Dial("tcp", inner.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	select {
	case <-accepted:
	case <-time.After(5 * time.Second):
		t.Fatal("no connection accepted after one was closed")
	}
	l.mu.Lock()
	n := l.n
	l.mu.Unlock()
	if n != 2 {
		t.Fatalf("%d connections counted, want 2", n)
	}
}

// With every place taken, a source holding fewer connections than the
// source holding the most takes the oldest of that one's places, until
// the sources hold about as many each: a few sandboxes holding their 16
// each took every place before, and DNS over TCP was gone for the node's
// other sandboxes.
func TestLimitListenerSharesItsPlacesAmongSources(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := newLimitListener(inner, 4, 8)
	defer l.Close()
	go func() {
		for {
			if _, err := l.Accept(); err != nil {
				return
			}
		}
	}()
	dial := func(src string) net.Conn {
		t.Helper()
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
		c, err := d.Dial("tcp", inner.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	held := func(src string) int {
		l.mu.Lock()
		defer l.mu.Unlock()
		return len(l.open[netip.MustParseAddr(src)])
	}
	waitHeld := func(src string, n int) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for held(src) != n {
			if time.Now().After(deadline) {
				t.Fatalf("%s holds %d, want %d", src, held(src), n)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	var first []net.Conn
	for _, src := range []string{"127.0.0.2", "127.0.0.3"} {
		for i := range 4 {
			c := dial(src)
			if i == 0 {
				first = append(first, c)
			}
			waitHeld(src, i+1)
		}
	}
	for range 4 {
		dial("127.0.0.4")
	}
	time.Sleep(200 * time.Millisecond) // the listener's answer to all four
	a, b, c := held("127.0.0.2"), held("127.0.0.3"), held("127.0.0.4")
	if a+b+c != 8 || c != 2 || a != 3 || b != 3 {
		t.Fatalf("sources hold %d, %d and %d; want 3, 3 and 2", a, b, c)
	}
	// The places taken were each source's oldest connection's.
	for _, conn := range first {
		conn.SetReadDeadline(time.Now().Add(2 * time.Second))
		if _, err := conn.Read(make([]byte, 1)); err != io.EOF {
			t.Errorf("the oldest connection of %v: read %v, want it closed", conn.LocalAddr(), err)
		}
	}
}
