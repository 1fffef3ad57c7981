package guest

import (
	"encoding/binary"
	"fmt"
	"io"
	"sync"
	"sync/atomic"

	"github.com/hashicorp/yamux"
)

// yamux's frame header (its spec.md): version (1 byte), type (1), flags
// (2), stream id (4), length (4), big endian. Only a data frame has a
// payload, of length bytes; in the others length is a window delta, a ping
// id or a go-away code.
const (
	yamuxHeaderSize = 12
	yamuxVersion    = 0
	yamuxTypeData   = 0
	yamuxTypeWindow = 1
	yamuxTypePing   = 2
	yamuxTypeGoAway = 3
	yamuxFlagSYN    = 1
	yamuxFlagRST    = 8
)

// guardConn is the host's end of a guest connection, read through a check
// of each yamux frame's header. The guest is not trusted, and yamux v0.1
// believes it: it answers every ping from a goroutine of its own that
// waits up to ConnectionWriteTimeout to write (a guest that sends pings
// and reads nothing grows the host's goroutines without bound), and it
// takes every stream the guest opens into an accept backlog, a receive
// window of data each, that the host never accepts. Neither is ever
// legitimate here: keepalives are off at both ends and only the host opens
// streams. So the read that would complete such a frame's header fails
// instead, before yamux sees the frame, and yamux ends the session.
//
// It also resets the streams the host is done with (drop). yamux v0.1 has
// no call for it, and keeps a stream the host closed until the guest
// closes it too, or for StreamCloseTimeout, with up to a window (256 KiB)
// of what the guest keeps sending on it: a guest that never closed its
// end of a call's stream grew the host's memory call after call. So at
// the next frame boundary of what it reads, the guard hands the host's
// yamux a reset of each such stream, as if the guest had sent it (yamux
// forgets the stream and discards what comes for it after); and at the
// next frame boundary of what the host writes (the stream's own close, as
// a rule) it sends the guest one too, as yamux did at StreamCloseTimeout,
// so an agent waiting to write on the stream stops.
type guardConn struct {
	io.ReadWriteCloser
	in  frames // what the guest sent (yamux's receive loop)
	out frames // what the host sends (yamux's send loop)
	err error  // the frame that ended the session; every Read returns it

	mu      sync.Mutex
	inRST   []byte      // resets to hand the host's yamux at the next boundary of in
	outRST  []byte      // resets to send the guest at the next boundary of out
	pending atomic.Bool // inRST is not empty
}

// frames follows the frame boundaries of one direction of a session.
type frames struct {
	hdr  [yamuxHeaderSize]byte
	n    int    // bytes of hdr read so far
	skip uint32 // bytes of the current data frame's payload still to come
}

// boundary reports whether the bytes so far end a frame.
func (f *frames) boundary() bool { return f.n == 0 && f.skip == 0 }

// rest is how many bytes are left of the current frame's header or
// payload (0 at a boundary).
func (f *frames) rest() int {
	if f.n > 0 {
		return yamuxHeaderSize - f.n
	}
	return int(f.skip)
}

// feed follows b, checking each whole header with check (nil: none).
func (f *frames) feed(b []byte, check func([yamuxHeaderSize]byte) error) error {
	for len(b) > 0 {
		if f.skip > 0 {
			k := min(uint32(len(b)), f.skip)
			f.skip -= k
			b = b[k:]
			continue
		}
		k := copy(f.hdr[f.n:], b)
		f.n += k
		b = b[k:]
		if f.n < yamuxHeaderSize {
			break
		}
		f.n = 0
		if check != nil {
			if err := check(f.hdr); err != nil {
				return err
			}
		}
		if f.hdr[1] == yamuxTypeData {
			f.skip = binary.BigEndian.Uint32(f.hdr[8:])
		}
	}
	return nil
}

// rstFrame is a yamux reset of stream id.
func rstFrame(id uint32) []byte {
	h := make([]byte, yamuxHeaderSize)
	h[0], h[1] = yamuxVersion, yamuxTypeWindow
	binary.BigEndian.PutUint16(h[2:], yamuxFlagRST)
	binary.BigEndian.PutUint32(h[4:], id)
	return h
}

// drop closes st, which the host is done with, and resets it at both
// ends. The guest's reset goes right behind the stream's FIN, which the
// close writes (if the stream was closed already, behind the next frame
// the host sends); the host's, once the close is sent, so yamux does not
// see the stream reset before it closes it (which would then send no
// FIN). Safe for concurrent use.
func (g *guardConn) drop(st *yamux.Stream) {
	rst := rstFrame(st.StreamID())
	g.mu.Lock()
	g.outRST = append(g.outRST, rst...)
	g.mu.Unlock()
	st.Close()
	g.mu.Lock()
	g.inRST = append(g.inRST, rst...)
	g.pending.Store(true)
	g.mu.Unlock()
}

func (g *guardConn) Read(p []byte) (int, error) {
	if g.err != nil {
		return 0, g.err
	}
	if g.pending.Load() {
		if g.in.boundary() {
			g.mu.Lock()
			k := copy(p, g.inRST)
			if g.inRST = g.inRST[k:]; len(g.inRST) == 0 {
				g.inRST = nil
				g.pending.Store(false)
			}
			g.mu.Unlock()
			if k > 0 {
				return k, nil
			}
		} else {
			p = p[:min(len(p), g.in.rest())] // so the resets go in at the frame's end
		}
	}
	n, err := g.ReadWriteCloser.Read(p)
	if g.err = g.in.feed(p[:n], checkGuestFrame); g.err != nil {
		return 0, g.err
	}
	return n, err
}

// Write writes what the host's yamux sends (from its one send loop), then,
// at a frame boundary, the guest's resets of the streams dropped.
func (g *guardConn) Write(p []byte) (int, error) {
	n, err := g.ReadWriteCloser.Write(p)
	_ = g.out.feed(p[:n], nil)
	if err != nil || !g.out.boundary() {
		return n, err
	}
	g.mu.Lock()
	rst := g.outRST
	g.outRST = nil
	g.mu.Unlock()
	if len(rst) > 0 {
		if _, err := g.ReadWriteCloser.Write(rst); err != nil {
			return n, err
		}
	}
	return n, nil
}

// checkGuestFrame refuses a frame header the guest has no reason to send.
// Unknown versions and types are refused too: past one, the payloads could
// no longer be told from the headers (yamux refuses them as well).
func checkGuestFrame(h [yamuxHeaderSize]byte) error {
	typ, flags, id := h[1], binary.BigEndian.Uint16(h[2:]), binary.BigEndian.Uint32(h[4:])
	switch {
	case h[0] != yamuxVersion:
		return fmt.Errorf("guest: yamux frame of version %d", h[0])
	case typ > yamuxTypeGoAway:
		return fmt.Errorf("guest: yamux frame of unknown type %d", typ)
	case typ == yamuxTypePing:
		return fmt.Errorf("guest: sent a yamux ping (keepalives are off at both ends)")
	case typ != yamuxTypeGoAway && flags&yamuxFlagSYN != 0:
		return fmt.Errorf("guest: opened stream %d (only the host opens streams)", id)
	}
	return nil
}
