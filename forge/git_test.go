package forge

import (
	"context"
	"net/http"
	"net/http/cgi"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

func needGit(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("needs git")
	}
}

// testGitEnv is the environment of the tests' own git commands: this
// process's, less every GIT_* variable, and with no global config. go test
// run from a git hook or under `git rebase -x` inherits GIT_DIR (and
// maybe GIT_INDEX_FILE, GIT_WORK_TREE): with it, a git command in a
// temporary directory works on the enclosing repository instead.
func testGitEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "GIT_") {
			env = append(env, kv)
		}
	}
	return append(env, "GIT_CONFIG_GLOBAL=/dev/null")
}

// sh runs a plain git (the user's way, none of ours) in dir.
func sh(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", append([]string{"-c", "user.name=t", "-c", "user.email=t@t"}, args...)...)
	cmd.Dir = dir
	cmd.Env = testGitEnv()
	var errb strings.Builder
	cmd.Stderr = &errb
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("git %v: %v\n%s", args, err, errb.String())
	}
	return strings.TrimSpace(string(out))
}

// newRepo is a repository with two commits; it returns the first.
func newRepo(t *testing.T) (dir, first string) {
	t.Helper()
	dir = t.TempDir()
	sh(t, dir, "init", "-q", "-b", "main")
	os.WriteFile(filepath.Join(dir, "a.txt"), []byte("one\n"), 0o644)
	sh(t, dir, "add", "-A")
	sh(t, dir, "commit", "-qm", "first")
	first = sh(t, dir, "rev-parse", "HEAD")
	os.WriteFile(filepath.Join(dir, "a.txt"), []byte("two\n"), 0o644)
	sh(t, dir, "commit", "-qam", "second")
	return dir, first
}

