package client_test

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"

	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
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
