// Package agenttest has helpers for tests that run agent tasks in real
// container sandboxes: the repository with a bug they fix, the guest agent
// built from this tree, and the checks that skip without containerd.
package agenttest

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/warrenhq/warren/guest"
	"github.com/warrenhq/warren/internal/testenv"
	"github.com/warrenhq/warren/noded/driver/container"
)

// NeedContainers skips the test unless it can run container sandboxes
// (root, a running containerd, the default template); it returns the
// template store.
func NeedContainers(t testing.TB) string {
	t.Helper()
	if testing.Short() {
		t.Skip("runs a container; skipped in -short")
	}
	if os.Geteuid() != 0 {
		testenv.Missing(t, "needs root")
	}
	if _, err := os.Stat(container.DefaultSocket); err != nil {
		testenv.Missing(t, "needs a running containerd at %s (.ci/run starts it)", container.DefaultSocket)
	}
	imageDir := os.Getenv("WARREN_IMAGE_DIR")
	if imageDir == "" {
		imageDir = "/var/lib/warren/templates"
	}
	if _, err := guest.LoadTemplate(imageDir, "default"); err != nil {
		testenv.Missing(t, "needs the default template: %v (run `make image`)", err)
	}
	return imageDir
}

// BuildGuest builds warren-guest from this tree at path, for the
// container driver to run as each container's agent.
func BuildGuest(t testing.TB, path string) {
	t.Helper()
	build := exec.Command("go", "build", "-o", path, "github.com/warrenhq/warren/cmd/warren-guest")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build warren-guest: %v\n%s", err, out)
	}
}

// BuggyRepo is a small Go repository whose Add subtracts, with a test that
// says so, and an AGENTS.md.
func BuggyRepo(t testing.TB) string {
	t.Helper()
	repo := t.TempDir()
	for p, c := range map[string]string{
		"go.mod":            "module demo\n\ngo 1.19\n",
		"calc/calc.go":      "package calc\n\n// Add returns a plus b.\nfunc Add(a, b int) int { return a - b }\n",
		"calc/calc_test.go": "package calc\n\nimport \"testing\"\n\nfunc TestAdd(t *testing.T) {\n\tif got := Add(2, 2); got != 4 {\n\t\tt.Fatalf(\"Add(2, 2) = %d\", got)\n\t}\n}\n",
		"AGENTS.md":         "Run go test ./... before you finish.\n",
	} {
		if err := os.MkdirAll(filepath.Join(repo, filepath.Dir(p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(repo, p), []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, args := range [][]string{{"init", "-q"}, {"add", "-A"}, {"-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "buggy Add"}} {
		if out, err := exec.Command("git", append([]string{"-C", repo}, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v %s", args, err, out)
		}
	}
	return repo
}
