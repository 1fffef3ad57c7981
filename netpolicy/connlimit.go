package netpolicy

import (
	"net"
	"net/netip"
	"sync"
)

// The resolver's TCP listener holds at most maxTCPConnsPerSource
// connections from one address (a sandbox: its namespace masquerades
// every source to its own address) and maxTCPConns in all; it closes the
// ones past that as soon as it accepts them. Each connection is a file
// descriptor of the node, and a guest could otherwise open one per source
// port.
const (
	maxTCPConnsPerSource = 16
	maxTCPConns          = 1024
)

// limitListener is a net.Listener within those limits.
type limitListener struct {
	net.Listener
	perSource, total int

	mu   sync.Mutex
	open map[netip.Addr]int
	n    int
}

func newLimitListener(l net.Listener, perSource, total int) *limitListener {
	return &limitListener{Listener: l, perSource: perSource, total: total, open: map[netip.Addr]int{}}
}

// Accept returns the next connection within the limits; the others are
// closed at once.
func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		src := sourceAddr(c)
		l.mu.Lock()
		if l.n >= l.total || l.open[src] >= l.perSource {
			l.mu.Unlock()
			c.Close()
			continue
		}
		l.open[src]++
		l.n++
		l.mu.Unlock()
		return &limitConn{Conn: c, l: l, src: src}, nil
	}
}

func (l *limitListener) release(src netip.Addr) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.open[src]--; l.open[src] <= 0 {
		delete(l.open, src)
	}
	l.n--
}

func sourceAddr(c net.Conn) netip.Addr {
	if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		return a.AddrPort().Addr().Unmap()
	}
	return netip.Addr{}
}

// limitConn gives its place back when closed (once).
type limitConn struct {
	net.Conn
	l    *limitListener
	src  netip.Addr
	once sync.Once
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.l.release(c.src) })
	return err
}
