package container

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/warrenhq/warren/noded/driver"
)

// silentAgent writes an agent that never answers (its container runs on)
// and returns its path.
func silentAgent(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "silent-agent")
	if err := os.WriteFile(p, []byte("#!/bin/sh\nexec sleep 3600\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// A claim whose agent does not answer within the node's own bound, for a
// caller with no deadline, is "unavailable", not the caller's "deadline
// exceeded" (which tells a client to retry with a longer one).
func TestAnAgentThatDoesNotAnswerIsUnavailable(t *testing.T) {
	d := newDriverAgent(t, "runc", silentAgent(t))
	defer d.Close()
	old := agentWait
	agentWait = 2 * time.Second
	t.Cleanup(func() { agentWait = old })
	_, err := d.Claim(context.Background(), driver.ClaimRequest{ID: "sb-silent"})
	if err == nil {
		t.Fatal("the claim of an agent that never answers succeeded")
	}
	if errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, driver.ErrUnavailable) {
		t.Errorf("the claim's error %v: want unavailable, not deadline exceeded", err)
	}
}
