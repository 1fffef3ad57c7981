package scheduler

import (
	"context"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
)

// A follower cut off from the leader ends its streams: it applies nothing
// more, so a stream there waited, silent, while the task went on
// elsewhere, and the client never moved to another server.
func TestAStreamOnACutOffFollowerEnds(t *testing.T) {
	old := streamLeaderSilence
	streamLeaderSilence = time.Second
	t.Cleanup(func() { streamLeaderSilence = old })
	nodes := startCluster(t, 0)
	f := followerOf(nodes)
	task := createVia(t, f, 1)
	waitFor(t, "the follower to have the task", 10*time.Second, func() bool { _, err := f.srv.FSM().Task(task.GetId()); return err == nil })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := f.tasks.StreamEvents(ctx, connect.NewRequest(&warrenv1.StreamEventsRequest{TaskId: task.GetId()}))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for _, n := range nodes {
		if n != f {
			n.stop()
		}
	}
	start := time.Now()
	for st.Receive() {
	}
	if connect.CodeOf(st.Err()) != connect.CodeUnavailable || !strings.Contains(st.Err().Error(), "has not heard from a leader") {
		t.Fatalf("the stream ended with %v after %v, want unavailable naming the silence", st.Err(), time.Since(start))
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("the stream ended %v after the others stopped", took)
	}
}
