package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// lockData takes the node's lock on its data directory (DATA/node.lock,
// made if missing), held until the process exits or release: a second
// node on the same directory would take the first one's sandboxes for
// leftovers of a crash and destroy them, live. It says which process holds
// it when it is taken.
func lockData(dir string) (release func(), err error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("data: %w", err)
	}
	path := filepath.Join(dir, "node.lock")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("data: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		holder, _ := os.ReadFile(path)
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			who := ""
			if pid, perr := strconv.Atoi(string(holder)); perr == nil && pid > 0 {
				who = fmt.Sprintf(" (process %d)", pid)
			}
			return nil, fmt.Errorf("data: %s is in use by another warren node%s; give each node its own --data", dir, who)
		}
		return nil, fmt.Errorf("data: lock %s: %w", path, err)
	}
	_ = f.Truncate(0)
	_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())), 0)
	return func() { f.Close() }, nil
}
