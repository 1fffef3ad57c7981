package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"
	"unicode"

	"github.com/warrenhq/warren/api/textcut"
	"github.com/warrenhq/warren/forge"
)

// Workspace is a task's working copy on the node (forge's).
type Workspace = forge.Workspace

// CheckConfig is what the diff checks look for (forge's).
type CheckConfig = forge.CheckConfig

// Report is the diff checks' verdict (forge's).
type Report = forge.Report

// GitService is a node's git outside the sandboxes: its clone cache, the
// task workspaces, the diff checks, the push and the forge. Its
// credential never reaches a sandbox, an event or a log.
type GitService struct {
	Cache  *forge.Cache
	Forge  forge.Forge // nil: the pull request is recorded, not opened
	Auth   *forge.Auth // for fetch and push over HTTP(S); nil: anonymous
	Checks forge.CheckConfig
	Draft  bool // open pull requests as drafts
	// Hosts are the forge's git hosts (host or host:port): only their
	// https repositories (http on loopback) get Auth, and only their
	// repositories get a pull request on Forge. Others are fetched and
	// pushed anonymously, and their PR is recorded only.
	Hosts []string
	// AllowLocal lets tasks name repositories on the node (absolute
	// paths, file://): warren dev and tests; a shared node refuses them,
	// or any tenant could read any repository the node can.
	AllowLocal bool
}

// NewGitService makes a node's git service keeping its mirrors under dir.
func NewGitService(dir string, f forge.Forge, auth *forge.Auth, checks forge.CheckConfig, draft bool) *GitService {
	g := &GitService{Cache: &forge.Cache{Dir: filepath.Join(dir, "mirrors")}, Forge: f, Auth: auth, Checks: checks, Draft: draft}
	g.Cache.Auth = g.authFor
	return g
}

// onForge reports whether repo is on one of the forge's hosts.
func (g *GitService) onForge(repo string) bool {
	u, err := url.Parse(repo)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.User != nil {
		return false
	}
	if u.Scheme == "http" && !isLoopback(u.Hostname()) {
		return false // no token in clear text over a network
	}
	for _, h := range g.Hosts {
		if strings.EqualFold(h, u.Host) || (!strings.Contains(h, ":") && strings.EqualFold(h, u.Hostname()) && u.Port() == "") {
			return true
		}
	}
	return false
}

func isLoopback(host string) bool {
	ip := net.ParseIP(host)
	return host == "localhost" || (ip != nil && ip.IsLoopback())
}

// authFor is the credential for repo: the token, only on the forge's hosts.
func (g *GitService) authFor(repo string) *forge.Auth {
	if g.Auth == nil || !g.onForge(repo) {
		return nil
	}
	return g.Auth
}

// checkRepo refuses repositories on the node unless they are allowed.
func (g *GitService) checkRepo(repo string) error {
	if err := forge.CheckRepo(repo); err != nil {
		return fmt.Errorf("repo: %w", err)
	}
	if !g.AllowLocal && (filepath.IsAbs(repo) || strings.HasPrefix(repo, "file:")) {
		return fmt.Errorf("repo: %q is on the node, and this node takes only remote repositories (warren node --allow-local-repos)", repo)
	}
	return nil
}

// Checkout makes a task's workspace in dir: from the clone cache (fetched
// when it lacks the commit), at the commit base names (pinned, when the
// task already has one: a resumed task uses its first commit even if its
// branch moved), with HEAD verified.
func (g *GitService) Checkout(ctx context.Context, repo, base, pinned, dir string) (*forge.Workspace, error) {
	if err := g.checkRepo(repo); err != nil {
		return nil, err
	}
	mirror, err := g.Cache.Mirror(ctx, repo, pinned)
	if err != nil {
		return nil, err
	}
	commit := pinned
	if commit == "" {
		if base == "" {
			base = "HEAD"
		}
		if commit, err = g.Cache.Git.Resolve(ctx, mirror, base); err != nil {
			return nil, err
		}
	}
	if err := os.RemoveAll(dir); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
		return nil, err
	}
	return g.Cache.Git.Checkout(ctx, mirror, commit, dir)
}

