// Package testenv is for tests that need what a host may lack (root, QEMU,
// the guest template, a running containerd, curl): Missing skips such a
// test and says why, except where the environment promises all of it.
// .ci/run sets WARREN_TEST_REQUIRE=1, and there a missing prerequisite
// fails the test: a sandbox test that quietly skipped in CI would pass
// without having run.
package testenv

import (
	"os"
	"strings"
	"testing"
)

// Env is the variable that turns Missing's skips into failures.
const Env = "WARREN_TEST_REQUIRE"

// Required reports whether Env is set: missing prerequisites fail.
func Required() bool { return os.Getenv(Env) != "" }

// Missing skips t, saying what it needs (format and args), or fails it
// when Env is set.
func Missing(t testing.TB, format string, args ...any) {
	t.Helper()
	if Required() {
		t.Fatalf("missing where "+Env+" is set: "+format, args...)
	}
	t.Skipf(format, args...)
}

// UnsetGit unsets every GIT_* variable of the process, so that the git a
// test runs works on the test's own repositories: go test run under `git
// rebase -x`, or from a git hook, inherits GIT_DIR and its kin, and tests
// that ran git with their environment then wrote into the enclosing
// repository (its config, its refs). Test packages that run git call it
// from an init function.
func UnsetGit() {
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); strings.HasPrefix(k, "GIT_") {
			os.Unsetenv(k)
		}
	}
}
