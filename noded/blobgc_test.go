package noded

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/warrenhq/warren/actor"
	"github.com/warrenhq/warren/agent"
	"github.com/warrenhq/warren/noded/driver"
)

// The node's sweep loop removes old blobs at once, then again every
// interval, as the blobs it keeps grow old; it ends with its context.
func TestSweepBlobsLoop(t *testing.T) {
	dir := t.TempDir()
	blobs := agent.DirBlobs{Dir: dir}
	start := time.Now().Truncate(time.Second)
	clock := actor.NewFakeClock(start)
	path := func(data string) string {
		ref, err := blobs.Put([]byte(data))
		if err != nil {
			t.Fatal(err)
		}
		h := strings.TrimPrefix(ref, "sha256:")
		return filepath.Join(dir, h[:2], h[2:])
	}
	setAge := func(p string, when time.Time) {
		if err := os.Chtimes(p, when, when); err != nil {
			t.Fatal(err)
		}
	}
	there := func(p string) bool { _, err := os.Stat(p); return err == nil }
	old, young := path("old output"), path("young output")
	setAge(old, start.Add(-3*time.Hour))
	setAge(young, start)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		sweepBlobsOn(ctx, clock, dir, time.Hour, 2*time.Hour, slog.New(slog.NewTextHandler(io.Discard, nil)))
	}()
	wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
	defer wcancel()
	next := func() { // the loop swept and waits for its next round
		t.Helper()
		if err := clock.WaitForTimers(wctx, 1); err != nil {
			t.Fatal("the sweep loop did not come round:", err)
		}
	}
	next()
	if there(old) || !there(young) {
		t.Fatalf("first sweep: old there %v (want false), young there %v (want true)", there(old), there(young))
	}
	for i, want := range []bool{true, true, false} { // swept at start+1h, +2h, +3h
		clock.Advance(time.Hour)
		next()
		if there(young) != want {
			t.Fatalf("sweep %d, %v after it was written: there %v, want %v", i+2, time.Duration(i+1)*time.Hour, there(young), want)
		}
	}
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the sweep loop did not end with its context")
	}
}

// The retention outlives the longest a task runs in one sandbox on a
// node, and the node's blob directory is where its tasks write.
func TestBlobRetention(t *testing.T) {
	if blobRetain < driver.MaxTTL+DefaultApprovalGrace {
		t.Errorf("blobRetain %v is shorter than a sandbox's longest life %v", blobRetain, driver.MaxTTL+DefaultApprovalGrace)
	}
	if got := blobDir(Config{DataDir: "/data"}); got != "/data/blobs" {
		t.Errorf("blobDir: %s", got)
	}
	if got := blobDir(Config{DataDir: "/data", Models: &Models{BlobDir: "/b"}}); got != "/b" {
		t.Errorf("blobDir with Models.BlobDir: %s", got)
	}
}
