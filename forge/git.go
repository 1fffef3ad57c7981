package forge

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/api"
)

// Auth is a forge credential for git over HTTP(S). It travels to one git
// process in that process's environment (as an http.extraHeader for the
// remote's URL only), never in a file, a command line, a log or a sandbox.
type Auth struct {
	User  string // "" means "x-access-token" (GitHub's convention; Gitea and GitLab accept any user with a token)
	Token string
}

// safe is what every git command gets: no fsmonitor, no hooks, no
// prompts, no pager, no protocol but http(s), git, ssh and file (for local
// mirrors), and no credential helpers.
var safe = []string{"-c", "core.fsmonitor=false", "-c", "core.hooksPath=/dev/null", "-c", "credential.helper=",
	"-c", "core.pager=cat", "-c", "protocol.ext.allow=never", "-c", "core.sshCommand=ssh -o BatchMode=yes", "-c", "advice.detachedHead=false"}

// Git runs git with the safe settings, outside any sandbox.
type Git struct {
	// Env is added to each command's environment (tests: GIT_* overrides).
	Env []string
}

// MaxDiffBytes bounds what one diff may make the node hold or write: each
// file a sandbox's patch makes on the node's workspace, and the staged
// diff's text that the checks read (TextDiff). A patch is at most 64 MiB
// (agent.MaxPatchBytes), but its binary hunks are deflated: a file of
// zeros a thousand times that size fits in one. MaxLiteralBytes bounds
// the sum of the sizes a patch's binary hunks declare, forward and
// reverse: git apply inflates and holds them all before it writes a file.
const (
	MaxDiffBytes    = 64 << 20
	MaxLiteralBytes = 4 * MaxDiffBytes
)

// applyTimeout and applyMemory bound git apply of a sandbox's patch, in
// time and address space (RLIMIT_AS): its inflated binary hunks (at most
// MaxLiteralBytes), the patch, the files it patches and their results,
// which it holds all at once, and a delta hunk's result, whose size is
// not declared. Over either, Apply fails with ErrDiffTooLarge. Variables
// for the tests.
var (
	applyTimeout        = 5 * time.Minute
	applyMemory  uint64 = 1 << 30
)

// ErrDiffTooLarge is a diff over MaxDiffBytes or MaxLiteralBytes: the
// model's to make smaller (leave large or generated files out).
var ErrDiffTooLarge = errors.New("the diff is too large to check")

// run runs git in dir (may be "") and returns its stdout.
func (g Git) run(ctx context.Context, dir string, auth *Auth, remote string, stdin []byte, args ...string) ([]byte, error) {
	return g.runLimited(ctx, dir, auth, remote, stdin, limits{}, args...)
}

// limits bound one git run: its stdout (maxOut, 0 for none), each file
// it writes (fileSize, as RLIMIT_FSIZE, 0 for none) and its address space
// (memory, as RLIMIT_AS, 0 for none). Over any, the run fails with
// ErrDiffTooLarge, or over maxOut with tooLarge if set. stdout, if set,
// takes the run's stdout instead (the run returns none); when a write to
// it fails, git is stopped and the run fails with that error. outHint is
// the stdout expected, to size its buffer once.
type limits struct {
	maxOut   int
	fileSize uint64
	memory   uint64
	tooLarge error
	stdout   io.Writer
	outHint  int
}

// gatedReader holds its reads until open is closed: a child's stdin,
// kept from it until its limits are set.
type gatedReader struct {
	r    io.Reader
	open <-chan struct{}
}

func (g *gatedReader) Read(p []byte) (int, error) {
	<-g.open
	return g.r.Read(p)
}

// failWriter writes to w; when a write fails, it calls fail with the
// error, once.
type failWriter struct {
	w    io.Writer
	fail func(error)
	err  error
}

func (f *failWriter) Write(p []byte) (int, error) {
	if f.err != nil {
		return 0, f.err
	}
	n, err := f.w.Write(p)
	if err != nil {
		f.err = err
		f.fail(err)
	}
	return n, err
}

// capWriter keeps at most max bytes; past that it calls over and fails
// the write.
type capWriter struct {
	buf  *bytes.Buffer
	max  int
	over func()
}

func (w *capWriter) Write(p []byte) (int, error) {
	if w.buf.Len()+len(p) > w.max {
		w.over()
		return 0, ErrDiffTooLarge
	}
	return w.buf.Write(p)
}

