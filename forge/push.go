package forge

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"
)

// Author is who the agent's commits are by.
const (
	AuthorName  = "warren agent"
	AuthorEmail = "agent@warren.invalid"
)

// CommitIndex commits the workspace's index (after Apply) as one commit. The
// author, committer and time are fixed by the caller, so the same diff
// gives the same commit id on any node and in any retry.
func (w *Workspace) CommitIndex(ctx context.Context, message string, when time.Time) (string, error) {
	if strings.TrimSpace(message) == "" {
		return "", errors.New("commit: empty message")
	}
	date := fmt.Sprintf("@%d +0000", when.Unix())
	g := w.git
	g.Env = append(append([]string(nil), g.Env...), "GIT_AUTHOR_NAME="+AuthorName, "GIT_AUTHOR_EMAIL="+AuthorEmail,
		"GIT_COMMITTER_NAME="+AuthorName, "GIT_COMMITTER_EMAIL="+AuthorEmail, "GIT_AUTHOR_DATE="+date, "GIT_COMMITTER_DATE="+date)
	if _, err := g.run(ctx, w.Dir, nil, "", []byte(message), "commit", "--quiet", "--no-verify", "--no-gpg-sign", "--cleanup=verbatim", "-F", "-"); err != nil {
		return "", err
	}
	out, err := g.run(ctx, w.Dir, nil, "", nil, "rev-parse", "--verify", "HEAD")
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(out)), nil
}

// reBranch is the only kind of branch a push may write.
var reBranch = regexp.MustCompile(`^agent/[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

// BranchFor is a task's branch.
func BranchFor(taskID string) string { return "agent/" + taskID }

// Push pushes commit to branch on remote, and nothing else: the
// destination policy allows only agent/<task-id> branches (forced, since
// the branch is the task's own), never another branch, a tag, a delete
// or a merge. The credential goes to this one git process only.
func (w *Workspace) Push(ctx context.Context, remote string, auth *Auth, branch, commit string) error {
	if !reBranch.MatchString(branch) {
		return fmt.Errorf("push: %q is not an agent/<task-id> branch: the destination policy allows no other", branch)
	}
	if !isHex(commit) || len(commit) < 40 {
		return fmt.Errorf("push: %q is not a full commit id", commit)
	}
	if err := CheckRepo(remote); err != nil {
		return fmt.Errorf("push: remote: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	_, err := w.git.run(ctx, w.Dir, auth, remoteURL(remote), nil, "push", "--quiet", "--porcelain", "--no-verify", "--no-follow-tags",
		"--receive-pack="+serverSide(remote, "receive-pack"), "--", remote, "+"+commit+":refs/heads/"+branch)
	return err
}

// DefaultBranch is the branch a mirror's HEAD names ("" if none).
func (g Git) DefaultBranch(ctx context.Context, mirror string) string {
	out, err := g.run(ctx, mirror, nil, "", nil, "symbolic-ref", "--quiet", "--short", "HEAD")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(out))
}

// IsBranch reports whether name is a branch of the mirror.
func (g Git) IsBranch(ctx context.Context, mirror, name string) bool {
	_, err := g.run(ctx, mirror, nil, "", nil, "rev-parse", "--verify", "--quiet", "--end-of-options", "refs/heads/"+name)
	return err == nil
}
