package guest

import (
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// hostPort is the agent's virtio-serial port, held open from one host
// connection to the next.
//
// The port is one byte stream for every host that connects to it. The guest
// learns of a host only through the port's state: with no host connected, a
// read with nothing buffered returns end of file and poll reports POLLHUP;
// a host's connection or hang-up wakes the port's pollers. Closing the port
// discards what a host sent that the guest has not read. An agent that
// closed its port after each session and opened it again to wait for the
// next host therefore lost the first calls of a host that connected between
// the end of file and the close, and that host waited for answers that never
// came (a restored clone then fell back to a cold boot after a minute).
//
// So the port stays open. A session that ended at end of file has read
// every byte its host sent, so whatever arrives after it belongs to the next
// host, and the next session reads it from the same descriptor. Only a
// session that ended any other way (a broken stream, a write under way when
// it ended) closes the port, to drop what is left of its stream.
type hostPort struct {
	dev string
	f   *os.File
	ep  int // an epoll instance watching f, edge-triggered: see waitHost
	// empty is set when the last session read nothing at all: no host
	// was connected, so the next one must wait for a host to connect.
	empty bool
}

// openPort opens the port device dev.
func openPort(dev string) (*hostPort, error) {
	p := &hostPort{dev: dev, ep: -1}
	if err := p.open(); err != nil {
		return nil, err
	}
	return p, nil
}

func (p *hostPort) open() error {
	f, err := os.OpenFile(p.dev, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		f.Close()
		return err
	}
	err = control(f, func(fd int) error {
		return unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, fd, &unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLHUP | unix.EPOLLET, Fd: int32(fd)})
	})
	if err != nil {
		unix.Close(ep)
		f.Close()
		return err
	}
	p.f, p.ep, p.empty = f, ep, false
	return nil
}

// reopen closes the port, dropping what is buffered in it, and opens it
// again, retrying until it can.
func (p *hostPort) reopen() {
	p.close()
	for p.open() != nil {
		time.Sleep(10 * time.Millisecond)
	}
}

func (p *hostPort) close() {
	if p.ep >= 0 {
		unix.Close(p.ep)
		p.ep = -1
	}
	if p.f != nil {
		p.f.Close()
		p.f = nil
	}
}

// control runs fn on f's descriptor without taking it out of Go's poller
// (os.File.Fd would make it blocking).
func control(f *os.File, fn func(fd int) error) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	if err := rc.Control(func(fd uintptr) { ferr = fn(int(fd)) }); err != nil {
		return err
	}
	return ferr
}

// hostConnected reports whether a host is connected to the port.
func (p *hostPort) hostConnected() bool {
	var ev int16
	_ = control(p.f, func(fd int) error {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		if n, err := unix.Poll(fds, 0); err == nil && n > 0 {
			ev = fds[0].Revents
		}
		return nil
	})
	return ev&unix.POLLHUP == 0
}

// hostWaitPoll bounds one wait for a host's connection, in case a wake-up
// is missed.
const hostWaitPoll = time.Second

// waitHost returns when the next session has something to read: at once
// if the last session read anything (more of what the host sent may be
// buffered), otherwise once a host is connected. A host's connection wakes
// the port's pollers; the epoll instance is edge-triggered and was
// registered before any check, so a connection between the check and the
// wait still ends the wait.
func (p *hostPort) waitHost() {
	if !p.empty {
		return
	}
	evs := make([]unix.EpollEvent, 1)
	for !p.hostConnected() {
		if _, err := unix.EpollWait(p.ep, evs, int(hostWaitPoll/time.Millisecond)); err != nil && !errors.Is(err, unix.EINTR) {
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// serve runs sessions on the port forever.
func (p *hostPort) serve(srv *Server) {
	for {
		p.waitHost()
		c := &portConn{f: p.f}
		_ = srv.Serve(c)
		if !c.kept() {
			p.reopen()
			continue
		}
		p.empty = c.n == 0
	}
}

// portConn is one host session's view of the port. Its Close keeps the
// port open when the session ended cleanly at end of file (see hostPort).
type portConn struct {
	f *os.File

	mu      sync.Mutex
	n       int64 // bytes read
	eof     bool  // a read returned end of file: the host is gone and nothing of its stream is left
	writing int   // writes under way
	ended   bool  // Close was called
	closed  bool  // Close closed the port
}

func (c *portConn) Read(b []byte) (int, error) {
	n, err := c.f.Read(b)
	c.mu.Lock()
	c.n += int64(n)
	if err == io.EOF {
		c.eof = true
	}
	c.mu.Unlock()
	return n, err
}

// Write writes to the port unless the session has ended. A write under
// way when the session ends is cut off by closing the port: a write with
// no host connected waits for the next host, and would reach it as the
// start of its stream.
func (c *portConn) Write(b []byte) (int, error) {
	c.mu.Lock()
	if c.ended {
		c.mu.Unlock()
		return 0, net.ErrClosed
	}
	c.writing++
	c.mu.Unlock()
	n, err := c.f.Write(b)
	c.mu.Lock()
	c.writing--
	c.mu.Unlock()
	return n, err
}

// Close ends the session. It keeps the port open if the session read end
// of file and no write is under way; otherwise it closes the port (which
// ends any read or write under way).
func (c *portConn) Close() error {
	c.mu.Lock()
	if c.ended {
		c.mu.Unlock()
		return nil
	}
	c.ended = true
	if c.eof && c.writing == 0 {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	c.mu.Unlock()
	return c.f.Close()
}

// kept reports whether Close left the port open for the next session.
func (c *portConn) kept() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ended && !c.closed
}
