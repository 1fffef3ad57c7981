package forge

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
)

// bombRepo is a repository of a few KB whose one commit names a 1 MiB
// blob of zeros from n paths: a tree of n MiB. It returns the commit.
func bombRepo(t *testing.T, n int) (dir, commit string) {
	t.Helper()
	dir = t.TempDir()
	sh(t, dir, "init", "-q", "-b", "main")
	zeros := filepath.Join(t.TempDir(), "zeros")
	if err := os.WriteFile(zeros, make([]byte, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	blob := sh(t, dir, "hash-object", "-w", zeros)
	var index strings.Builder
	for i := 0; i < n; i++ {
		fmt.Fprintf(&index, "100644 blob %s\tz/%04d.bin\n", blob, i)
	}
	cmd := exec.Command("git", "update-index", "--index-info")
	cmd.Dir, cmd.Stdin = dir, strings.NewReader(index.String())
	cmd.Env = testGitEnv()
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("update-index: %v\n%s", err, out)
	}
	tree := sh(t, dir, "write-tree")
	commit = sh(t, dir, "commit-tree", "-m", "bomb", tree)
	sh(t, dir, "update-ref", "refs/heads/main", commit)
	return dir, commit
}

// A repository of a few KB can name one 1 MiB blob from 300 paths: a tree
// of 300 MiB (of many GB, with more paths or nested trees). Checkout wrote
// all of it to the node's disk and Tar read all of it into the node's
// memory, which killed the node daemon; the task, requeued, then killed
// the next node. Checkout now counts the tree before it writes a file, and
// Tar stops git past MaxTreeBytes.
func TestATreeBombIsRefusedNotWrittenOrRead(t *testing.T) {
	needGit(t)
	defer func(v int) { MaxTreeBytes = v }(MaxTreeBytes)
	MaxTreeBytes = 64 << 20
	repo, commit := bombRepo(t, 300)
	ctx := context.Background()
	c, mirror := newMirror(t, repo)
	dir := filepath.Join(t.TempDir(), "ws")
	_, err := c.Git.Checkout(ctx, mirror, commit, dir)
	if !errors.Is(err, ErrTreeTooLarge) || !strings.Contains(fmt.Sprint(err), repo) || !strings.Contains(fmt.Sprint(err), strconv.Itoa(64<<20)) {
		t.Errorf("Checkout of a 300 MiB tree under a 64 MiB limit: %v; want ErrTreeTooLarge naming the repository and the limit", err)
	}
	if ents, _ := os.ReadDir(filepath.Join(dir, "z")); len(ents) > 0 {
		t.Errorf("Checkout wrote %d files of the tree before refusing it", len(ents))
	}

	// Tar, on its own (the tree's objects are in the workspace's clone).
	ws := &Workspace{Dir: dir, Commit: commit, git: c.Git}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	tar, err := ws.Tar(ctx)
	runtime.ReadMemStats(&after)
	if !errors.Is(err, ErrTreeTooLarge) || !strings.Contains(fmt.Sprint(err), strconv.Itoa(64<<20)) {
		t.Errorf("Tar of a 300 MiB tree under a 64 MiB limit: %d bytes, %v; want ErrTreeTooLarge naming the limit", len(tar), err)
	}
	if grew := after.TotalAlloc - before.TotalAlloc; grew > allocScale*256<<20 { // its buffer grows by doubling to 64 MiB; the whole tree is 300

		t.Errorf("Tar allocated %d MiB under a 64 MiB limit", grew>>20)
	}

	// Under the limit, a smaller one checks out and archives.
	repo, commit = bombRepo(t, 40)
	if mirror, err = c.Mirror(ctx, repo, ""); err != nil {
		t.Fatal(err)
	}
	ws, err = c.Git.Checkout(ctx, mirror, commit, filepath.Join(t.TempDir(), "ws2"))
	if err != nil {
		t.Fatal(err)
	}
	if tar, err = ws.Tar(ctx); err != nil {
		t.Fatal(err)
	}
	if len(tar) < 40<<20 {
		t.Errorf("an archive of %d bytes", len(tar))
	}
}

// Trees nest: one tree naming another a thousand times, which names an
// empty file a thousand times, is a million files from three objects.
// Checkout stops git's listing once the count is over.
func TestANestedTreeBombIsRefused(t *testing.T) {
	needGit(t)
	defer func(v int) { MaxTreeBytes = v }(MaxTreeBytes)
	MaxTreeBytes = 64 << 20
	repo := t.TempDir()
	sh(t, repo, "init", "-q", "-b", "main")
	mktree := func(mode, kind, id string) string {
		var b strings.Builder
		for i := 0; i < 1000; i++ {
			fmt.Fprintf(&b, "%s %s %s\t%04d\n", mode, kind, id, i)
		}
		cmd := exec.Command("git", "mktree")
		cmd.Dir, cmd.Stdin = repo, strings.NewReader(b.String())
		cmd.Env = testGitEnv()
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("mktree: %v", err)
		}
		return strings.TrimSpace(string(out))
	}
	empty := sh(t, repo, "hash-object", "-w", "/dev/null")
	top := mktree("040000", "tree", mktree("100644", "blob", empty))
	commit := sh(t, repo, "commit-tree", "-m", "bomb", top)
	sh(t, repo, "update-ref", "refs/heads/main", commit)
	ctx := context.Background()
	c, mirror := newMirror(t, repo)
	dir := filepath.Join(t.TempDir(), "ws")
	if _, err := c.Git.Checkout(ctx, mirror, commit, dir); !errors.Is(err, ErrTreeTooLarge) {
		t.Fatalf("Checkout of a million files: %v; want ErrTreeTooLarge", err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) > 1 { // .git
		t.Errorf("Checkout wrote %d entries before refusing the tree", len(ents))
	}
}