// runLimited is run within lim.
func (g Git) runLimited(ctx context.Context, dir string, auth *Auth, remote string, stdin []byte, lim limits, args ...string) ([]byte, error) {
	argv := append(append([]string(nil), safe...), args...)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cmd := exec.CommandContext(ctx, "git", argv...)
	cmd.Dir = dir
	cmd.Env = append([]string{"GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null", "HOME=/nonexistent", "GIT_TERMINAL_PROMPT=0",
		"GIT_ASKPASS=/bin/false", "SSH_ASKPASS=/bin/false", "LC_ALL=C", "PATH=/usr/local/bin:/usr/bin:/bin"}, g.Env...)
	if auth != nil && auth.Token != "" && remote != "" {
		// git matches the header against the URL it was given, not the
		// one it ends up at: after a redirect (git follows the first by
		// default) it would send the token to the other host. A
		// repository the forge moved then fails to fetch instead.
		cmd.Env = append(cmd.Env, "GIT_CONFIG_COUNT=2", "GIT_CONFIG_KEY_0=http."+remote+".extraHeader",
			"GIT_CONFIG_VALUE_0=Authorization: Basic "+auth.basic(), "GIT_CONFIG_KEY_1=http.followRedirects", "GIT_CONFIG_VALUE_1=false")
	}
	gate := make(chan struct{})
	defer func() {
		select {
		case <-gate:
		default:
			close(gate)
		}
	}()
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
		if lim.fileSize > 0 || lim.memory > 0 {
			cmd.Stdin = &gatedReader{r: bytes.NewReader(stdin), open: gate}
		}
	}
	var out bytes.Buffer
	var errb headTail
	cmd.Stdout, cmd.Stderr = &out, &errb
	over := false // read after Wait, which waits for the stdout copy
	var outErr error
	switch {
	case lim.stdout != nil:
		cmd.Stdout = &failWriter{w: lim.stdout, fail: func(err error) { outErr = err; cancel() }}
	case lim.maxOut > 0:
		out.Grow(min(lim.outHint, lim.maxOut))
		cmd.Stdout = &capWriter{buf: &out, max: lim.maxOut, over: func() { over = true; cancel() }}
	}
	err := cmd.Start()
	// Set on the child just after its start, before it gets its stdin (the
	// patch, which git apply reads whole, then inflates and applies):
	// what it does before is start up. Failing to set one fails the run.
	for _, l := range []struct {
		what     string
		resource int
		v        uint64
	}{{"file size", unix.RLIMIT_FSIZE, lim.fileSize}, {"memory", unix.RLIMIT_AS, lim.memory}} {
		if err != nil || l.v == 0 {
			continue
		}
		rl := unix.Rlimit{Cur: l.v, Max: l.v}
		if perr := unix.Prlimit(cmd.Process.Pid, l.resource, &rl, nil); perr != nil {
			cancel()
			close(gate)
			_ = cmd.Wait()
			return nil, fmt.Errorf("git %s: limit its %s: %w", args[0], l.what, perr)
		}
	}
	if err == nil {
		close(gate)
		err = cmd.Wait()
	}
	if over {
		tooLarge := lim.tooLarge
		if tooLarge == nil {
			tooLarge = ErrDiffTooLarge
		}
		return nil, fmt.Errorf("git %s: %w: its output is over %d bytes", args[0], tooLarge, lim.maxOut)
	}
	if outErr != nil {
		return nil, fmt.Errorf("git %s: %w", args[0], outErr)
	}
	if err != nil && lim.fileSize > 0 && fileTooLarge(err, errb.String()) {
		return nil, fmt.Errorf("git %s: %w: a file would be over %d bytes", args[0], ErrDiffTooLarge, lim.fileSize)
	}
	if err != nil && lim.memory > 0 && outOfMemory(errb.String()) {
		return nil, fmt.Errorf("git %s: %w: it would need over %d bytes of memory", args[0], ErrDiffTooLarge, lim.memory)
	}
	if err != nil {
		// A forge or proxy may echo the Authorization header it got (a
		// text/plain 403 body, which git prints as "remote: " lines): in
		// the form git sent it, the base64 of user:token.
		msg := errb.text(auth.secrets())
		return nil, fmt.Errorf("git %s: %v: %s", args[0], err, msg)
	}
	return out.Bytes(), nil
}

