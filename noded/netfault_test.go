package noded

import (
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
)

// TestFaultTransportShutdownWithPacketsInFlight: Shutdown returns while
// the inner transport's UDP listener is blocked handing over packets that
// nobody reads any more (it hung CI for 14 minutes).
func TestFaultTransportShutdownWithPacketsInFlight(t *testing.T) {
	inner, err := memberlist.NewNetTransport(&memberlist.NetTransportConfig{BindAddrs: []string{"127.0.0.1"}, BindPort: 0})
	if err != nil {
		t.Fatal(err)
	}
	ft := newNetFaults().wrapGossip(inner)
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(inner.GetAutoBindPort()))
	conn, err := net.Dial("udp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// Nobody reads ft.PacketCh(): the pump holds one packet, the inner
	// listener blocks on the next.
	for range 3 {
		if _, err := conn.Write([]byte("ping")); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(200 * time.Millisecond)
	done := make(chan error, 1)
	go func() { done <- ft.Shutdown() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Shutdown did not return within 10 s")
	}
}
