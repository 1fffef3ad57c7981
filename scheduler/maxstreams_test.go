package scheduler

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
)

// A server serves at most Config.MaxStreams event streams at once,
// StreamEvents and SSE together; past it a new one is refused as
// unavailable (503 for SSE), naming the limit, and a slot frees when a
// stream ends. Before, nothing bounded them: each holds a goroutine, a
// watch and a connection, so enough clients could exhaust the server.
func TestAServerServesAtMostMaxStreams(t *testing.T) {
	n := startNode(t, t.TempDir(), "s1", true, "", 0, func(c *Config) { c.MaxStreams = 2 })
	waitFor(t, "s1 to lead", 10*time.Second, func() bool { return leaderOf([]*node{n}) != nil })
	task := createVia(t, n, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	open := func() *connect.ServerStreamForClient[warrenv1.StreamEventsResponse] {
		t.Helper()
		st, err := n.tasks.StreamEvents(ctx, connect.NewRequest(&warrenv1.StreamEventsRequest{TaskId: task.GetId()}))
		if err != nil {
			t.Fatal(err)
		}
		if !st.Receive() { // task_created: the stream is being served
			t.Fatalf("a stream within the limit: %v", st.Err())
		}
		return st
	}
	first, second := open(), open()
	defer second.Close()
	third, err := n.tasks.StreamEvents(ctx, connect.NewRequest(&warrenv1.StreamEventsRequest{TaskId: task.GetId()}))
	if err == nil {
		for third.Receive() {
		}
		err = third.Err()
	}
	if connect.CodeOf(err) != connect.CodeUnavailable || !strings.Contains(err.Error(), "--max-streams") {
		t.Fatalf("a third stream: %v, want unavailable naming the limit", err)
	}
	resp, err := http.Get(n.url + "/v1/tasks/" + task.GetId() + "/events")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("an SSE stream over the limit: %s, want 503", resp.Status)
	}
	first.Close()
	waitFor(t, "the closed stream's slot to free", 10*time.Second, func() bool { return n.srv.streams.Load() < 2 })
	open().Close()
}