// fileTooLarge reports whether a git run ended on RLIMIT_FSIZE: killed by
// SIGXFSZ, or (with the signal ignored) failing a write with EFBIG.
func fileTooLarge(err error, stderr string) bool {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGXFSZ {
			return true
		}
	}
	return strings.Contains(stderr, "File too large")
}

// outOfMemory reports whether git's stderr says it died of RLIMIT_AS (an
// allocation, an mmap or zlib's inflate failed).
func outOfMemory(stderr string) bool {
	s := strings.ToLower(stderr)
	return strings.Contains(s, "out of memory") || strings.Contains(s, "mmap failed") || strings.Contains(s, "cannot allocate memory")
}

// Cache is a node's clone cache: one bare mirror per repository, fetched
// on demand.
type Cache struct {
	Dir  string // the mirrors live in Dir/<hash>.git
	Git  Git
	Auth func(repo string) *Auth // nil or nil result: anonymous

	mu    sync.Mutex
	locks map[string]*sync.Mutex
}

func (c *Cache) lock(key string) func() {
	c.mu.Lock()
	if c.locks == nil {
		c.locks = map[string]*sync.Mutex{}
	}
	l := c.locks[key]
	if l == nil {
		l = &sync.Mutex{}
		c.locks[key] = l
	}
	c.mu.Unlock()
	l.Lock()
	return l.Unlock
}

// CheckRepo checks a repository's name: an http(s), ssh, git or file URL,
// scp-like user@host:path, or an absolute path on the node. A URL carries
// no credentials (user info), but an ssh URL may name its user.
func CheckRepo(repo string) error {
	switch {
	case repo == "":
		return errors.New("required")
	case strings.HasPrefix(repo, "-"):
		return fmt.Errorf("%q must not start with -", repo)
	case strings.ContainsAny(repo, "\x00\n\r"):
		return errors.New("contains a control character")
	case filepath.IsAbs(repo):
		return nil
	}
	// Checked on the text, before any parse, so that no later error (nor
	// a caller's, which quotes the repository) repeats a token: the URL
	// ends up in events and logs.
	if shown, bad := api.RepoCredential(repo); bad {
		return fmt.Errorf("%q: the URL's user info (before @) must be empty: credentials go in the node's forge token (WARREN_FORGE_TOKEN), not in the repository URL", shown)
	}
	if u, err := url.Parse(repo); err == nil && u.Scheme != "" {
		switch u.Scheme {
		case "http", "https", "ssh", "git", "file":
			return nil
		}
		return fmt.Errorf("%q: scheme %s is not http, https, ssh, git or file", repo, u.Scheme)
	}
	if api.ScpLikeRepo.MatchString(repo) {
		return nil
	}
	return fmt.Errorf("%q is not a URL, user@host:path or absolute path", repo)
}

// Path is where repo's mirror is (it may not exist yet).
func (c *Cache) Path(repo string) string {
	sum := sha256.Sum256([]byte(repo))
	return filepath.Join(c.Dir, hex.EncodeToString(sum[:12])+".git")
}

// Mirror returns the bare mirror of repo, creating it on first use, and
// fetches it unless it already holds want (a commit id; "" always
// fetches).
func (c *Cache) Mirror(ctx context.Context, repo, want string) (string, error) {
	if err := CheckRepo(repo); err != nil {
		return "", fmt.Errorf("repo: %w", err)
	}
	dir := c.Path(repo)
	defer c.lock(dir)()
	var auth *Auth
	if c.Auth != nil {
		auth = c.Auth(repo)
	}
	if _, err := os.Stat(filepath.Join(dir, "HEAD")); err != nil {
		if err := os.MkdirAll(c.Dir, 0o700); err != nil {
			return "", err
		}
		tmp, err := os.MkdirTemp(c.Dir, "new-")
		if err != nil {
			return "", err
		}
		defer os.RemoveAll(tmp)
		if _, err := c.Git.run(ctx, "", nil, "", nil, "init", "--quiet", "--bare", tmp); err != nil {
			return "", err
		}
		for _, kv := range [][]string{{"remote.origin.url", repo}, {"remote.origin.fetch", "+refs/heads/*:refs/heads/*"},
			{"remote.origin.tagOpt", "--no-tags"}, {"gc.auto", "0"}} {
			if _, err := c.Git.run(ctx, tmp, nil, "", nil, "config", kv[0], kv[1]); err != nil {
				return "", err
			}
		}
		if _, err := c.Git.run(ctx, tmp, nil, "", nil, "config", "--add", "remote.origin.fetch", "+refs/tags/*:refs/tags/*"); err != nil {
			return "", err
		}
		if err := c.fetch(ctx, tmp, repo, want, auth); err != nil {
			return "", err
		}
		if err := os.Rename(tmp, dir); err != nil {
			return "", err
		}
		return dir, nil
	}
	if c.has(ctx, dir, want) {
		return dir, nil // already here: commits never change
	}
	return dir, c.fetch(ctx, dir, repo, want, auth)
}

