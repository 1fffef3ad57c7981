package agent

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// Workspace checkpoints: the repository in the sandbox is a git work tree
// whose first commit is the base (InitBase); a checkpoint is the patch of
// the work tree against it, recorded in the task's log after each step
// that may have changed the workspace. A task resumed elsewhere restores
// the last one on its fresh checkout before it reruns anything.

// DefaultExcludes are the untracked files a diff leaves out: caches and
// build output that running the code and its tests leave behind.
const DefaultExcludes = "__pycache__/\n*.pyc\n.pytest_cache/\n.mypy_cache/\n.ruff_cache/\nnode_modules/\n.tox/\n.venv/\n*.o\n.gradle/\n"

// MaxCheckpointBytes bounds a checkpoint event's payload, the patch
// JSON-encoded in it: the log takes events of at most 64 KiB. A larger
// patch is recorded as too large, and its task cannot park (it would
// resume without its work).
const MaxCheckpointBytes = 60 << 10

var gitIdentity = []string{"-c", "user.name=warren", "-c", "user.email=warren@localhost", "-c", "core.fsmonitor=false", "-c", "core.hooksPath=/dev/null"}

func (t *Tools) git(ctx context.Context, args ...string) (ExecResult, error) {
	res, err := t.SB.Exec(ctx, append(append([]string{"git"}, gitIdentity...), args...), t.Root, 5*time.Minute)
	if err != nil {
		return res, err
	}
	if res.ExitCode != 0 {
		return res, fmt.Errorf("git %s: exit %d: %s", args[0], res.ExitCode, strings.TrimSpace(string(res.Stderr)))
	}
	return res, nil
}

// InitBase makes the checked-out tree the base commit of a local git
// repository in the sandbox (its own, without the origin's config).
func (t *Tools) InitBase(ctx context.Context) error {
	// Every file of the checkout is in the base, ignored or not (-f); what
	// running code leaves behind later is not part of the change unless
	// the base has it.
	for _, args := range [][]string{{"init", "-q"}, {"add", "-A", "-f"}, {"commit", "-q", "--allow-empty", "--no-verify", "-m", "base"}, {"tag", "warren-base"}} {
		if _, err := t.git(ctx, args...); err != nil {
			return fmt.Errorf("checkpoint base: %w", err)
		}
	}
	if err := t.SB.WriteFile(ctx, t.Root+"/.git/info/exclude", []byte(DefaultExcludes)); err != nil {
		return fmt.Errorf("checkpoint base: %w", err)
	}
	return nil
}

// Checkpoint returns the work tree's patch against the base, binary files
// and new files included.
func (t *Tools) Checkpoint(ctx context.Context) (string, error) {
	if _, err := t.git(ctx, "add", "-A"); err != nil {
		return "", err
	}
	res, err := t.git(ctx, "diff", "--cached", "--binary", "--no-color", "--no-ext-diff", "--no-textconv", "--no-renames", "warren-base")
	if err != nil {
		return "", err
	}
	return string(res.Stdout), nil
}

// Restore puts the work tree back at the base plus patch.
func (t *Tools) Restore(ctx context.Context, patch string) error {
	if _, err := t.git(ctx, "reset", "-q", "--hard", "warren-base"); err != nil {
		return err
	}
	if _, err := t.git(ctx, "clean", "-q", "-fdx"); err != nil {
		return err
	}
	if strings.TrimSpace(patch) == "" {
		return nil
	}
	if err := t.SB.WriteFile(ctx, "/tmp/warren-checkpoint.patch", []byte(patch)); err != nil {
		return err
	}
	_, err := t.git(ctx, "apply", "--binary", "--whitespace=nowarn", "/tmp/warren-checkpoint.patch")
	return err
}
