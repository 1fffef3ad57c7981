package image

import (
	"fmt"
	"io"
	"strings"
)

// cpioWriter writes the "newc" format the kernel unpacks as an initramfs.
// It is a few dozen lines; the format is fixed since 2.6 (see the kernel's
// Documentation/driver-api/early-userspace/buffer-format.rst).
type cpioWriter struct {
	w   io.Writer
	ino int
	n   int64
	err error
}

const (
	cpioDir  = 0o040000
	cpioFile = 0o100000
	cpioChr  = 0o020000
)

func (c *cpioWriter) write(p []byte) {
	if c.err != nil {
		return
	}
	n, err := c.w.Write(p)
	c.n += int64(n)
	c.err = err
}

func (c *cpioWriter) pad() {
	if r := c.n % 4; r != 0 {
		c.write(make([]byte, 4-r))
	}
}

func (c *cpioWriter) entry(name string, mode uint32, data []byte, rdevMajor, rdevMinor int) {
	c.ino++
	name = strings.TrimPrefix(name, "/")
	nlink := 1
	if mode&cpioDir != 0 {
		nlink = 2
	}
	hdr := fmt.Sprintf("070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
		c.ino, mode, 0, 0, nlink, 0, len(data), 0, 0, rdevMajor, rdevMinor, len(name)+1, 0)
	c.write([]byte(hdr))
	c.write(append([]byte(name), 0))
	c.pad()
	c.write(data)
	c.pad()
}

// Dir adds a directory (parents first is the caller's job).
func (c *cpioWriter) Dir(name string) { c.entry(name, cpioDir|0o755, nil, 0, 0) }

// File adds a regular file.
func (c *cpioWriter) File(name string, perm uint32, data []byte) {
	c.entry(name, cpioFile|perm, data, 0, 0)
}

// Char adds a character device node.
func (c *cpioWriter) Char(name string, major, minor int) {
	c.entry(name, cpioChr|0o600, nil, major, minor)
}

// Close writes the trailer.
func (c *cpioWriter) Close() error {
	c.ino = 0
	c.entry("TRAILER!!!", 0, nil, 0, 0)
	return c.err
}