// BaseBranch is the branch a task's pull request merges into: its base
// when that is a branch of the repository, else the repository's default
// branch.
func (g *GitService) BaseBranch(ctx context.Context, repo, base string) string {
	mirror := g.Cache.Path(repo)
	if base != "" && base != "HEAD" && g.Cache.Git.IsBranch(ctx, mirror, strings.TrimPrefix(base, "refs/heads/")) {
		return strings.TrimPrefix(base, "refs/heads/")
	}
	if b := g.Cache.Git.DefaultBranch(ctx, mirror); b != "" {
		return b
	}
	return "main"
}

// ErrDiffTooLarge is forge.ErrDiffTooLarge, for the node (which imports
// agent, not forge): a diff too large for the node to apply or read, the
// model's to make smaller.
var ErrDiffTooLarge = forge.ErrDiffTooLarge

// Review puts the sandbox's patch on the workspace and checks the result:
// the diff returned is exactly what a push would carry.
func (g *GitService) Review(ctx context.Context, ws *forge.Workspace, patch string, testsRequested bool) ([]byte, *forge.Report, error) {
	diff, err := ws.Apply(ctx, []byte(patch))
	if err != nil {
		return nil, nil, err
	}
	text, err := ws.TextDiff(ctx)
	if err != nil {
		return nil, nil, err
	}
	cfg := g.Checks
	cfg.TestsRequested = testsRequested
	r, err := forge.Check(text, cfg)
	if err != nil {
		return nil, nil, err
	}
	r.SHA256 = forge.DiffSHA256(diff) // the approval binds the diff pushed
	return diff, r, nil
}

// PRContent is what a pull request says.
type PRContent struct {
	TaskID      string
	IssueTitle  string
	IssueBody   string
	Finish      *Finish
	TestCommand string
	TestOutput  string // an excerpt of the last test run
	Report      *forge.Report
}

// Published is where a task's change went: its PR record.
type Published struct {
	Forge   string             `json:"forge"` // "none": recorded here, not opened on a forge
	Repo    string             `json:"repo"`
	Remote  string             `json:"remote"`
	Branch  string             `json:"head"`
	Base    string             `json:"base"`
	Commit  string             `json:"commit"`
	DiffSHA string             `json:"diff_sha256"`
	Title   string             `json:"title"`
	Body    string             `json:"body"`
	Draft   bool               `json:"draft"`
	PR      *forge.PullRequest `json:"pull_request,omitempty"`
	Flags   []forge.Finding    `json:"findings,omitempty"`
}

// Publish commits what Review put on the workspace, pushes
// agent/<task-id> to the task's repository and opens (or finds) its pull
// request. c.Report is Review's verdict; the workspace must still hold that
// diff (its SHA-256 is checked). A diff the checks block is refused; one
// that needs an approval is refused unless its SHA-256 is approvedSHA, the
// diff a person approved. The commit's time is fixed (when), so a retry
// pushes the same commit and finds the same pull request.
func (g *GitService) Publish(ctx context.Context, ws *forge.Workspace, c PRContent, repo, base, approvedSHA string, when time.Time) (*Published, error) {
	r := c.Report
	if r == nil {
		return nil, errors.New("publish: the diff was not reviewed")
	}
	staged, err := ws.Staged(ctx)
	if err != nil {
		return nil, err
	}
	switch {
	case forge.DiffSHA256(staged) != r.SHA256:
		return nil, errors.New("publish: the workspace no longer holds the reviewed diff")
	case r.Files == 0:
		return nil, errors.New("publish: the diff is empty")
	case r.Blocked:
		return nil, errors.New("publish: the diff checks block it")
	case r.NeedsApproval && approvedSHA != r.SHA256:
		return nil, fmt.Errorf("publish: the diff (SHA-256 %s) is not the one approved (%s)", r.SHA256, orDefault(approvedSHA, "none"))
	}
	// The model writes the tests, so it writes their output: a credential
	// it prints (built at run time, which no diff check sees) goes into
	// the pull request redacted.
	if c.TestOutput, _, err = forge.RedactText(c.TestOutput); err != nil {
		return nil, fmt.Errorf("publish: the test output: %w", err)
	}
	p := &Published{Forge: "none", Repo: repo, Remote: repo, Branch: forge.BranchFor(c.TaskID), Base: base, DiffSHA: r.SHA256,
		Title: prTitle(c), Body: prBody(c), Draft: g.Draft, Flags: r.Findings}
	msg := p.Title + "\n\n" + strings.TrimSpace(orDefault(c.Finish.summary(), "")) + "\n\nTask: " + c.TaskID + "\n"
	if p.Commit, err = ws.CommitIndex(ctx, msg, when); err != nil {
		return nil, err
	}
	if err := g.checkRepo(repo); err != nil {
		return nil, err
	}
	if err := ws.Push(ctx, repo, g.authFor(repo), p.Branch, p.Commit); err != nil {
		return nil, err
	}
	if g.Forge == nil || !g.onForge(repo) {
		return p, nil // the PR record only
	}
	ref, err := forge.RepoFromURL(repo)
	if err != nil {
		return nil, err
	}
	p.Forge = g.Forge.Name()
	if p.PR, err = g.Forge.EnsurePR(ctx, forge.PRRequest{Repo: ref, Head: p.Branch, Base: base, Title: p.Title, Body: p.Body, Draft: g.Draft}); err != nil {
		return nil, err
	}
	return p, nil
}

