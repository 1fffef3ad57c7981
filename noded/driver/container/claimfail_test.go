package container

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containerd/containerd"

	"github.com/containerd/containerd/errdefs"

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

// A claim that failed, whose container could not be deleted in time, keeps
// its id until the background retry has deleted it. Before, the claim
// freed the id at once: a retried claim of it failed with a bare "file
// exists" (the first box's disk), and removed the first box's directory,
// which the retry's teardown then removed again under any later claim.
func TestAFailedClaimKeepsItsIDUntilItsContainerIsGone(t *testing.T) {
	d := newDriverAgent(t, "runc", silentAgent(t))
	defer d.Close()
	oldWait, oldEvery, oldAgent := destroyWait, retryDestroyEvery, agentWait
	destroyWait, retryDestroyEvery, agentWait = time.Millisecond, 300*time.Millisecond, 2*time.Second
	t.Cleanup(func() { destroyWait, retryDestroyEvery, agentWait = oldWait, oldEvery, oldAgent })
	ctx := context.Background()
	if _, err := d.Claim(ctx, driver.ClaimRequest{ID: "sb-retry"}); err == nil {
		t.Fatal("the claim of an agent that never answers succeeded")
	}
	if _, err := d.client.LoadContainer(ctx, "sb-retry"); err != nil {
		t.Fatalf("the container went within %v: the test proves nothing (%v)", destroyWait, err)
	}
	dir := filepath.Join(d.cfg.StateDir, "boxes", "sb-retry")
	_, err := d.Claim(ctx, driver.ClaimRequest{ID: "sb-retry"})
	if !errors.Is(err, driver.ErrExists) {
		t.Errorf("a claim of the id while its container is deleted: %v, want exists", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "disk.ext4")); err != nil {
		if _, lerr := d.client.LoadContainer(ctx, "sb-retry"); lerr == nil {
			t.Errorf("the first box's disk went while its container runs: %v", err)
		}
	}
	// Once the retry has deleted it, the id is free again.
	deadline := time.Now().Add(time.Minute)
	for {
		_, lerr := d.client.LoadContainer(ctx, "sb-retry")
		_, tracked := d.Get("sb-retry")
		if errdefs.IsNotFound(lerr) && !tracked {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a minute on: container %v, tracked %v", lerr, tracked)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("the box's directory is left after the retry: %v", err)
	}
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

// A container that a restart cannot delete in time stays tracked: its id
// taken, its directory kept, and deleted in the background. Before, the
// restart forgot it: it ran on with no TTL, its directory removed under
// it, and its id free.
func TestARestartKeepsALeftContainerItCannotDeleteYet(t *testing.T) {
	d := newDriver(t)
	defer d.Close()
	ctx := context.Background()
	sb, err := d.Claim(ctx, driver.ClaimRequest{ID: "sb-left-slow"})
	if err != nil {
		t.Fatal(err)
	}
	dir := sb.(*Box).dir
	oldLeft, oldEvery := leftoverWait, retryDestroyEvery
	leftoverWait, retryDestroyEvery = time.Millisecond, 300*time.Millisecond
	t.Cleanup(func() { leftoverWait, retryDestroyEvery = oldLeft, oldEvery })
	// The "restarted" node, while the first run is never closed.
	d2, err := New(d.cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer d2.Close()
	if _, err := d2.client.LoadContainer(ctx, "sb-left-slow"); err != nil {
		t.Fatalf("the container went within %v: the test proves nothing (%v)", leftoverWait, err)
	}
	if _, tracked := d2.Get("sb-left-slow"); !tracked {
		t.Error("the restarted driver does not track the container it could not delete")
	}
	if _, err := os.Stat(filepath.Join(dir, diskImage)); err != nil {
		t.Errorf("the running container's disk went: %v", err)
	}
	if _, err := d2.Claim(ctx, driver.ClaimRequest{ID: "sb-left-slow"}); !errors.Is(err, driver.ErrExists) {
		t.Errorf("a claim of its id: %v, want exists", err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		_, lerr := d2.client.LoadContainer(ctx, "sb-left-slow")
		_, tracked := d2.Get("sb-left-slow")
		_, serr := os.Stat(dir)
		if errdefs.IsNotFound(lerr) && !tracked && os.IsNotExist(serr) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a minute on: container %v, tracked %v, directory %v", lerr, tracked, serr)
		}
		time.Sleep(100 * time.Millisecond)
	}
	waitNoLoops(t, dir)
}

// No user of the host but root can reach a sandbox's files: the sandbox's
// code runs as root in its container and could leave a set-user-ID shell
// in its root, which its box's directory exposed to every user.
func TestOnlyRootEntersTheBoxes(t *testing.T) {
	d := newDriver(t)
	defer d.Close()
	sb, err := d.Claim(context.Background(), driver.ClaimRequest{ID: "sb-perm"})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy()
	dir := sb.(*Box).dir
	for p := dir; p != d.cfg.StateDir; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm()&0o001 == 0 {
			return // others cannot search it, so nothing below
		}
	}
	t.Errorf("other users can reach %s: no directory from the state dir down is closed to them", dir)
}

// When a restart cannot list the previous run's containers, each box it
// left stays, its id taken, until a listing in the background succeeds;
// then its container and directory go. Before, the directories were
// removed under containers that might still run, and their ids were free.
func TestARestartThatCannotListKeepsTheBoxes(t *testing.T) {
	d := newDriver(t)
	defer d.Close()
	ctx := context.Background()
	sb, err := d.Claim(ctx, driver.ClaimRequest{ID: "sb-unlisted"})
	if err != nil {
		t.Fatal(err)
	}
	dir := sb.(*Box).dir
	var calls atomic.Int32
	real := listLeftovers
	listLeftovers = func(d *Driver) ([]containerd.Container, error) {
		if calls.Add(1) == 1 {
			return nil, errors.New("containerd is busy (a test's failure)")
		}
		return real(d)
	}
	oldEvery := retryDestroyEvery
	retryDestroyEvery = 300 * time.Millisecond
	t.Cleanup(func() { listLeftovers, retryDestroyEvery = real, oldEvery })
	d2, err := New(d.cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer d2.Close()
	if _, err := os.Stat(filepath.Join(dir, diskImage)); err != nil {
		t.Errorf("the box's disk went while its container may run: %v", err)
	}
	if _, err := d2.Claim(ctx, driver.ClaimRequest{ID: "sb-unlisted"}); !errors.Is(err, driver.ErrExists) {
		t.Errorf("a claim of its id before the listing: %v, want exists", err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		_, lerr := d2.client.LoadContainer(ctx, "sb-unlisted")
		_, tracked := d2.Get("sb-unlisted")
		_, serr := os.Stat(dir)
		if errdefs.IsNotFound(lerr) && !tracked && os.IsNotExist(serr) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a minute on: container %v, tracked %v, directory %v", lerr, tracked, serr)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if calls.Load() < 2 {
		t.Errorf("the listing was not tried again (%d calls)", calls.Load())
	}
	waitNoLoops(t, dir)
}