// has reports whether the mirror in dir holds want, a full commit id.
func (c *Cache) has(ctx context.Context, dir, want string) bool {
	if !isHex(want) || len(want) < 40 {
		return false
	}
	_, err := c.Git.run(ctx, dir, nil, "", nil, "cat-file", "-e", want+"^{commit}")
	return err == nil
}

// fetch fetches the remote's branches and tags into the mirror in dir,
// then want (a full commit id, or "") by its id if no branch or tag
// brought it: a task's pinned commit may be on none any more (its base
// was force-pushed), and a task resuming on another node still needs it.
func (c *Cache) fetch(ctx context.Context, dir, repo, want string, auth *Auth) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	_, err := c.Git.run(ctx, dir, auth, remoteURL(repo), nil, "fetch", "--quiet", "--prune", "--no-recurse-submodules",
		"--upload-pack="+serverSide(repo, "upload-pack"), "origin")
	if err != nil {
		return fmt.Errorf("fetch %s: %w", repo, err)
	}
	if isHex(want) && len(want) >= 40 && !c.has(ctx, dir, want) {
		// Into a ref of its own, outside the fetch refspecs (so --prune
		// leaves it): the commit stays reachable in the mirror.
		_, err := c.Git.run(ctx, dir, auth, remoteURL(repo), nil, "fetch", "--quiet", "--no-recurse-submodules",
			"--upload-pack="+serverSide(repo, "upload-pack"), "origin", "+"+want+":refs/pinned/"+want)
		if err != nil {
			return fmt.Errorf("fetch %s: commit %s is on no branch or tag, and fetching it by id failed: %w", repo, want, err)
		}
	}
	// Point HEAD at the remote's default branch (a bare init names one
	// that may not exist there).
	if out, err := c.Git.run(ctx, dir, auth, remoteURL(repo), nil, "ls-remote", "--symref", "origin", "HEAD"); err == nil {
		for _, line := range strings.Split(string(out), "\n") {
			if ref, ok := strings.CutPrefix(line, "ref: "); ok {
				if name, _, ok := strings.Cut(ref, "\t"); ok && strings.HasPrefix(name, "refs/heads/") {
					_, _ = c.Git.run(ctx, dir, nil, "", nil, "symbolic-ref", "HEAD", name)
				}
			}
		}
	}
	return nil
}

// serverSide is the command git runs for the other end of a fetch or
// push (upload-pack, receive-pack). For a repository on this node that end
// runs here, in the repository, under its config: it gets our settings, so
// its hooks and fsmonitor do not run. Elsewhere it is the remote's own
// business, and git's default.
func serverSide(repo, cmd string) string {
	if filepath.IsAbs(repo) || strings.HasPrefix(repo, "file://") {
		return "git -c core.fsmonitor=false -c core.hooksPath=/dev/null " + cmd
	}
	return "git-" + cmd
}

// remoteURL is the URL git matches http.<url>.extraHeader against ("" for
// non-HTTP remotes, which get no header).
func remoteURL(repo string) string {
	if strings.HasPrefix(repo, "http://") || strings.HasPrefix(repo, "https://") {
		return repo
	}
	return ""
}

func isHex(s string) bool {
	for _, c := range s {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
			return false
		}
	}
	return s != ""
}

