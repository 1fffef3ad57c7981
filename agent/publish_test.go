package agent

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/warrenhq/warren/forge"
)

// The push carries only the diff that was approved: another diff, even
// one that differs by a byte, is refused; the approved one goes.
func TestPublishRefusesADiffOtherThanTheApprovedOne(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("needs git")
	}
	src := t.TempDir()
	run := func(dir string, args ...string) {
		cmd := exec.Command("git", append([]string{"-c", "user.name=t", "-c", "user.email=t@t"}, args...)...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v %s", args, err, out)
		}
	}
	run(src, "init", "-q", "-b", "main")
	os.WriteFile(filepath.Join(src, "a.txt"), []byte("a\n"), 0o644)
	run(src, "add", "-A")
	run(src, "commit", "-qm", "a")
	remote := filepath.Join(t.TempDir(), "r.git")
	run(".", "clone", "-q", "--bare", src, remote)

	g := NewGitService(t.TempDir(), nil, nil, CheckConfig{}, false)
	if _, err := g.Checkout(context.Background(), remote, "main", "", filepath.Join(t.TempDir(), "x")); err == nil || !strings.Contains(err.Error(), "allow-local-repos") {
		t.Fatalf("a local repository without AllowLocal: %v", err)
	}
	g.AllowLocal = true
	ctx := context.Background()
	ws, err := g.Checkout(ctx, remote, "main", "", filepath.Join(t.TempDir(), "ws"))
	if err != nil {
		t.Fatal(err)
	}
	ci := func(content string) string {
		return "diff --git a/.github/workflows/ci.yml b/.github/workflows/ci.yml\nnew file mode 100644\n--- /dev/null\n+++ b/.github/workflows/ci.yml\n@@ -0,0 +1 @@\n+" + content + "\n"
	}
	_, rep, err := g.Review(ctx, ws, ci("on: push"), false)
	if err != nil || !rep.NeedsApproval {
		t.Fatalf("review: %+v %v", rep, err)
	}
	c := PRContent{TaskID: "t1", IssueTitle: "CI", Finish: &Finish{Summary: "adds CI"}}
	when := time.Unix(1.7e9, 0)
	for _, tc := range []struct{ patch, approved, want string }{
		{ci("on: push"), "", "is not the one approved (none)"},
		{ci("on: [push]"), rep.SHA256, "not the one approved"},
	} {
		_, r, err := g.Review(ctx, ws, tc.patch, false)
		if err != nil {
			t.Fatal(err)
		}
		c.Report = r
		if _, err := g.Publish(ctx, ws, c, remote, "main", tc.approved, when); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("publish %q approved %q: %v", tc.patch, tc.approved, err)
		}
	}
	if out, _ := exec.Command("git", "-C", remote, "branch", "--list", "agent/*").Output(); len(out) != 0 {
		t.Fatalf("pushed before the approval: %s", out)
	}
	// A workspace that changed since its review is refused too.
	c.Report = rep
	if _, err := g.Publish(ctx, ws, c, remote, "main", rep.SHA256, when); err == nil || !strings.Contains(err.Error(), "no longer holds the reviewed diff") {
		t.Fatalf("publish after the workspace changed: %v", err)
	}
	if _, rep2, err := g.Review(ctx, ws, ci("on: push"), false); err != nil || rep2.SHA256 != rep.SHA256 {
		t.Fatalf("review again: %v", err)
	}
	p, err := g.Publish(ctx, ws, c, remote, "main", rep.SHA256, when)
	if err != nil {
		t.Fatal(err)
	}
	if p.Branch != "agent/t1" || p.DiffSHA != rep.SHA256 || p.Forge != "none" || !strings.Contains(p.Body, "ci_config") {
		t.Fatalf("published %+v", p)
	}
	if out, _ := exec.Command("git", "-C", remote, "rev-parse", "agent/t1").Output(); strings.TrimSpace(string(out)) != p.Commit {
		t.Fatalf("the remote's agent/t1 is %s, want %s", out, p.Commit)
	}
}

// The token goes only to the forge's hosts, and never in clear text over
// a network.
func TestTokenOnlyForTheForgesHosts(t *testing.T) {
	g := NewGitService(t.TempDir(), nil, &forge.Auth{Token: "t"}, CheckConfig{}, false)
	g.Hosts = []string{"github.com", "127.0.0.1:8080"}
	for repo, want := range map[string]bool{
		"https://github.com/acme/calc.git":        true,
		"https://GitHub.com/acme/calc.git":        true,
		"https://github.com:8443/acme/calc.git":   false,
		"http://github.com/acme/calc.git":         false,
		"https://evil.example/acme/calc.git":      false,
		"https://github.com.evil.example/a/b.git": false,
		"https://x@github.com/acme/calc.git":      false,
		"http://127.0.0.1:8080/git/acme/calc.git": true,
		"http://127.0.0.1:9090/git/acme/calc.git": false,
		"git@github.com:acme/calc.git":            false,
		"/srv/git/calc.git":                       false,
	} {
		if got := g.authFor(repo) != nil; got != want {
			t.Errorf("%s: token %v, want %v", repo, got, want)
		}
	}
}
