package agent

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The model writes the tests, so it writes their output, which goes into
// the pull request: a credential it prints (built at run time, so in no
// diff) is redacted there as in a finding. Before, the test output went
// into the body as it was.
func TestPublishRedactsCredentialsInTheTestOutput(t *testing.T) {
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
	g.AllowLocal = true
	ctx := context.Background()
	ws, err := g.Checkout(ctx, remote, "main", "", filepath.Join(t.TempDir(), "ws"))
	if err != nil {
		t.Fatal(err)
	}
	_, rep, err := g.Review(ctx, ws, "diff --git a/a.txt b/a.txt\n--- a/a.txt\n+++ b/a.txt\n@@ -1 +1 @@\n-a\n+b\n", false)
	if err != nil || rep.Blocked || rep.NeedsApproval {
		t.Fatalf("review: %+v %v", rep, err)
	}
	const key = "AKIAQYLPMN5HHHFPZAM2"
	c := PRContent{TaskID: "t1", IssueTitle: "b", Finish: &Finish{Summary: "b, not a"}, Report: rep,
		TestCommand: "go test ./...", TestOutput: "=== RUN TestB\naws key " + key + " in use\n--- PASS: TestB\nok\n"}
	p, err := g.Publish(ctx, ws, c, remote, "main", "", time.Unix(1.7e9, 0))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(p.Body, key) || strings.Contains(p.Body, key[4:]) {
		t.Fatalf("the key is in the pull request's body:\n%s", p.Body)
	}
	if !strings.Contains(p.Body, "AKIA…[redacted]") || !strings.Contains(p.Body, "--- PASS: TestB") {
		t.Fatalf("the body does not keep the output with the key redacted:\n%s", p.Body)
	}
}
