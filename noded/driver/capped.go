package driver

import (
	"fmt"
	"os"
)

// CappedOutput is an io.Writer that keeps at most about max bytes of what
// is written to it: the first quarter and the last three quarters, with how
// much was left out between them. A command's output is collected in one
// on the node, which must not hold what a command prints for its whole
// timeout (`yes` for an hour). Not safe for concurrent use; give stdout
// and stderr one each, or one for both (the guest client writes them from
// one goroutine).
type CappedOutput struct {
	max     int
	head    []byte
	tail    []byte // the last bytes written after head filled, up to 2× its share
	dropped int64
}

// NewCappedOutput returns a CappedOutput that keeps about max bytes.
func NewCappedOutput(max int) *CappedOutput { return &CappedOutput{max: max} }

// Write keeps what fits and always succeeds.
func (c *CappedOutput) Write(p []byte) (int, error) {
	n := len(p)
	if room := c.max/4 - len(c.head); room > 0 {
		k := min(room, len(p))
		c.head = append(c.head, p[:k]...)
		p = p[k:]
	}
	keep := c.max - c.max/4
	if len(p) >= keep {
		c.dropped += int64(len(c.tail) + len(p) - keep)
		c.tail = append(c.tail[:0], p[len(p)-keep:]...)
		return n, nil
	}
	c.tail = append(c.tail, p...)
	if len(c.tail) > 2*keep { // shift once in a while: amortized O(1) a byte
		cut := len(c.tail) - keep
		c.dropped += int64(cut)
		c.tail = append(c.tail[:0], c.tail[cut:]...)
	}
	return n, nil
}

// Len is how many bytes were written in all.
func (c *CappedOutput) Len() int64 {
	return int64(len(c.head)+len(c.tail)) + c.dropped
}

// Dropped is how many bytes were left out.
func (c *CappedOutput) Dropped() int64 {
	if keep := c.max - c.max/4; len(c.tail) > keep {
		return c.dropped + int64(len(c.tail)-keep)
	}
	return c.dropped
}

// Bytes returns what was kept: all of it, or the head, a line saying how
// much was left out, and the tail.
func (c *CappedOutput) Bytes() []byte {
	tail := c.tail
	if keep := c.max - c.max/4; len(tail) > keep {
		tail = tail[len(tail)-keep:]
	}
	out := append([]byte(nil), c.head...)
	if d := c.Dropped(); d > 0 {
		out = fmt.Appendf(out, "\n[... %d bytes of output left out ...]\n", d)
	}
	return append(out, tail...)
}

// ReadEnd returns the last n bytes of a file (nil if it cannot be read).
func ReadEnd(name string, n int64) []byte {
	f, err := os.Open(name)
	if err != nil {
		return nil
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil
	}
	off := max(st.Size()-n, 0)
	b := make([]byte, st.Size()-off)
	k, _ := f.ReadAt(b, off)
	return b[:k]
}
