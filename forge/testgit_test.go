package forge

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// The tests' own git commands (sh and the others) work on their temporary
// repositories whatever the environment: go test run from a git hook or
// under `git rebase -x` inherits GIT_DIR, and they then committed into the
// enclosing repository, made branches in it and set its core.fsmonitor and
// core.hooksPath to the evil scripts of TestRepositoryConfigRunsNothingOnTheNode.
func TestTheTestsGitLeavesTheCallersRepositoryAlone(t *testing.T) {
	needGit(t)
	top := t.TempDir()
	decoy := top + "/.git"
	clean := []string{"PATH=" + os.Getenv("PATH"), "HOME=/nonexistent", "GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_NOSYSTEM=1"}
	plain := func(args ...string) string {
		cmd := exec.Command("git", append([]string{"--git-dir", decoy}, args...)...)
		cmd.Env = clean
		out, _ := cmd.Output()
		return strings.TrimSpace(string(out))
	}
	cmd := exec.Command("git", "init", "-q", top)
	cmd.Env = clean
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("git init: %v %s", err, out)
	}
	config := plain("config", "--list", "--local")
	t.Setenv("GIT_DIR", decoy)
	repo, _ := newRepo(t)
	zerosPatch(t, repo, map[string]int{"z.bin": 10})
	sh(t, repo, "config", "core.hooksPath", "/nonexistent/evil")
	if refs := plain("for-each-ref"); refs != "" {
		t.Errorf("the tests' git made refs in the caller's repository: %s", refs)
	}
	if got := plain("config", "--list", "--local"); got != config {
		t.Errorf("the tests' git changed the caller's repository's config:\n%s\nwas:\n%s", got, config)
	}
}