// TestsRequested tells from an issue's text whether it asks for test
// edits (then the checks do not flag them): it mentions tests, as a word
// ("test", "tests", "unit-test", "unittest", "pytest", "testing",
// "calc_test.go", "test_calc.py"), not as a part of one ("latest",
// "fastest", "attestation").
func TestsRequested(issue string) bool {
	return testsWord.MatchString(issue)
}

var testsWord = regexp.MustCompile(`(?i)\b(unit[- ]?|py)?tests?\b|\btesting\b|_test\b|\btest_`)

// RetryAfter is how long the forge asked the caller to wait before the
// next try of a publish that failed (a rate limit), if it did.
func RetryAfter(err error) (time.Duration, bool) { return forge.RetryAfter(err) }

// Secrets scans what the model wrote at its finish (summary, cause, fix),
// which goes into the commit message and the pull request where no diff
// check sees it, for credentials.
func (f *Finish) Secrets() ([]forge.Finding, error) {
	return forge.ScanText("finish", f.Summary+"\n"+f.Cause+"\n"+f.Fix)
}

// ControlChar reports the first control character (a NUL, an escape, a
// carriage return: any but a newline or a tab) in the finish's summary,
// cause or fix, which go into the commit message and the pull request:
// git commit refuses a NUL, and would on every retry. It says in which
// field and where; nil when there is none.
func (f *Finish) ControlChar() error {
	for _, fld := range []struct{ name, text string }{{"summary", f.Summary}, {"cause", f.Cause}, {"fix", f.Fix}} {
		for i, r := range fld.text {
			if unicode.IsControl(r) && r != '\n' && r != '\t' {
				return fmt.Errorf("%s holds the control character %U at byte %d", fld.name, r, i)
			}
		}
	}
	return nil
}

func (f *Finish) summary() string { // nil-safe
	if f == nil {
		return ""
	}
	return f.Summary
}

// prTitle is the pull request's title.
func prTitle(c PRContent) string {
	t := strings.TrimSpace(c.IssueTitle)
	if t == "" {
		t = "Agent change"
	}
	if len(t) > 200 {
		t = textcut.Head(t, 200)
	}
	return "Fix: " + t
}

