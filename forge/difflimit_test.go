package forge

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// zerosPatch returns the binary patch that adds files of zeros of the
// given sizes to repo's HEAD, made by git, and leaves repo as it was.
func zerosPatch(t *testing.T, repo string, sizes map[string]int) string {
	t.Helper()
	for name, n := range sizes {
		if err := os.WriteFile(filepath.Join(repo, name), make([]byte, n), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	sh(t, repo, "add", "-A")
	// Not through sh, which trims: a binary patch ends in a blank line.
	cmd := exec.Command("git", "diff", "--cached", "--binary", "HEAD")
	cmd.Dir = repo
	cmd.Env = testGitEnv()
	patch, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	sh(t, repo, "reset", "-q", "--hard")
	return string(patch)
}

// A patch's binary hunks are deflated, so a small patch can hold files
// far larger than it. The node refuses one whose files declare more than
// MaxDiffBytes before it writes them, refuses to read a staged diff whose
// text is over MaxDiffBytes, and git apply cannot write a file past its
// limit. Before, the node wrote every file and read the whole diff as
// text into memory, at whatever size.
func TestLargeDiffsAreRefusedNotRead(t *testing.T) {
	needGit(t)
	repo, _ := newRepo(t)
	ctx := context.Background()
	c := &Cache{Dir: t.TempDir()}
	mirror, err := c.Mirror(ctx, repo, "")
	if err != nil {
		t.Fatal(err)
	}
	commit, _ := c.Git.Resolve(ctx, mirror, "main")
	ws, err := c.Git.Checkout(ctx, mirror, commit, filepath.Join(t.TempDir(), "ws"))
	if err != nil {
		t.Fatal(err)
	}
	sh(t, repo, "checkout", "-q", commit)

	// One file over the cap: refused before anything is written.
	patch := zerosPatch(t, repo, map[string]int{"big.bin": MaxDiffBytes + 1})
	if len(patch) > 1<<20 {
		t.Fatalf("the patch is %d bytes: the test means a small one", len(patch))
	}
	if _, err := ws.Apply(ctx, []byte(patch)); !errors.Is(err, ErrDiffTooLarge) {
		t.Fatalf("a file of %d bytes: Apply err %v, want ErrDiffTooLarge", MaxDiffBytes+1, err)
	}
	if _, err := os.Stat(filepath.Join(ws.Dir, "big.bin")); !os.IsNotExist(err) {
		t.Fatalf("the refused file was written: %v", err)
	}

	// Two files under the cap each, over it together as text.
	patch = zerosPatch(t, repo, map[string]int{"a.bin": MaxDiffBytes/2 + 1, "b.bin": MaxDiffBytes/2 + 1})
	if _, err := ws.Apply(ctx, []byte(patch)); err != nil {
		t.Fatal(err)
	}
	if _, err := ws.TextDiff(ctx); !errors.Is(err, ErrDiffTooLarge) {
		t.Fatalf("a diff of %d bytes as text: TextDiff err %v, want ErrDiffTooLarge", MaxDiffBytes+2, err)
	}

	// git apply itself cannot write a file past the limit it runs under
	// (a delta hunk's result is not declared in the patch).
	patch = zerosPatch(t, repo, map[string]int{"c.bin": 2 << 20})
	_, err = ws.git.runLimited(ctx, ws.Dir, nil, "", []byte(patch), limits{fileSize: 1 << 20}, "apply", "--binary", "-")
	if !errors.Is(err, ErrDiffTooLarge) {
		t.Fatalf("git apply of a 2 MiB file under a 1 MiB limit: err %v, want ErrDiffTooLarge", err)
	}
	if fi, err := os.Stat(filepath.Join(ws.Dir, "c.bin")); err == nil && fi.Size() > 1<<20 {
		t.Fatalf("git apply wrote %d bytes past its limit", fi.Size())
	}
}