// Resolve finds the commit a task's base names in a mirror. A full or
// abbreviated hex id is looked up only among objects: a branch or tag
// named like a commit id never stands in for it. Other names are a
// branch, a tag, a full ref, or HEAD (the default branch).
func (g Git) Resolve(ctx context.Context, mirror, base string) (string, error) {
	switch {
	case base == "":
		return "", errors.New("base: required")
	case strings.HasPrefix(base, "-") || strings.ContainsAny(base, " \t\n\x00:^~?*[\\") || strings.Contains(base, ".."):
		return "", fmt.Errorf("base: %q is not a commit id, branch, tag or ref", base)
	case isHex(base) && len(base) >= 7 && len(base) <= 64:
		out, err := g.run(ctx, mirror, nil, "", nil, "rev-parse", "--disambiguate="+strings.ToLower(base))
		if err != nil {
			return "", fmt.Errorf("base %s: %w", base, err)
		}
		var commits []string
		for _, id := range strings.Fields(string(out)) {
			if t, err := g.run(ctx, mirror, nil, "", nil, "cat-file", "-t", id); err == nil && strings.TrimSpace(string(t)) == "commit" {
				commits = append(commits, id)
			}
		}
		switch len(commits) {
		case 0:
			return "", fmt.Errorf("base %s: no such commit", base)
		case 1:
			return commits[0], nil
		}
		return "", fmt.Errorf("base %s: %d commits start with it; give more of the id", base, len(commits))
	}
	for _, ref := range []string{base, "refs/heads/" + base, "refs/tags/" + base} {
		if ref == base && base != "HEAD" && !strings.HasPrefix(base, "refs/") {
			continue
		}
		if out, err := g.run(ctx, mirror, nil, "", nil, "rev-parse", "--verify", "--quiet", "--end-of-options", ref+"^{commit}"); err == nil {
			return strings.TrimSpace(string(out)), nil
		}
	}
	return "", fmt.Errorf("base %q: no such branch, tag or commit", base)
}

// Workspace is a task's working copy on the node, at its pinned commit.
type Workspace struct {
	Dir    string
	Commit string // the pinned base commit
	git    Git
	repo   string // the repository, for errors ("": Dir)
	size   int    // the tree's archive, as Checkout counted it (0: not counted)
}

// Checkout makes a workspace in dir (which must not exist) at commit, from
// a mirror, and verifies that HEAD is that commit. A tree over
// MaxTreeBytes (ErrTreeTooLarge) is refused before any file is written.
func (g Git) Checkout(ctx context.Context, mirror, commit, dir string) (*Workspace, error) {
	if !isHex(commit) || len(commit) < 40 {
		return nil, fmt.Errorf("checkout: %q is not a full commit id", commit)
	}
	if _, err := g.run(ctx, "", nil, "", nil, "clone", "--quiet", "--no-checkout", "--no-tags", mirror, dir); err != nil {
		return nil, err
	}
	// The repository's attributes do not change what the sandbox gets:
	// git archive would drop export-ignore paths (often the tests) and
	// expand export-subst.
	if err := os.MkdirAll(filepath.Join(dir, ".git", "info"), 0o755); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, ".git", "info", "attributes"), []byte("* -export-ignore -export-subst\n"), 0o644); err != nil {
		return nil, err
	}
	repo := mirror
	if out, err := g.run(ctx, mirror, nil, "", nil, "config", "--get", "remote.origin.url"); err == nil && len(bytes.TrimSpace(out)) > 0 {
		repo = string(bytes.TrimSpace(out))
	}
	// Counted from the tree's listing, which git streams and is stopped
	// once the count is over: a tree of many GB is a few KB of objects.
	size := newTreeSize(MaxTreeBytes)
	if _, err := g.runLimited(ctx, dir, nil, "", nil, limits{stdout: size}, "ls-tree", "-r", "-t", "-l", "-z", "--full-tree", commit); err != nil {
		if errors.Is(err, ErrTreeTooLarge) {
			return nil, treeTooLarge("checkout", repo, commit)
		}
		return nil, err
	}
	if _, err := g.run(ctx, dir, nil, "", nil, "checkout", "--quiet", "--detach", commit); err != nil {
		return nil, err
	}
	out, err := g.run(ctx, dir, nil, "", nil, "rev-parse", "--verify", "HEAD")
	if err != nil {
		return nil, err
	}
	if head := strings.TrimSpace(string(out)); head != commit {
		return nil, fmt.Errorf("checkout: HEAD is %s, not the pinned %s", head, commit)
	}
	return &Workspace{Dir: dir, Commit: commit, git: g, repo: repo, size: size.n}, nil
}

