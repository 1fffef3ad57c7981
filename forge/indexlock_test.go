package forge

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A git apply killed by its file-size limit (SIGXFSZ) leaves
// .git/index.lock behind. Before, every later Apply then failed at its
// git reset --hard, and the task failed after its publish tries; Apply
// now removes the stale lock (only the task's actor uses its workspace).
func TestApplyAfterAKilledApply(t *testing.T) {
	needGit(t)
	repo, _ := newRepo(t)
	src := make([]byte, 64<<10)
	for i := range src {
		src[i] = byte(i % 251)
	}
	os.WriteFile(filepath.Join(repo, "src.bin"), src, 0o644)
	sh(t, repo, "add", "-A")
	sh(t, repo, "commit", "-qm", "src")
	old := sh(t, repo, "hash-object", "src.bin")
	ws := newWorkspace(t, repo)
	ctx := context.Background()

	// A delta to a file over MaxDiffBytes, with its true hash: git makes
	// it, then is killed writing it.
	n := MaxDiffBytes/len(src) + 1
	h := sha1.New()
	fmt.Fprintf(h, "blob %d\x00", n*len(src))
	delta := append(varint(uint64(len(src))), varint(uint64(n*len(src)))...)
	for i := 0; i < n; i++ {
		h.Write(src)
		delta = append(delta, 0x80) // copy 64 KiB from offset 0
	}
	patch := fmt.Sprintf("diff --git a/src.bin b/src.bin\nindex %s..%s 100644\nGIT binary patch\ndelta %d\n%s\n",
		old, hex.EncodeToString(h.Sum(nil)), len(delta), base85(delta))
	if _, err := ws.Apply(ctx, []byte(patch)); !errors.Is(err, ErrDiffTooLarge) {
		t.Fatalf("a delta to %d bytes: Apply err %v, want ErrDiffTooLarge", n*len(src), err)
	}
	if _, err := os.Stat(filepath.Join(ws.Dir, ".git", "index.lock")); err != nil {
		t.Logf("git left no index.lock (%v): the next Apply proves less", err)
	}

	small := "diff --git a/a.txt b/a.txt\n--- a/a.txt\n+++ b/a.txt\n@@ -1 +1 @@\n-two\n+three\n"
	diff, err := ws.Apply(ctx, []byte(small))
	if err != nil {
		t.Fatalf("the next Apply: %v", err)
	}
	if !strings.Contains(string(diff), "+three") {
		t.Fatalf("the next Apply's diff:\n%s", diff)
	}
}
