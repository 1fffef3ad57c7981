package guest

import (
	"os"

	"golang.org/x/sys/unix"
)

// pipeSize is the capacity of pipe f (1 MiB, the most an unprivileged
// command may set, if it cannot be read). Not through f.Fd(), which would
// make f blocking and its deadlines void.
func pipeSize(f *os.File) int {
	n := 1 << 20
	if rc, err := f.SyscallConn(); err == nil {
		_ = rc.Control(func(fd uintptr) {
			if v, err := unix.FcntlInt(fd, unix.F_GETPIPE_SZ, 0); err == nil && v > 0 {
				n = v
			}
		})
	}
	return n
}
