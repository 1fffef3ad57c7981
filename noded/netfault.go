package noded

import (
	"errors"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
)

// errPartitioned is what every request fails with while a test has cut
// the daemon off.
var errPartitioned = errors.New("network partitioned (injected test fault)")

// netFaults lets tests cut the daemon off from everyone: HTTP requests
// fail, the session drops, and gossip packets and streams are dropped both
// ways. With no cut it costs one atomic load per request or packet.
type netFaults struct {
	cut   atomic.Bool
	mu    sync.Mutex
	onCut func()
}

func newNetFaults() *netFaults { return &netFaults{} }

func (n *netFaults) set(cut bool) {
	n.cut.Store(cut)
	if !cut {
		return
	}
	n.mu.Lock()
	f := n.onCut
	n.mu.Unlock()
	if f != nil {
		f()
	}
}

// whenCut sets what a cut does to the open session (drops it).
func (n *netFaults) whenCut(f func()) {
	n.mu.Lock()
	n.onCut = f
	n.mu.Unlock()
}

type faultRT struct {
	n     *netFaults
	inner http.RoundTripper
}

func (f faultRT) RoundTrip(r *http.Request) (*http.Response, error) {
	if f.n.cut.Load() {
		if r.Body != nil {
			r.Body.Close()
		}
		return nil, errPartitioned
	}
	return f.inner.RoundTrip(r)
}

// client returns an HTTP client through the fault switch; h2c selects
// cleartext HTTP/2, which the session's bidirectional stream needs.
func (n *netFaults) client(h2c bool) *http.Client {
	t := &http.Transport{MaxIdleConnsPerHost: 64, IdleConnTimeout: 90 * time.Second}
	if h2c {
		t.Protocols = new(http.Protocols)
		t.Protocols.SetUnencryptedHTTP2(true)
		// Ping a connection that has been quiet for a second and drop it
		// if the ping is not answered within another: a leader whose host
		// lost power or was partitioned away sends no FIN or RST, the
		// session's writes keep filling buffers, and without pings its
		// Receive waited for the kernel's retransmission timeout (~15
		// min) while the new leader declared the node down.
		t.HTTP2 = &http.HTTP2Config{SendPingTimeout: time.Second, PingTimeout: time.Second}
	}
	return &http.Client{Transport: faultRT{n: n, inner: t}}
}

// wrapGossip puts memberlist's transport behind the fault switch.
func (n *netFaults) wrapGossip(inner memberlist.Transport) memberlist.Transport {
	t := &faultTransport{n: n, inner: inner, packets: make(chan *memberlist.Packet), streams: make(chan net.Conn), done: make(chan struct{})}
	go t.pump()
	return t
}

type faultTransport struct {
	n       *netFaults
	inner   memberlist.Transport
	packets chan *memberlist.Packet
	streams chan net.Conn
	done    chan struct{}
	once    sync.Once
}

func (t *faultTransport) pump() {
	for {
		select {
		case p := <-t.inner.PacketCh():
			if t.n.cut.Load() {
				continue
			}
			select {
			case t.packets <- p:
			case <-t.done:
				return
			}
		case c := <-t.inner.StreamCh():
			if t.n.cut.Load() {
				c.Close()
				continue
			}
			select {
			case t.streams <- c:
			case <-t.done:
				c.Close()
				return
			}
		case <-t.done:
			return
		}
	}
}

func (t *faultTransport) FinalAdvertiseAddr(ip string, port int) (net.IP, int, error) {
	return t.inner.FinalAdvertiseAddr(ip, port)
}

func (t *faultTransport) WriteTo(b []byte, addr string) (time.Time, error) {
	if t.n.cut.Load() {
		return time.Now(), nil // dropped on the wire
	}
	return t.inner.WriteTo(b, addr)
}

func (t *faultTransport) PacketCh() <-chan *memberlist.Packet { return t.packets }

func (t *faultTransport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	if t.n.cut.Load() {
		time.Sleep(min(timeout, 100*time.Millisecond))
		return nil, errPartitioned
	}
	return t.inner.DialTimeout(addr, timeout)
}

func (t *faultTransport) StreamCh() <-chan net.Conn { return t.streams }

func (t *faultTransport) Shutdown() error {
	t.once.Do(func() { close(t.done) })
	// The inner transport's listeners may be blocked handing over a packet
	// or a connection; its Shutdown waits for them, so keep taking what
	// they hand over until it returns (once pump has stopped, nothing
	// else would, and Shutdown hung: seen in CI as a 14-minute hang).
	drained := make(chan struct{})
	go func() {
		for {
			select {
			case <-t.inner.PacketCh():
			case c := <-t.inner.StreamCh():
				c.Close()
			case <-drained:
				return
			}
		}
	}()
	err := t.inner.Shutdown()
	close(drained)
	return err
}