// Tar is the workspace's tree at its commit as a tar stream (no .git),
// for copying into a sandbox. Past MaxTreeBytes it stops git and fails
// with ErrTreeTooLarge.
func (w *Workspace) Tar(ctx context.Context) ([]byte, error) {
	tar, err := w.git.runLimited(ctx, w.Dir, nil, "", nil, limits{maxOut: MaxTreeBytes, tooLarge: ErrTreeTooLarge, outHint: w.size},
		"archive", "--format=tar", w.Commit)
	if errors.Is(err, ErrTreeTooLarge) {
		repo := w.repo
		if repo == "" {
			repo = w.Dir
		}
		return nil, treeTooLarge("archive", repo, w.Commit)
	}
	return tar, err
}

// Apply applies a patch (from the sandbox, so untrusted) to the workspace,
// reset to its commit first, and returns the diff the workspace now has
// against the commit: what the checks see and a push would carry. git
// apply refuses paths outside the tree and inside .git; checkPatch refuses
// first what would make it hold or do far more than the patch's size
// says (ErrDiffTooLarge) and what git diff never writes (ErrBadPatch).
func (w *Workspace) Apply(ctx context.Context, patch []byte) ([]byte, error) {
	// A git apply killed by its limits (a file too large, its memory, its
	// deadline) leaves the index locked, and every git after it would fail
	// on the lock. Only the task's actor uses its workspace, so a lock
	// here is a dead git's.
	if err := os.Remove(filepath.Join(w.Dir, ".git", "index.lock")); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	if _, err := w.git.run(ctx, w.Dir, nil, "", nil, "reset", "--quiet", "--hard", w.Commit); err != nil {
		return nil, err
	}
	if _, err := w.git.run(ctx, w.Dir, nil, "", nil, "clean", "-qfdx"); err != nil {
		return nil, err
	}
	if err := checkPatch(patch); err != nil {
		if errors.Is(err, ErrDiffTooLarge) {
			return nil, err
		}
		return nil, fmt.Errorf("the sandbox's diff does not apply to the base commit: %w", err)
	}
	if len(bytes.TrimSpace(patch)) > 0 {
		actx, cancel := context.WithTimeout(ctx, applyTimeout)
		_, err := w.git.runLimited(actx, w.Dir, nil, "", patch, limits{fileSize: MaxDiffBytes, memory: applyMemory}, "apply", "--index", "--binary", "--whitespace=nowarn", "-")
		late := errors.Is(actx.Err(), context.DeadlineExceeded) && ctx.Err() == nil
		cancel()
		switch {
		case err == nil:
		case errors.Is(err, ErrDiffTooLarge):
			return nil, err
		case late:
			return nil, fmt.Errorf("%w: git apply ran over %v", ErrDiffTooLarge, applyTimeout)
		default:
			return nil, fmt.Errorf("the sandbox's diff does not apply to the base commit: %w", err)
		}
	}
	diff, err := w.Staged(ctx)
	if err != nil {
		return nil, err
	}
	// git apply may skip a corrupt part (a truncated binary hunk) and still
	// succeed: the result must hold every file the patch names.
	got := map[string]bool{}
	for _, f := range ParseDiff(diff) {
		got[f.Path] = true
	}
	for _, f := range ParseDiff(patch) {
		if !got[f.Path] {
			return nil, fmt.Errorf("the sandbox's diff did not apply whole: %s is missing from the result", f.Path)
		}
	}
	return diff, nil
}

// Staged is the workspace's staged diff against its commit, binary files
// included: what a commit of the index would carry.
func (w *Workspace) Staged(ctx context.Context) ([]byte, error) {
	return w.git.run(ctx, w.Dir, nil, "", nil, "diff", "--cached", "--binary", "--no-color", "--no-ext-diff", "--no-renames", w.Commit)
}

// TextDiff is the workspace's staged diff with every file as text (after
// Apply): what the checks read, so a file marked binary (by its content or
// by .gitattributes) cannot hide a secret or its size. Over MaxDiffBytes
// it fails with ErrDiffTooLarge.
func (w *Workspace) TextDiff(ctx context.Context) ([]byte, error) {
	return w.git.runLimited(ctx, w.Dir, nil, "", nil, limits{maxOut: MaxDiffBytes}, "diff", "--cached", "--text", "--no-color", "--no-ext-diff", "--no-textconv", "--no-renames", w.Commit)
}

// DiffSHA256 is the hex SHA-256 of a diff: what an approval binds to.
func DiffSHA256(diff []byte) string {
	s := sha256.Sum256(diff)
	return hex.EncodeToString(s[:])
}
