// Package freeaddr hands tests loopback addresses for the listeners of the
// processes and servers they start.
package freeaddr

import (
	"net"
	"sync"
	"testing"
)

// handedOut holds every address Loopback returned in this process.
var handedOut sync.Map

// Loopback returns a 127.0.0.1 address whose port was free a moment ago
// and that it never returned before in this process. The kernel may hand
// a just-closed port out again, and two listeners of one test given the
// same port make the second fail to start (seen: two node daemons' gossip
// listeners). Another process may still take the port before the caller
// binds it; that window is the price of passing an address to a child.
func Loopback(t testing.TB) string {
	t.Helper()
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := l.Addr().String()
		l.Close()
		if _, dup := handedOut.LoadOrStore(addr, true); !dup {
			return addr
		}
	}
	t.Fatal("freeaddr: 100 tries gave only addresses handed out before")
	return ""
}
