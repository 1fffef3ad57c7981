package api

import (
	"regexp"
	"strings"
)

// RepoCredential reports whether repo, a URL, carries credentials in its
// user info (the part of the authority before '@'): any user info, except
// an ssh URL's user name alone. If it does, shown is the URL without its
// user info, safe to quote. It reads the text, before any parse, so that
// no error (nor a caller's, which quotes the URL) repeats a credential:
// repository URLs end up in task specs, events and logs. The scheduler
// (CreateTask) and the node (forge) both check with it.
func RepoCredential(repo string) (shown string, bad bool) {
	scheme, rest, ok := strings.Cut(repo, "://")
	if !ok {
		return repo, false
	}
	authority, path := rest, ""
	if i := strings.IndexAny(rest, "/?#"); i >= 0 {
		authority, path = rest[:i], rest[i:]
	}
	i := strings.LastIndex(authority, "@")
	if i < 0 || strings.EqualFold(scheme, "ssh") && !strings.Contains(authority[:i], ":") {
		return repo, false
	}
	return scheme + "://" + authority[i+1:] + path, true
}

// ScpLikeRepo is the scp-like form of a repository, user@host:path, that
// the servers take in a task's spec and the nodes check out: one pattern,
// so that no task is accepted that its node then refuses. The path must
// not start with '/' (the nodes refused git@host:/abs while the servers
// took it, so such a task failed only at checkout) and holds no space.
var ScpLikeRepo = regexp.MustCompile(`^[A-Za-z0-9._-]+@[A-Za-z0-9.-]+:[^/\s]\S*$`)
