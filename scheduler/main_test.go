package scheduler

import (
	"testing"

	"go.uber.org/goleak"
)

// raftLeaks are the goroutines hashicorp/raft itself may leave after a
// clean Shutdown; every other goroutine must be gone.
var raftLeaks = []goleak.Option{
	// NetworkTransport.Close closes its listener but not connections peers
	// opened to it; their readers end only when the peer closes its side,
	// which may be after the last test.
	goleak.IgnoreAnyFunction("github.com/hashicorp/raft.(*NetworkTransport).handleConn"),
	// A future whose entry committed just as raft shut down is never
	// answered: runFSM returns on shutdown with the entry still queued for
	// it, and Apply and Barrier futures do not watch for shutdown
	// (hashicorp/raft#498, open). Whoever waits on it (a group-commit batch,
	// a new leader's barrier) waits forever. Only raft's wait is ignored
	// here: a server left running still shows as raft's own goroutines.
	goleak.IgnoreTopFunction("github.com/hashicorp/raft.(*deferError).Error"),
}

// Every test must leave no goroutine behind: servers stop raft, group
// commit, leadership watchers and streams on Close.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, raftLeaks...)
}
