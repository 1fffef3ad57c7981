package api

import (
	"context"
	"fmt"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sync/semaphore"
)

// BulkGateBytes is how many bytes of files and stdin a node's or a
// server's sandbox API holds for its calls at once by default: each
// ReadFile holds up to MaxSandboxFileBytes, a WriteFile its data, an Exec
// its stdin. Without a bound, 100 concurrent ReadFiles of a 32 MiB file
// (requests of 70 bytes each) held several GB on the node and again on
// the server that forwarded them.
const BulkGateBytes = 512 << 20

// BulkGateWait is how long a call waits for room in a BulkGate before it
// is refused with resource_exhausted (which clients retry).
const BulkGateWait = 30 * time.Second

// BulkGate bounds the bytes of file data and stdin the calls of a sandbox
// API hold at once. Calls wait in turn for room, up to their deadline or
// the gate's wait.
type BulkGate struct {
	sem   *semaphore.Weighted
	total int64
	wait  time.Duration
}

// NewBulkGate is a gate of total bytes whose calls wait at most wait.
func NewBulkGate(total int64, wait time.Duration) *BulkGate {
	return &BulkGate{sem: semaphore.NewWeighted(total), total: total, wait: wait}
}

// Take reserves n bytes for a call (what names it, for the error) and
// returns the release. A call of more than the gate holds takes all of it.
func (g *BulkGate) Take(ctx context.Context, what string, n int64) (release func(), err error) {
	n = min(max(n, 1), g.total)
	wctx, cancel := context.WithTimeout(ctx, g.wait)
	defer cancel()
	if err := g.sem.Acquire(wctx, n); err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("%s: other calls hold all %d MiB of file and stdin data this API holds at once, and none ended within %v; try again",
			what, g.total>>20, g.wait))
	}
	return func() { g.sem.Release(n) }, nil
}
