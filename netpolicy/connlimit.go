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

// When all maxTCPConns places are taken, a connection from a source that
// holds fewer than the source holding the most takes the oldest of that
// one's places: 64 sandboxes holding 16 each took every place, and DNS
// over TCP was gone for every other sandbox of the node.

// limitListener is a net.Listener within those limits.
type limitListener struct {
	net.Listener
	perSource, total int

	mu   sync.Mutex
	open map[netip.Addr][]*limitConn // by source, oldest first
	n    int
}

func newLimitListener(l net.Listener, perSource, total int) *limitListener {
	return &limitListener{Listener: l, perSource: perSource, total: total, open: map[netip.Addr][]*limitConn{}}
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
		var evict *limitConn
		if l.n >= l.total {
			evict = l.takeFromLargest(len(l.open[src]))
		}
		if (l.n >= l.total && evict == nil) || len(l.open[src]) >= l.perSource {
			l.mu.Unlock()
			c.Close()
			continue
		}
		lc := &limitConn{Conn: c, l: l, src: src}
		l.open[src] = append(l.open[src], lc)
		l.n++
		l.mu.Unlock()
		if evict != nil {
			evict.Conn.Close() // its place was taken already: Close's release is a no-op
		}
		return lc, nil
	}
}

// takeFromLargest gives up the oldest connection of the source holding
// the most, if it holds more than have+1 (so that taking one of its places
// leaves it at least as many as the taker), and returns it; nil if no
// source does. l.mu is held.
func (l *limitListener) takeFromLargest(have int) *limitConn {
	var most []*limitConn
	for _, cs := range l.open {
		if len(cs) > len(most) {
			most = cs
		}
	}
	if len(most) <= have+1 {
		return nil
	}
	victim := most[0]
	victim.once.Do(func() { l.releaseLocked(victim) })
	return victim
}

func (l *limitListener) release(c *limitConn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.releaseLocked(c)
}

func (l *limitListener) releaseLocked(c *limitConn) {
	cs := l.open[c.src]
	for i, o := range cs {
		if o == c {
			cs = append(cs[:i:i], cs[i+1:]...)
			l.n--
			break
		}
	}
	if len(cs) == 0 {
		delete(l.open, c.src)
	} else {
		l.open[c.src] = cs
	}
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
	c.once.Do(func() { c.l.release(c) })
	return err
}