// A repository whose .git/config runs commands (core.fsmonitor, hooks)
// runs none of them on the node: the mirror, the checkout, the apply, the
// commit and the push all run with our settings (issue 8, acceptance 3).
func TestRepositoryConfigRunsNothingOnTheNode(t *testing.T) {
	needGit(t)
	repo, _ := newRepo(t)
	marks := t.TempDir()
	hook := filepath.Join(marks, "evil.sh")
	os.WriteFile(hook, []byte("#!/bin/sh\ntouch "+filepath.Join(marks, "ran-$(basename \"$0\")")+"\n"), 0o755)
	hooks := filepath.Join(repo, ".git", "evil-hooks")
	os.MkdirAll(hooks, 0o755)
	for _, h := range []string{"post-checkout", "pre-commit", "pre-push", "post-merge", "reference-transaction", "fsmonitor-watchman"} {
		os.WriteFile(filepath.Join(hooks, h), []byte("#!/bin/sh\ntouch "+filepath.Join(marks, "ran-"+h)+"\n"), 0o755)
	}
	sh(t, repo, "config", "core.fsmonitor", hook)
	sh(t, repo, "config", "core.hooksPath", hooks)
	sh(t, repo, "config", "core.sshCommand", hook)
	// The trap works: plain git in the repository runs it.
	sh(t, repo, "status")
	if ents, _ := os.ReadDir(marks); len(ents) < 2 {
		t.Fatalf("plain git status ran no command: the test would prove nothing")
	}
	for _, e := range mustReadDir(t, marks) {
		if strings.HasPrefix(e, "ran-") {
			os.Remove(filepath.Join(marks, e))
		}
	}

	ctx := context.Background()
	c := &Cache{Dir: t.TempDir()}
	mirror, err := c.Mirror(ctx, repo, "")
	if err != nil {
		t.Fatal(err)
	}
	commit, err := c.Git.Resolve(ctx, mirror, "main")
	if err != nil {
		t.Fatal(err)
	}
	ws, err := c.Git.Checkout(ctx, mirror, commit, filepath.Join(t.TempDir(), "ws"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ws.Tar(ctx); err != nil {
		t.Fatal(err)
	}
	diff, err := ws.Apply(ctx, []byte("diff --git a/a.txt b/a.txt\n--- a/a.txt\n+++ b/a.txt\n@@ -1 +1 @@\n-two\n+three\n"))
	if err != nil || !strings.Contains(string(diff), "+three") {
		t.Fatalf("apply: %v %s", err, diff)
	}
	id, err := ws.CommitIndex(ctx, "fix", time.Unix(1e9, 0))
	if err != nil {
		t.Fatal(err)
	}
	if err := ws.Push(ctx, repo, nil, "agent/t1", id); err != nil {
		t.Fatal(err)
	}
	if ents := mustReadDir(t, marks); len(ents) != 1 {
		t.Fatalf("commands ran on the node: %v", ents)
	}
	if got := sh(t, repo, "rev-parse", "refs/heads/agent/t1"); got != id {
		t.Fatalf("pushed %s, the branch is %s", id, got)
	}
}

func mustReadDir(t *testing.T, dir string) []string {
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

// A branch named like a commit id does not stand in for the commit: git
// itself prefers the branch, Resolve never looks at branches for an id.
func TestResolveIgnoresBranchNamedLikeACommit(t *testing.T) {
	needGit(t)
	repo, first := newRepo(t)
	second := sh(t, repo, "rev-parse", "HEAD")
	short := first[:12]
	sh(t, repo, "branch", first, second) // the attacker's branch, named as the pinned commit
	sh(t, repo, "branch", short, second)
	ctx := context.Background()
	c := &Cache{Dir: t.TempDir()}
	mirror, err := c.Mirror(ctx, repo, "")
	if err != nil {
		t.Fatal(err)
	}
	if naive := sh(t, mirror, "rev-parse", short); naive != second {
		t.Fatalf("plain git resolved %s to %s: the trap is not set", short, naive)
	}
	for _, base := range []string{first, short, strings.ToUpper(short)} {
		got, err := c.Git.Resolve(ctx, mirror, base)
		if err != nil || got != first {
			t.Errorf("Resolve(%s) = %s, %v; want %s", base, got, err, first)
		}
	}
	ws, err := c.Git.Checkout(ctx, mirror, first, filepath.Join(t.TempDir(), "ws"))
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(ws.Dir, "a.txt")); string(b) != "one\n" {
		t.Fatalf("checked out %q", b)
	}
	for _, bad := range []string{"", "-x", "main~1", "a..b", "ref:x", "0000000000000000000000000000000000000000"} {
		if _, err := c.Git.Resolve(ctx, mirror, bad); err == nil {
			t.Errorf("Resolve(%q) succeeded", bad)
		}
	}
	if got, err := c.Git.Resolve(ctx, mirror, "HEAD"); err != nil || got != second {
		t.Errorf("Resolve(HEAD) = %s, %v", got, err)
	}
}

// The mirror is fetched only when it lacks the wanted commit.
func TestMirrorFetchesOnDemand(t *testing.T) {
	needGit(t)
	repo, first := newRepo(t)
	ctx := context.Background()
	c := &Cache{Dir: t.TempDir()}
	mirror, err := c.Mirror(ctx, repo, "")
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(repo, "b.txt"), []byte("b\n"), 0o644)
	sh(t, repo, "add", "-A")
	sh(t, repo, "commit", "-qm", "third")
	third := sh(t, repo, "rev-parse", "HEAD")
	if _, err := c.Mirror(ctx, repo, first); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Git.Resolve(ctx, mirror, third); err == nil {
		t.Fatal("the mirror fetched though it had the wanted commit")
	}
	if _, err := c.Mirror(ctx, repo, third); err != nil {
		t.Fatal(err)
	}
	if got, err := c.Git.Resolve(ctx, mirror, third); err != nil || got != third {
		t.Fatalf("after a fetch: %s %v", got, err)
	}
	if _, err := c.Mirror(ctx, "--upload-pack=touch /tmp/x", ""); err == nil {
		t.Fatal("an option as a repository was accepted")
	}
}

// The same diff makes the same commit anywhere; pushes go only to agent/
// branches; a binary file survives the patch.
func TestApplyCommitPush(t *testing.T) {
	needGit(t)
	repo, _ := newRepo(t)
	remote := t.TempDir()
	sh(t, remote, "init", "-q", "--bare")
	ctx := context.Background()
	c := &Cache{Dir: t.TempDir()}
	mirror, _ := c.Mirror(ctx, repo, "")
	commit, _ := c.Git.Resolve(ctx, mirror, "main")
	// A patch as the sandbox makes it: a text edit and a new binary file.
	sb := t.TempDir()
	sh(t, sb, "clone", "-q", repo, ".")
	os.WriteFile(filepath.Join(sb, "a.txt"), []byte("fixed\n"), 0o644)
	os.WriteFile(filepath.Join(sb, "img.bin"), []byte{0, 1, 2, 255, 0, 7}, 0o644)
	sh(t, sb, "add", "-A")
	patch := sh(t, sb, "diff", "--cached", "--binary", commit) + "\n" // sh trims the binary hunk's closing blank line
	if _, err := func() ([]byte, error) {
		ws, _ := c.Git.Checkout(ctx, mirror, commit, filepath.Join(t.TempDir(), "ws"))
		return ws.Apply(ctx, []byte(patch))
	}(); err == nil || !strings.Contains(err.Error(), "img.bin is missing") {
		t.Fatalf("a truncated binary patch: %v", err)
	}
	patch += "\n"
	var ids []string
	for i := 0; i < 2; i++ {
		ws, err := c.Git.Checkout(ctx, mirror, commit, filepath.Join(t.TempDir(), "ws"))
		if err != nil {
			t.Fatal(err)
		}
		diff, err := ws.Apply(ctx, []byte(patch))
		if err != nil {
			t.Fatal(err)
		}
		files := ParseDiff(diff)
		if len(files) != 2 || !files[1].Binary || files[1].Path != "img.bin" {
			t.Fatalf("diff files: %+v\npatch:\n%s\ndiff:\n%s", files, patch, diff)
		}
		id, err := ws.CommitIndex(ctx, "fix a\n", time.Unix(1.7e9, 0))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
		if err := ws.Push(ctx, remote, nil, "agent/task-1", id); err != nil {
			t.Fatal(err)
		}
		if err := ws.Push(ctx, remote, nil, "main", id); err == nil || !strings.Contains(err.Error(), "destination policy") {
			t.Fatalf("a push to main: %v", err)
		}
	}
	if ids[0] != ids[1] {
		t.Fatalf("the same diff made commits %s and %s", ids[0], ids[1])
	}
	if got := sh(t, remote, "rev-parse", "agent/task-1"); got != ids[0] {
		t.Fatalf("remote branch at %s", got)
	}
	if refs := sh(t, remote, "for-each-ref", "--format=%(refname)"); refs != "refs/heads/agent/task-1" {
		t.Fatalf("remote refs: %s", refs)
	}
	// A patch that reaches into .git or out of the tree is refused.
	ws, _ := c.Git.Checkout(ctx, mirror, commit, filepath.Join(t.TempDir(), "ws"))
	for _, bad := range []string{
		"diff --git a/.git/config b/.git/config\n--- a/.git/config\n+++ b/.git/config\n@@ -0,0 +1 @@\n+[core]\n",
		"diff --git a/../x b/../x\nnew file mode 100644\n--- /dev/null\n+++ b/../x\n@@ -0,0 +1 @@\n+x\n",
	} {
		if _, err := ws.Apply(ctx, []byte(bad)); err == nil {
			t.Errorf("applied %q", bad)
		}
	}
}

// A file marked binary by .gitattributes, or exported away, hides
// nothing: the checks read every file as text, and the sandbox gets every
// file of the commit.
func TestAttributesHideNothing(t *testing.T) {
	needGit(t)
	repo, _ := newRepo(t)
	os.WriteFile(filepath.Join(repo, ".gitattributes"), []byte("tests/ export-ignore\n"), 0o644)
	os.MkdirAll(filepath.Join(repo, "tests"), 0o755)
	os.WriteFile(filepath.Join(repo, "tests", "t.txt"), []byte("t\n"), 0o644)
	sh(t, repo, "add", "-A")
	sh(t, repo, "commit", "-qm", "tests")
	ctx := context.Background()
	c := &Cache{Dir: t.TempDir()}
	mirror, _ := c.Mirror(ctx, repo, "")
	commit, _ := c.Git.Resolve(ctx, mirror, "main")
	ws, err := c.Git.Checkout(ctx, mirror, commit, filepath.Join(t.TempDir(), "ws"))
	if err != nil {
		t.Fatal(err)
	}
	tar, err := ws.Tar(ctx)
	if err != nil || !strings.Contains(string(tar), "tests/t.txt") {
		t.Fatalf("the sandbox's tree lacks the export-ignored tests: %v", err)
	}
	patch := "diff --git a/.gitattributes b/.gitattributes\n--- a/.gitattributes\n+++ b/.gitattributes\n@@ -1 +1,2 @@\n tests/ export-ignore\n+* binary\n" +
		"diff --git a/creds.txt b/creds.txt\nnew file mode 100644\n--- /dev/null\n+++ b/creds.txt\n@@ -0,0 +1 @@\n+key = AKIAQYLPMN5HHHFPZAM2\n"
	diff, err := ws.Apply(ctx, []byte(patch))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(diff), "GIT binary patch") {
		t.Fatalf("the trap is not set: the pushed diff shows the file as text:\n%s", diff)
	}
	text, err := ws.TextDiff(ctx)
	if err != nil {
		t.Fatal(err)
	}
	r, err := Check(text, CheckConfig{})
	if err != nil || !r.Blocked {
		t.Fatalf("a secret in a file marked binary: %+v %v", r, err)
	}
}

