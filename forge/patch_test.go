package forge

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// newMirror mirrors repo into a new cache and returns both.
func newMirror(t *testing.T, repo string) (c *Cache, mirror string) {
	t.Helper()
	c = &Cache{Dir: t.TempDir()}
	mirror, err := c.Mirror(context.Background(), repo, "")
	if err != nil {
		t.Fatal(err)
	}
	return c, mirror
}

// newWorkspace is a workspace at repo's main.
func newWorkspace(t *testing.T, repo string) *Workspace {
	t.Helper()
	ctx := context.Background()
	c, mirror := newMirror(t, repo)
	commit, err := c.Git.Resolve(ctx, mirror, "main")
	if err != nil {
		t.Fatal(err)
	}
	ws, err := c.Git.Checkout(ctx, mirror, commit, filepath.Join(t.TempDir(), "ws"))
	if err != nil {
		t.Fatal(err)
	}
	return ws
}

// refused reports whether err is the pre-check's refusal of a patch.
func refused(err error) bool {
	return errors.Is(err, ErrDiffTooLarge) || errors.Is(err, ErrBadPatch)
}

// binaryFile is a new file's binary section whose hunks have the method
// lines given (and a token line of data each).
func binaryFile(path string, methods ...string) string {
	s := "diff --git a/" + path + " b/" + path + "\nnew file mode 100644\nindex 0000000000000000000000000000000000000000..1111111111111111111111111111111111111111\nGIT binary patch\n"
	for _, m := range methods {
		s += m + "\nbcmV?d00001\n\n"
	}
	return s
}

// git reads a binary hunk's size with strtoul and ignores what follows
// it: "literal 62914560 x" is 60 MiB to git. Before, the node counted only
// a line of exactly two fields, so five such files (300 MiB that git
// inflates and holds) reached git apply as a patch of 0 declared bytes.
// Sizes are also counted in reverse hunks, which git inflates as well.
func TestApplyRefusesBinarySizesGitReadsOtherwise(t *testing.T) {
	needGit(t)
	repo, _ := newRepo(t)
	ws := newWorkspace(t, repo)
	ctx := context.Background()
	many := func(method string) string {
		var b strings.Builder
		for i := 0; i < 5; i++ {
			b.WriteString(binaryFile("f"+string(rune('0'+i))+".bin", method, "literal 0"))
		}
		return b.String()
	}
	for name, patch := range map[string]string{
		"trailing text":    many("literal 62914560 x"),
		"two spaces":       many("literal  62914560"),
		"a sign":           many("literal +62914560"),
		"a tab":            many("literal\t62914560"),
		"strict, too many": many("literal 62914560"),
		"reverse hunks":    many("literal 0") + binaryFile("r.bin", "literal 0", "literal 268435456 x"),
		"a reverse hunk":   binaryFile("r.bin", "literal 1", "literal 268435457"),
		"one over the cap": binaryFile("big.bin", "delta 67108865"),
		"overflow":         binaryFile("big.bin", "literal 99999999999999999999999"),
	} {
		_, err := ws.Apply(ctx, []byte(patch))
		if !refused(err) {
			t.Errorf("%s: Apply err %v, want ErrDiffTooLarge or ErrBadPatch", name, err)
		}
		if err != nil && strings.Contains(err.Error(), "git apply") {
			t.Errorf("%s: git apply ran: %v", name, err)
		}
	}
}

