package scheduler

import (
	"context"
	"errors"
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

// A forward that runs out of its own time is retried by the batch's
// callers; before, its deadline_exceeded failed them all at once.
func TestAForwardOutOfItsOwnTimeIsRetried(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	<-ctx.Done()
	err := forwardFailure(ctx, connect.NewError(connect.CodeDeadlineExceeded, context.DeadlineExceeded))
	if !retryable(err) {
		t.Fatalf("a forward past its own deadline: %v is not retried", err)
	}
	live := context.Background()
	if err := forwardFailure(live, connect.NewError(connect.CodeInvalidArgument, errors.New("bad"))); retryable(err) {
		t.Fatalf("a refusal is retried: %v", err)
	}
}