// A task resuming on another node checks out its pinned commit even when
// no branch holds it any more (its base was force-pushed): the mirror
// fetches it by id.
func TestMirrorFetchesAPinnedCommitNoBranchHolds(t *testing.T) {
	needGit(t)
	repo, _ := newRepo(t)
	ctx := context.Background()
	node1 := &Cache{Dir: t.TempDir()}
	m1, err := node1.Mirror(ctx, repo, "")
	if err != nil {
		t.Fatal(err)
	}
	pinned, err := node1.Git.Resolve(ctx, m1, "main")
	if err != nil {
		t.Fatal(err)
	}
	// main is rebased and force-pushed: pinned is on no branch.
	sh(t, repo, "reset", "-q", "--hard", "HEAD~1")
	os.WriteFile(filepath.Join(repo, "a.txt"), []byte("rebased\n"), 0o644)
	sh(t, repo, "commit", "-qam", "rebased")
	if got := sh(t, repo, "branch", "--contains", pinned); got != "" {
		t.Fatalf("the trap is not set: %s holds the pinned commit", got)
	}
	// A new mirror, and one that was fetched before the task was pinned.
	node2 := &Cache{Dir: t.TempDir()}
	if _, err := node2.Mirror(ctx, repo, ""); err != nil {
		t.Fatal(err)
	}
	for _, c := range []*Cache{{Dir: t.TempDir()}, node2} {
		m, err := c.Mirror(ctx, repo, pinned)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Git.Checkout(ctx, m, pinned, filepath.Join(t.TempDir(), "ws")); err != nil {
			t.Errorf("the pinned commit cannot be checked out: %v", err)
		}
	}
	// A commit the remote does not have fails the fetch, saying which.
	missing := strings.Repeat("0", 39) + "1"
	if _, err := node2.Mirror(ctx, repo, missing); err == nil || !strings.Contains(err.Error(), missing) {
		t.Errorf("Mirror of a commit the remote lacks: %v", err)
	}
}

