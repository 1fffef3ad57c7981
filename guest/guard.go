package guest

import (
	"encoding/binary"
	"fmt"
	"io"
)

// yamux's frame header (its spec.md): version (1 byte), type (1), flags
// (2), stream id (4), length (4), big endian. Only a data frame has a
// payload, of length bytes; in the others length is a window delta, a ping
// id or a go-away code.
const (
	yamuxHeaderSize = 12
	yamuxVersion    = 0
	yamuxTypeData   = 0
	yamuxTypePing   = 2
	yamuxTypeGoAway = 3
	yamuxFlagSYN    = 1
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
type guardConn struct {
	io.ReadWriteCloser
	hdr  [yamuxHeaderSize]byte
	n    int    // bytes of hdr read so far
	skip uint32 // bytes of the current data frame's payload still to come
	err  error  // the frame that ended the session; every Read returns it
}

func (g *guardConn) Read(p []byte) (int, error) {
	if g.err != nil {
		return 0, g.err
	}
	n, err := g.ReadWriteCloser.Read(p)
	for b := p[:n]; len(b) > 0; {
		if g.skip > 0 {
			k := min(uint32(len(b)), g.skip)
			g.skip -= k
			b = b[k:]
			continue
		}
		k := copy(g.hdr[g.n:], b)
		g.n += k
		b = b[k:]
		if g.n < yamuxHeaderSize {
			break
		}
		g.n = 0
		if g.err = checkGuestFrame(g.hdr); g.err != nil {
			return 0, g.err
		}
		if g.hdr[1] == yamuxTypeData {
			g.skip = binary.BigEndian.Uint32(g.hdr[8:])
		}
	}
	return n, err
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