// prBody is the pull request's description: every finding of the checks
// first, then the summary, the cause and the fix from the model's finish
// and an excerpt of the test log. The model writes the finish and the
// test log, so they come after the findings, their "<" is escaped (no
// HTML, no comment that hides what follows) and the log is fenced with
// more backticks than it holds in a row. Over maxPRBody it is cut, with a
// note, before its last line.
func prBody(c PRContent) string {
	var b strings.Builder
	if r := c.Report; r != nil {
		fmt.Fprintf(&b, "## Checks\n\n%d files, +%d −%d lines; diff SHA-256 `%s`.\n\n", r.Files, r.Added, r.Deleted, r.SHA256)
		if len(r.Findings) == 0 {
			b.WriteString("No findings.\n\n")
		}
		for _, fd := range r.Findings {
			loc := fd.Path
			if fd.Line > 0 {
				loc += fmt.Sprintf(":%d", fd.Line)
			}
			if loc != "" {
				loc = " " + codeSpan(loc)
			}
			fmt.Fprintf(&b, "- **%s** (%s)%s: %s\n", fd.Kind, fd.Action, loc, mdText(fd.Message))
		}
		if len(r.Findings) > 0 {
			b.WriteString("\n")
		}
	}
	f := c.Finish
	if f == nil {
		f = &Finish{}
	}
	fmt.Fprintf(&b, "## Summary\n\n%s\n\n", orDefault(mdText(f.Summary), "(none given)"))
	if f.Cause != "" {
		fmt.Fprintf(&b, "## Cause\n\n%s\n\n", mdText(f.Cause))
	}
	if f.Fix != "" {
		fmt.Fprintf(&b, "## Fix\n\n%s\n\n", mdText(f.Fix))
	}
	if c.TestCommand != "" {
		out := c.TestOutput
		if len(out) > 3000 {
			out = "…" + strings.ToValidUTF8(out[len(out)-3000:], "")
		}
		b.WriteString("## Tests\n\n")
		// The finish step runs the tests in a fresh sandbox holding the
		// repository at the base commit with only this diff applied, not
		// in the model's own: the PR says where they passed.
		if strings.ContainsAny(c.TestCommand, "\r\n") {
			fmt.Fprintf(&b, "The test command passed in %s:\n\n%s\n", cleanSandbox, fenced(c.TestCommand))
		} else {
			fmt.Fprintf(&b, "%s passed in %s:\n\n", codeSpan(c.TestCommand), cleanSandbox)
		}
		fmt.Fprintf(&b, "%s\n", fenced(out))
	}
	footer := fmt.Sprintf("---\nOpened by warren for task `%s`.\n", c.TaskID)
	body := b.String()
	if len(body)+len(footer) > maxPRBody {
		body = textcut.Head(body, maxPRBody-len(footer)-len(cutNote)) + cutNote
	}
	return body + footer
}

// maxPRBody bounds the pull request's description, in bytes (so in
// characters too): GitHub refuses one over 65,536 characters, and would
// on every publish try. The model's text can be any length, and mdText
// makes each "<" four characters.
const maxPRBody = 60000

// cutNote ends a description cut at maxPRBody.
const cutNote = "\n\n…(cut here: the description was over 60,000 characters; the task's log has the whole finish)\n\n"

// cleanSandbox is where the PR body says the tests passed.
const cleanSandbox = "a clean sandbox (the base commit with only this diff applied)"

// mdText is untrusted text for a Markdown body: trimmed, with "<"
// escaped, so it holds no HTML (an unclosed "<!--" would hide the rest
// of the body).
func mdText(s string) string {
	return strings.ReplaceAll(strings.TrimSpace(s), "<", "&lt;")
}

// longestRun is the length of the longest run of c in s.
func longestRun(s string, c byte) int {
	n, run := 0, 0
	for i := 0; i < len(s); i++ {
		if s[i] == c {
			run++
			n = max(n, run)
		} else {
			run = 0
		}
	}
	return n
}

// fenced is s in a fenced code block whose fence is longer than any run
// of backticks in s, so nothing in s closes it; it ends with a newline.
func fenced(s string) string {
	fence := strings.Repeat("`", max(3, longestRun(s, '`')+1))
	return fence + "\n" + strings.TrimRight(s, "\r\n") + "\n" + fence + "\n"
}

// codeSpan is s (one line) as inline code, delimited by more backticks
// than it holds in a row.
func codeSpan(s string) string {
	s = strings.NewReplacer("\r", " ", "\n", " ").Replace(s)
	tick := strings.Repeat("`", longestRun(s, '`')+1)
	if strings.HasPrefix(s, "`") || strings.HasSuffix(s, "`") {
		s = " " + s + " "
	}
	return tick + s + tick
}