// The forge token goes only to the remote's host: git follows no
// redirect when it carries one (it would send the header on).
func TestForgeTokenFollowsNoRedirect(t *testing.T) {
	needGit(t)
	backend := "/usr/lib/git-core/git-http-backend"
	if out, err := exec.Command("git", "--exec-path").Output(); err == nil {
		backend = filepath.Join(strings.TrimSpace(string(out)), "git-http-backend")
	}
	if _, err := os.Stat(backend); err != nil {
		t.Skip("needs git-http-backend")
	}
	repo, _ := newRepo(t)
	sh(t, repo, "config", "http.uploadpack", "true")
	var mu sync.Mutex
	var seen []string
	// The other host: a working smart-HTTP server that records the
	// Authorization header it is sent.
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Method+" "+r.URL.Path+" auth="+r.Header.Get("Authorization"))
		mu.Unlock()
		h := &cgi.Handler{Path: backend, Env: []string{"GIT_PROJECT_ROOT=" + repo, "GIT_HTTP_EXPORT_ALL=1"}}
		r.URL.Path = "/.git" + strings.TrimPrefix(r.URL.Path, "/o/r")
		h.ServeHTTP(w, r)
	}))
	defer other.Close()
	otherURL := strings.Replace(other.URL, "127.0.0.1", "localhost", 1) // another host name
	forgeSrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, otherURL+r.URL.RequestURI(), http.StatusMovedPermanently)
	}))
	defer forgeSrv.Close()
	// The trap works: anonymous, git follows the redirect to the other host.
	anon := &Cache{Dir: t.TempDir()}
	if _, err := anon.Mirror(context.Background(), forgeSrv.URL+"/o/r", ""); err != nil {
		t.Fatalf("an anonymous fetch through the redirect: %v", err)
	}

	mu.Lock()
	seen = nil
	mu.Unlock()
	c := &Cache{Dir: t.TempDir(), Auth: func(string) *Auth { return &Auth{Token: "s3cret-forge-token"} }}
	if _, err := c.Mirror(context.Background(), forgeSrv.URL+"/o/r", ""); err == nil {
		t.Error("a fetch with the token followed the redirect")
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) > 0 {
		t.Errorf("the other host got requests of a fetch with the token: %v", seen)
	}
}

