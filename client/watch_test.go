package client_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
	"github.com/warrenhq/warren/client"
)

// A watch from a seq above 0 of a task no server knows (a mistyped id)
// ends with not_found after a few seconds of asking; it retried forever,
// taking it for a lagging server.
func TestWatchOfAMissingTaskEnds(t *testing.T) {
	c := devClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	retries := 0
	err := c.Watch(ctx, "01J00000000000000000000000", 3, func(*warrenv1.Event) error { return nil }, func(error) { retries++ })
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("watch of a missing task after seq 3: %v after %d reconnects, want not_found", err, retries)
	}
}

// Watch's onRetry sees c.URL() as the server it reconnects to (warren
// task watch names it), not the one that just failed.
func TestWatchRetryNamesTheNextServer(t *testing.T) {
	var mu sync.Mutex
	var hits []string
	mk := func(name string) *httptest.Server {
		return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			hits = append(hits, name)
			mu.Unlock()
			http.Error(w, "down", http.StatusServiceUnavailable)
		}))
	}
	a, b := mk("a"), mk("b")
	defer a.Close()
	defer b.Close()
	c, err := client.New(a.URL + "," + b.URL)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 250*time.Millisecond)
	defer cancel()
	var named []string
	_ = c.Watch(ctx, "01J00000000000000000000000", 0, func(*warrenv1.Event) error { return nil }, func(error) {
		named = append(named, c.URL())
	})
	mu.Lock()
	defer mu.Unlock()
	if len(named) == 0 || len(hits) < 2 {
		t.Fatalf("named %v, hits %v", named, hits)
	}
	if named[0] != b.URL {
		t.Errorf("after server a (%s) failed, onRetry named %s as the server to reconnect to; the next attempt went to %s (%v)", a.URL, named[0], hits[1], hits)
	}
}
