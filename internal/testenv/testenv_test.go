package testenv

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// Missing skips by default and fails with Env set; both run in a child
// process, since a skip or a failure ends the test that gets it.
func TestMissing(t *testing.T) {
	if os.Getenv("TESTENV_CHILD") != "" {
		Missing(t, "needs %s", "a thing")
		return
	}
	for _, tc := range []struct {
		require bool
		want    string
	}{
		{false, "--- SKIP: TestMissing"},
		{true, "--- FAIL: TestMissing"},
	} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestMissing$", "-test.v")
		cmd.Env = append(os.Environ(), "TESTENV_CHILD=1", Env+"=")
		if tc.require {
			cmd.Env = append(cmd.Env, Env+"=1")
		}
		out, _ := cmd.CombinedOutput()
		if !strings.Contains(string(out), tc.want) || !strings.Contains(string(out), "needs a thing") {
			t.Errorf("%s=%v: %s", Env, tc.require, out)
		}
	}
}

func TestUnsetGit(t *testing.T) {
	t.Setenv("GIT_DIR", "/nonexistent/.git")
	t.Setenv("GIT_WORK_TREE", "/nonexistent")
	t.Setenv("NOT_GIT_DIR", "kept")
	UnsetGit()
	for _, k := range []string{"GIT_DIR", "GIT_WORK_TREE"} {
		if v, ok := os.LookupEnv(k); ok {
			t.Errorf("%s=%q is still set", k, v)
		}
	}
	if os.Getenv("NOT_GIT_DIR") != "kept" {
		t.Error("a variable that is not git's was unset")
	}
}