func TestCheckRepo(t *testing.T) {
	for _, tc := range []struct {
		repo string
		err  string // "" accepted, else part of the error
	}{
		{"https://github.com/acme/calc.git", ""},
		{"http://127.0.0.1:8080/git/a/b", ""},
		{"ssh://git@github.com/acme/calc.git", ""}, // ssh's user is a login, not a credential
		{"git@github.com:acme/calc.git", ""},
		{"git://example.com/calc.git", ""},
		{"file:///srv/git/calc.git", ""},
		{"/srv/git/calc.git", ""},
		{"", "required"},
		{"--upload-pack=touch /tmp/x", "must not start with -"},
		{"https://github.com/a\nb", "control character"},
		{"ftp://example.com/calc.git", "scheme ftp"},
		{"calc", "is not a URL"},
		{"https://ghp_T0KEN@github.com/acme/calc.git", `"https://github.com/acme/calc.git": the URL's user info`},
		{"https://x-access-token:ghp_T0KEN@github.com/acme/calc.git", "forge token"},
		{"HTTP://ghp_T0KEN@github.com", "user info"},
		{"https://ghp_T0KEN@github.com/%zz", "user info"}, // not a valid URL either
		{"ssh://git:ghp_T0KEN@github.com/acme/calc.git", "user info"},
		{"git://ghp_T0KEN@example.com/calc.git", "user info"},
		{"https://github.com/acme/a@b.git", ""}, // an @ in the path is no user info
	} {
		err := CheckRepo(tc.repo)
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("CheckRepo(%q) = %v", tc.repo, err)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("CheckRepo(%q) = %v, want an error with %q", tc.repo, err, tc.err)
		case err != nil && strings.Contains(err.Error(), "T0KEN"):
			t.Errorf("CheckRepo(%q) repeats the token: %v", tc.repo, err)
		}
	}
}
