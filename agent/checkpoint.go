package agent

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/warrenhq/warren/api/textcut"
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
// JSON-encoded in it. Past 64 KiB the node records it in payload_part
// events (docs/events.md), each step's whole patch again: the bound keeps
// a long task's log in check. A larger patch is recorded as too large,
// and its task cannot park (it would resume without its work).
const MaxCheckpointBytes = 1 << 20

// MaxPatchBytes bounds the workspace's patch Checkpoint returns (the
// diff the finish step reviews and publishes). A larger one is an error
// (ErrPatchTooLarge): it is never cut.
const MaxPatchBytes = 64 << 20

// ErrPatchTooLarge is a workspace patch over the limit asked for; the
// error wrapping it names the patch's size and the limit.
var ErrPatchTooLarge = errors.New("the workspace's patch is too large")

var gitIdentity = []string{"-c", "user.name=warren", "-c", "user.email=warren@localhost", "-c", "core.fsmonitor=false", "-c", "core.hooksPath=/dev/null"}

func (t *Tools) git(ctx context.Context, args ...string) (ExecResult, error) {
	res, err := t.SB.Exec(ctx, append(append([]string{"git"}, gitIdentity...), args...), t.Root, 5*time.Minute)
	if err != nil {
		return res, err
	}
	if res.ExitCode != 0 {
		return res, fmt.Errorf("git %s: exit %d: %s", args[0], res.ExitCode, errOutput(res.Stderr))
	}
	return res, nil
}

// maxErrOutput bounds what of a command's output an error quotes: the
// sandbox's code can replace git and print megabytes, and the error goes
// into the node's log at every retry of the step.
const maxErrOutput = 2 << 10

// errOutput is a command's output for an error: trimmed, and its last
// maxErrOutput bytes only (where a failure's reason usually is).
func errOutput(b []byte) string {
	s := strings.TrimSpace(string(b))
	if len(s) <= maxErrOutput {
		return s
	}
	return "…" + textcut.Tail(s, maxErrOutput)
}

// InitBase makes the checked-out tree the base commit of a local git
// repository in the sandbox (its own, without the origin's config). Run
// again on a tree checked out afresh in the same sandbox (a start tried
// again), it makes that tree the base.
func (t *Tools) InitBase(ctx context.Context) error {
	// Every file of the checkout is in the base, ignored or not (-f); what
	// running code leaves behind later is not part of the change unless
	// the base has it.
	for _, args := range [][]string{{"init", "-q"}, {"add", "-A", "-f"}, {"commit", "-q", "--allow-empty", "--no-verify", "-m", "base"}, {"tag", "-f", "warren-base"}} {
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
// and new files included: all of it, or an error wrapping
// ErrPatchTooLarge that names its size when it is over MaxPatchBytes.
func (t *Tools) Checkpoint(ctx context.Context) (string, error) {
	patch, _, err := t.patch(ctx, MaxPatchBytes)
	return patch, err
}

// patchFile is where patch has git write the diff, in the sandbox: in
// the repository's .git, which is no part of the work tree.
const patchFile = ".git/warren-checkpoint.diff"

// patchScript runs the command after $1 with its output into the file
// $1, and prints the file's size. POSIX sh only.
const patchScript = `f=$1; shift; "$@" > "$f" || exit; wc -c < "$f"`

// patch returns the work tree's patch against the base and its size in
// bytes. A patch over limit bytes is not read: the error wraps
// ErrPatchTooLarge, and size is still its size.
//
// The diff goes through a file in the sandbox, not a command's output: a
// sandbox keeps only the head and tail of a long output (the node's cap
// on tool output), and a patch cut in the middle may still apply, without
// the files that were left out.
func (t *Tools) patch(ctx context.Context, limit int64) (patch string, size int64, err error) {
	if _, err := t.git(ctx, "add", "-A"); err != nil {
		return "", 0, err
	}
	file := t.Root + "/" + patchFile
	argv := append([]string{"/bin/sh", "-c", patchScript, "sh", file, "git"}, gitIdentity...)
	argv = append(argv, "diff", "--cached", "--binary", "--no-color", "--no-ext-diff", "--no-textconv", "--no-renames", "warren-base")
	res, err := t.SB.Exec(ctx, argv, t.Root, 5*time.Minute)
	if err != nil {
		return "", 0, fmt.Errorf("checkpoint: %w", err)
	}
	if res.ExitCode != 0 {
		return "", 0, fmt.Errorf("git diff: exit %d: %s", res.ExitCode, errOutput(res.Stderr))
	}
	size, err = strconv.ParseInt(strings.TrimSpace(string(res.Stdout)), 10, 64)
	if err != nil || size < 0 {
		return "", 0, fmt.Errorf("checkpoint: the patch's size: %q", textcut.Head(res.Stdout, 100))
	}
	if size > limit {
		return "", size, fmt.Errorf("checkpoint: %w: %d bytes, over the limit of %d", ErrPatchTooLarge, size, limit)
	}
	if size == 0 {
		return "", 0, nil
	}
	b, err := t.SB.ReadFile(ctx, file, limit)
	if err != nil {
		return "", size, fmt.Errorf("checkpoint: read the patch: %w", err)
	}
	if int64(len(b)) != size {
		return "", size, fmt.Errorf("checkpoint: read %d bytes of a %d-byte patch", len(b), size)
	}
	return string(b), size, nil
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
