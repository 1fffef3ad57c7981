package scheduler

import (
	"testing"

	"go.uber.org/goleak"
)

// Every test must leave no goroutine behind: servers stop raft, group
// commit, leadership watchers and streams on Close.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// hashicorp/raft's NetworkTransport.Close closes its listener but
		// not connections peers opened to it; their readers end only when
		// the peer closes its side, which may be after the last test.
		goleak.IgnoreAnyFunction("github.com/hashicorp/raft.(*NetworkTransport).handleConn"),
	)
}
