package guest

import (
	"encoding/binary"
	"io"
)

// yamux's frame header (github.com/hashicorp/yamux, protocol version 0):
// version, type, flags (2), stream id (4), length (4).
const (
	yamuxHeaderSize = 12
	yamuxTypeData   = 0
	// frameConnMax bounds the frames merged, and so the buffer each
	// connection keeps: calls' requests and answers are smaller; bulk
	// data (file transfers, long output) gains nothing from the merge.
	frameConnMax = 4 << 10
)

// frameConn sends each yamux data frame's header and body in one write.
//
// yamux's send loop writes a frame's 12-byte header and then its body in
// two calls. On a virtio-serial port each write is its own transfer: a
// syscall and a virtqueue notification on the sending side, an interrupt
// and a wakeup on the receiving side, all of it emulated under TCG. Every
// call answers with at least one data frame, so holding a data frame's
// header until its body follows saves one transfer per frame each way.
//
// Only the header of a data frame of at most frameConnMax bytes with a
// non-empty body is held: its body is the send loop's very next write.
// Other frames (window updates, pings, a stream's close, which carry no
// body) and larger data frames are written as yamux writes them. Writes
// must come from one goroutine, as yamux's send loop is.
type frameConn struct {
	io.ReadWriteCloser
	hdr  [yamuxHeaderSize]byte
	held bool
	buf  []byte
}

func newFrameConn(c io.ReadWriteCloser) *frameConn {
	return &frameConn{ReadWriteCloser: c, buf: make([]byte, 0, frameConnMax)}
}

func (c *frameConn) Write(p []byte) (int, error) {
	if c.held {
		c.held = false
		c.buf = append(append(c.buf[:0], c.hdr[:]...), p...)
		n, err := c.ReadWriteCloser.Write(c.buf)
		return max(n-yamuxHeaderSize, 0), err
	}
	if len(p) == yamuxHeaderSize && p[1] == yamuxTypeData {
		if n := binary.BigEndian.Uint32(p[8:]); n > 0 && n <= frameConnMax-yamuxHeaderSize {
			copy(c.hdr[:], p)
			c.held = true
			return len(p), nil
		}
	}
	return c.ReadWriteCloser.Write(p)
}
