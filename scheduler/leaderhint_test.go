package scheduler

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/warrenhq/warren/api"
	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
	"github.com/warrenhq/warren/client"
	"github.com/warrenhq/warren/internal/freeaddr"
)

// batchCounter counts AppendEventsBatch calls per server host.
type batchCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *batchCounter) RoundTrip(r *http.Request) (*http.Response, error) {
	if strings.HasSuffix(r.URL.Path, "/AppendEventsBatch") {
		c.mu.Lock()
		c.n[r.URL.Host]++
		c.mu.Unlock()
	}
	return http.DefaultTransport.RoundTrip(r)
}

func (c *batchCounter) take() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.n
	c.n = map[string]int{}
	return n
}

func host(url string) string { return strings.TrimPrefix(url, "http://") }

func TestAppendsFollowTheLeaderAFollowerNames(t *testing.T) {
	nodes := startCluster(t, 0)
	leader, follower := leaderOf(nodes), followerOf(nodes)
	var other *node
	for _, n := range nodes {
		if n != leader && n != follower {
			other = n
		}
	}
	task := createVia(t, leader, 1)
	ctx := context.Background()
	ev := []*warrenv1.EventInput{{Kind: "log", Payload: []byte(`{}`)}}

	// A follower names the leader on an append it forwarded; the leader
	// names nobody.
	for _, c := range []struct {
		via  *node
		want string
	}{{follower, leader.url}, {leader, ""}} {
		resp, err := c.via.tasks.AppendEvents(ctx, connect.NewRequest(&warrenv1.AppendEventsRequest{TaskId: task.GetId(), Events: ev}))
		if err != nil {
			t.Fatal(err)
		}
		if got := resp.Header().Get(api.LeaderHeader); got != c.want {
			t.Fatalf("append via %s: %s is %q, want %q", c.via.srv.ID(), api.LeaderHeader, got, c.want)
		}
	}

	// A client's Appender starts on the follower and moves to the leader
	// after its first call.
	counter := &batchCounter{n: map[string]int{}}
	cl, err := client.NewWith(strings.Join([]string{follower.url, leader.url, other.url}, ","), &http.Client{Transport: counter})
	if err != nil {
		t.Fatal(err)
	}
	app := cl.NewAppender(1, 16)
	defer app.Close()
	appendOnce := func() {
		t.Helper()
		if _, err := app.Append(ctx, &warrenv1.AppendEventsRequest{TaskId: task.GetId(), Events: ev}); err != nil {
			t.Fatal(err)
		}
	}
	for range 5 {
		appendOnce()
	}
	if got := counter.take(); got[host(follower.url)] != 1 || got[host(leader.url)] != 4 {
		t.Fatalf("calls per server %v: want 1 on the follower %s, then 4 on the leader %s", got, host(follower.url), host(leader.url))
	}

	// When the leader goes, the Appender forgets it, and follows the new one
	// once a server names it.
	leader.stop()
	appendOnce() // retried until a new leader commits it
	waitFor(t, "a new leader", 10*time.Second, func() bool {
		l := leaderOf([]*node{follower, other})
		return l != nil && l.srv.Status().GetLeaderApiUrl() == l.url
	})
	for range 3 {
		appendOnce()
	}
	counter.take()
	for range 3 {
		appendOnce()
	}
	newLeader := leaderOf([]*node{follower, other})
	if got := counter.take(); got[host(newLeader.url)] != 3 {
		t.Fatalf("calls per server %v after the leader stopped: want all 3 on the new leader %s", got, host(newLeader.url))
	}
}

// A server on an empty data directory with neither --bootstrap nor --join
// is refused at start: it waited, no member, for a leader that never
// came, with raft's "no known peers" its only word.
func TestAServerWithNoClusterToStartOrJoinIsRefused(t *testing.T) {
	dir := t.TempDir()
	_, err := Open(Config{ID: "lone", DataDir: dir, RaftAddr: freeaddr.Loopback(t), APIURL: "http://127.0.0.1:1", RaftLevel: "error"})
	if err == nil || !strings.Contains(err.Error(), "holds no cluster state: give --bootstrap") {
		t.Fatalf("Open: %v", err)
	}
}
