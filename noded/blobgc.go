package noded

import (
	"context"
	"log/slog"
	"path/filepath"
	"time"

	"github.com/warrenhq/warren/actor"
	"github.com/warrenhq/warren/agent"
)

// The node's blob store (agent.DirBlobs) keeps the full outputs of tool
// calls whose events hold a truncated view; nothing on the node reads them
// back (a resumed task replays its events, not its blobs): they are for a
// person looking into a task. A blob's mtime is when a task last wrote it
// (Put refreshes a blob it reuses), so sweeping those older than
// blobRetain removes only what no task has written for that long.
const (
	// blobRetain is how long a blob is kept after it was last written:
	// a week, for people to look into finished tasks, and well past the
	// longest a task runs in one sandbox on a node (driver.MaxTTL, a day,
	// which bounds a sandbox claimed for a task with a longer wall-clock
	// budget or none, plus the approval grace). A task whose wall clock
	// runs longer than that loses only the full outputs of its oldest
	// steps; it never reads them.
	blobRetain = 7 * 24 * time.Hour
	// blobSweepEvery is how often the node sweeps its blob store.
	blobSweepEvery = time.Hour
)

// blobDir is the node's blob store: Models.BlobDir, or DataDir/blobs.
func blobDir(cfg Config) string {
	if cfg.Models != nil && cfg.Models.BlobDir != "" {
		return cfg.Models.BlobDir
	}
	return filepath.Join(cfg.DataDir, "blobs")
}

// sweepBlobs removes the blobs of dir that no task has written for
// retain, and the temporary files crashed writes left, at once and then
// every interval, until ctx ends. A sweep that fails is logged and tried
// again at the next.
func sweepBlobs(ctx context.Context, dir string, every, retain time.Duration, log *slog.Logger) {
	sweepBlobsOn(ctx, actor.RealClock(), dir, every, retain, log)
}

// sweepBlobsOn is sweepBlobs on clock.
func sweepBlobsOn(ctx context.Context, clock actor.Clock, dir string, every, retain time.Duration, log *slog.Logger) {
	blobs := agent.DirBlobs{Dir: dir}
	tick := make(chan struct{}, 1)
	for {
		start := clock.Now()
		removed, freed, err := blobs.Sweep(retain, start)
		switch {
		case err != nil:
			log.Warn("blob sweep failed", "dir", dir, "removed", removed, "freed_bytes", freed, "err", err)
		case removed > 0:
			log.Info("blobs swept", "dir", dir, "removed", removed, "freed_bytes", freed, "retain", retain)
		}
		t := clock.AfterFunc(every, func() {
			select {
			case tick <- struct{}{}:
			default:
			}
		})
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-tick:
		}
	}
}
