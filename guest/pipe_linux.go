package guest

import (
	"os"

	"golang.org/x/sys/unix"
)

// pipeBuffered is how many bytes pipe f holds unread (TIOCINQ is Linux's
// FIONREAD), or 1 MiB, the most an unprivileged command can make a pipe
// hold, if that cannot be read. Not through f.Fd(), which would make f
// blocking and its deadlines void.
func pipeBuffered(f *os.File) int64 {
	n := int64(1 << 20)
	if rc, err := f.SyscallConn(); err == nil {
		_ = rc.Control(func(fd uintptr) {
			if v, err := unix.IoctlGetInt(int(fd), unix.TIOCINQ); err == nil && v >= 0 {
				n = int64(v)
			}
		})
	}
	return n
}
