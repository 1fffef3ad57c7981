package netpolicy

import (
	"io"
	"net"
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
