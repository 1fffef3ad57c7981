package scheduler

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"connectrpc.com/connect"

	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
)

// A follower that lacks a task and cannot reach a leader to confirm the
// cluster lacks it too answers unavailable, which clients retry, not
// not_found, which a watch takes as final. Here the follower was down
// while the task was created, and comes back alone.
func TestAFollowerWithoutALeaderIsNotSureATaskIsMissing(t *testing.T) {
	nodes := startCluster(t, 0)
	f := followerOf(nodes)
	dir, id := filepath.Dir(f.srv.cfg.DataDir), f.srv.ID()
	f.stop()
	var rest []*node
	for _, n := range nodes {
		if n != f {
			rest = append(rest, n)
		}
	}
	var task *warrenv1.Task
	waitFor(t, "a leader among the other two", 10*time.Second, func() bool { return leaderOf(rest) != nil })
	task = createVia(t, leaderOf(rest), 1)
	for _, n := range rest {
		n.stop()
	}
	back := startNode(t, dir, id, false, "", 0)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := back.tasks.GetTask(ctx, connect.NewRequest(&warrenv1.GetTaskRequest{Id: task.GetId()}))
	if connect.CodeOf(err) != connect.CodeUnavailable {
		t.Fatalf("GetTask of a task created while this follower was down, with no leader: %v, want unavailable", err)
	}
}