// git apply applies a patch's sections in turn, each to the result of the
// one before on the same path, copying the whole file each time: a few
// KiB of sections on one large file took a minute of CPU and gigabytes.
// Before, the node gave git such a patch.
func TestApplyRefusesAPathInTwoSections(t *testing.T) {
	needGit(t)
	repo, _ := newRepo(t)
	ws := newWorkspace(t, repo)
	ctx := context.Background()
	section := func(from, to string) string {
		return "diff --git a/a.txt b/a.txt\nindex 0000000..1111111 100644\n--- a/a.txt\n+++ b/a.txt\n@@ -1 +1 @@\n-" + from + "\n+" + to + "\n"
	}
	twice := section("two", "three") + section("three", "four")
	if _, err := ws.Apply(ctx, []byte(twice)); !errors.Is(err, ErrBadPatch) {
		t.Fatalf("a path in two sections: Apply err %v, want ErrBadPatch", err)
	}
	// A traditional (non-git) patch after a git section is a second
	// section to git.
	trad := section("two", "three") + "--- a/a.txt\n+++ b/a.txt\n@@ -1 +1 @@\n-three\n+four\n"
	if _, err := ws.Apply(ctx, []byte(trad)); !errors.Is(err, ErrBadPatch) {
		t.Fatalf("a traditional section after a git one: Apply err %v, want ErrBadPatch", err)
	}
	// One section applies.
	if _, err := ws.Apply(ctx, []byte(section("two", "three"))); err != nil {
		t.Fatalf("one section: %v", err)
	}

	// A type change is the one path git writes twice: deleted, then new.
	if err := os.Symlink("a.txt", filepath.Join(repo, "l")); err != nil {
		t.Fatal(err)
	}
	sh(t, repo, "add", "-A")
	sh(t, repo, "commit", "-qm", "link")
	ws = newWorkspace(t, repo)
	os.Remove(filepath.Join(repo, "l"))
	os.WriteFile(filepath.Join(repo, "l"), []byte("a file now\n"), 0o644)
	sh(t, repo, "add", "-A")
	patch := sh(t, repo, "diff", "--cached", "--binary", "--no-renames", "HEAD") + "\n"
	if strings.Count(patch, "diff --git a/l b/l") != 2 {
		t.Fatalf("git wrote the type change otherwise:\n%s", patch)
	}
	if _, err := ws.Apply(ctx, []byte(patch)); err != nil {
		t.Fatalf("a type change: %v\n%s", err, patch)
	}
}

func TestCheckPatch(t *testing.T) {
	hunk := "@@ -1 +1 @@\n-a\n+b\n"
	file := func(p string) string { return "diff --git a/" + p + " b/" + p + "\n--- a/" + p + "\n+++ b/" + p + "\n" }
	del := "diff --git a/x b/x\ndeleted file mode 100644\n--- a/x\n+++ /dev/null\n@@ -1 +0,0 @@\n-a\n"
	add := "diff --git a/x b/x\nnew file mode 100644\n--- /dev/null\n+++ b/x\n@@ -0,0 +1 @@\n+b\n"
	for _, tc := range []struct {
		name, patch string
		want        error
	}{
		{"empty", "", nil},
		{"one file", file("x") + hunk, nil},
		{"two files", file("x") + hunk + file("y") + hunk, nil},
		{"a hunk that looks like headers", file("x") + "@@ -1,2 +1,2 @@\n---- a/x\n-+++ b/x\n+--- a/x\n++++ b/x\n", nil},
		{"binary, both ways", binaryFile("b", "literal 10", "delta 3"), nil},
		{"data lines that start like headers", "diff --git a/b b/b\nnew file mode 100644\nindex 0..1\nGIT binary patch\nliteral 60\ndeltaXYZ\nliteralQ\n\nliteral 0\nHcmV?d00001\n\n", nil},
		{"text first", "hello\n" + file("x") + hunk, ErrBadPatch},
		{"a rename", "diff --git a/x b/y\nsimilarity index 100%\nrename from x\nrename to y\n", ErrBadPatch},
		{"a header without counts", file("x") + "@@ -a +b @@\n", ErrBadPatch},
		{"a third binary hunk", binaryFile("b", "literal 1", "literal 1", "literal 1"), ErrBadPatch},
		{"a binary hunk without a method", binaryFile("b", "zlib 1"), ErrBadPatch},
		{"a type change", del + add, nil},
		{"deleted, new, new", del + add + add, ErrBadPatch},
		{"new, then deleted", add + del, ErrBadPatch},
		{"deleted twice", del + del, ErrBadPatch},
		{"too many hunks", file("x") + strings.Repeat(hunk, MaxPatchHunks+1), ErrDiffTooLarge},
		{"the documented bound", file("x") + strings.Repeat(hunk, 10001), ErrDiffTooLarge},
	} {
		if err := checkPatch([]byte(tc.patch)); !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) {
			t.Errorf("%s: err %v, want %v", tc.name, err, tc.want)
		}
	}
}
