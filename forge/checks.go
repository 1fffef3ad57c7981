package forge

import (
	"bytes"
	"fmt"
	"io"
	"log"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/zricethezav/gitleaks/v8/detect"
)

// Finding kinds.
const (
	FindSecret   = "secret"    // a credential in an added line (gitleaks' rules)
	FindCIConfig = "ci_config" // an edit of CI configuration
	FindManifest = "manifest"  // an edit of a dependency manifest
	FindTests    = "tests"     // an edit of tests the task did not ask for
	FindSize     = "size"      // the diff or a file is over its cap
)

// Actions a finding can take.
const (
	Block   = "block"   // no push; the task fails and says why
	Approve = "approve" // a person approves the exact diff before the push
	Flag    = "flag"    // listed in the pull request, nothing more
)

// DefaultActions block secrets and oversized diffs, ask approval for CI
// and dependency edits, and flag test edits.
func DefaultActions() map[string]string {
	return map[string]string{FindSecret: Block, FindCIConfig: Approve, FindManifest: Approve, FindTests: Flag, FindSize: Block}
}

// Finding is one thing the checks found in a diff.
type Finding struct {
	Kind    string `json:"kind"`
	Action  string `json:"action"`
	Path    string `json:"path,omitempty"`
	Line    int    `json:"line,omitempty"` // in the new file, from 1
	Rule    string `json:"rule,omitempty"`
	Message string `json:"message"`
}

// CheckConfig says what the checks look for and what each kind does.
type CheckConfig struct {
	Actions        map[string]string // by kind; missing kinds take DefaultActions
	MaxFiles       int               // 0: 100
	MaxLines       int               // added plus deleted; 0: 5000
	MaxFileBytes   int               // of one file's new content; 0: 1 MiB
	TestsRequested bool              // the task asked for test edits: no tests finding
}

// Report is the checks' verdict on one diff.
type Report struct {
	SHA256        string    `json:"diff_sha256"`
	Files         int       `json:"files"`
	Added         int       `json:"added"`
	Deleted       int       `json:"deleted"`
	Findings      []Finding `json:"findings"`
	Blocked       bool      `json:"blocked"`
	NeedsApproval bool      `json:"needs_approval"`
}

// Capped is the report with at most n findings (blocking ones first),
// and how many were left out: what fits in an event.
func (r *Report) Capped(n int) (*Report, int) {
	if len(r.Findings) <= n {
		return r, 0
	}
	c := *r
	c.Findings = r.Findings[:n]
	return &c, len(r.Findings) - n
}

// FileDiff is one file of a diff.
type FileDiff struct {
	Path    string
	Deleted bool
	Binary  bool
	Bytes   int // binary: the new content's size when the patch says
	Added   []Line
	Removed int
	// Unreadable is set when a hunk's header has no line counts git
	// would write: its lines could not be read, and the diff is blocked.
	Unreadable bool
}

// Line is an added line and its number in the new file.
type Line struct {
	N    int
	Text string
}

// ParseDiff reads a git diff (as `git diff --binary` writes it) into its
// files' added lines. Inside a hunk it counts lines by the hunk's header,
// so an added line that looks like a file header ("++ b/x" added is
// "+++ b/x") is an added line, not a new path.
func ParseDiff(diff []byte) []FileDiff {
	var files []FileDiff
	var cur *FileDiff
	n := 0
	oldLeft, newLeft := 0, 0 // lines left in the current hunk
	inBinary := false
	for _, raw := range strings.Split(string(diff), "\n") {
		if oldLeft > 0 || newLeft > 0 {
			switch {
			case strings.HasPrefix(raw, "+"):
				cur.Added = append(cur.Added, Line{N: n, Text: raw[1:]})
				n++
				newLeft--
			case strings.HasPrefix(raw, "-"):
				cur.Removed++
				oldLeft--
			case strings.HasPrefix(raw, "\\"): // "\ No newline at end of file"
			default: // context (" ", or an empty line where a blank was trimmed)
				n++
				oldLeft--
				newLeft--
			}
			continue
		}
		switch {
		case strings.HasPrefix(raw, "diff --git "):
			files = append(files, FileDiff{Path: pathFromHeader(raw)})
			cur, inBinary = &files[len(files)-1], false
		case cur == nil:
		case strings.HasPrefix(raw, "deleted file mode"):
			cur.Deleted = true
		case strings.HasPrefix(raw, "+++ "):
			// git ends the name with a TAB when it has a space in it
			// ("+++ b/my app/package.json\t"), quoted or not.
			if p := strings.TrimSuffix(strings.TrimPrefix(raw, "+++ "), "\t"); p != "/dev/null" {
				cur.Path = strings.TrimPrefix(unquote(p), "b/")
			}
		case strings.HasPrefix(raw, "GIT binary patch"), strings.HasPrefix(raw, "Binary files "):
			cur.Binary, inBinary = true, true
		case inBinary && (strings.HasPrefix(raw, "literal ") || strings.HasPrefix(raw, "delta ")):
			if f := strings.Fields(raw); cur.Bytes == 0 && len(f) == 2 {
				if v, err := strconv.Atoi(f[1]); err == nil && v > 0 {
					cur.Bytes = v
				}
			}
		case strings.HasPrefix(raw, "@@ "):
			// @@ -a[,b] +c[,d] @@
			f := strings.Fields(raw)
			if len(f) < 3 {
				continue
			}
			var okOld, okNew bool
			oldLeft, okOld = hunkRange(f[1])
			newLeft, okNew = hunkRange(f[2])
			n = hunkStart(f[2])
			if !okOld || !okNew {
				// Not git's: the lines that follow cannot be told apart.
				// The checks block the diff (FileDiff.Unreadable).
				cur.Unreadable = true
			}
		}
	}
	return files
}

// hunkStart is c of "+c,d"; hunkRange is d (1 when absent).
func hunkStart(r string) int {
	start, _, _ := strings.Cut(r[1:], ",")
	v, _ := strconv.Atoi(start)
	return v
}

// Any count git can write is taken as it is (a file of 17 million lines
// has a hunk of 17 million); one that is not a count is reported (false).
func hunkRange(r string) (int, bool) {
	if len(r) < 2 {
		return 0, false
	}
	start, count, ok := strings.Cut(r[1:], ",")
	if v, err := strconv.Atoi(start); err != nil || v < 0 {
		return 0, false
	}
	if !ok {
		return 1, true
	}
	v, err := strconv.Atoi(count)
	if err != nil || v < 0 {
		return 0, false
	}
	return v, true
}

// pathFromHeader is the new path of a "diff --git a/<path> b/<path>"
// header: the only place it is written for a file without a "+++ b/" line
// (a deletion, a mode change, an empty new file). git C-quotes a path
// with a non-ASCII byte, a '"', a '\' or a control character, each name
// on its own ("a/x" "b/x"); a path with " b/" in it is split where the
// two names are the same, as git does.
func pathFromHeader(h string) string {
	rest := strings.TrimPrefix(h, "diff --git ")
	if strings.HasPrefix(rest, `"`) {
		// The first name ends at the first '"' not escaped.
		for i := 1; i < len(rest); i++ {
			if rest[i] == '\\' {
				i++
			} else if rest[i] == '"' {
				return strings.TrimPrefix(unquote(strings.TrimPrefix(rest[i+1:], " ")), "b/")
			}
		}
		return unquote(rest)
	}
	if n := (len(rest) - 1) / 2; len(rest) >= 5 && len(rest)%2 == 1 && strings.HasPrefix(rest, "a/") && rest[n:n+3] == " b/" && rest[2:n] == rest[n+3:] {
		return rest[n+3:]
	}
	if i := strings.Index(rest, " b/"); i >= 0 {
		return unquote(rest[i+3:])
	}
	return unquote(rest)
}

func unquote(p string) string {
	if strings.HasPrefix(p, `"`) {
		if s, err := strconv.Unquote(p); err == nil {
			return s
		}
	}
	return p
}

var (
	detectorOnce sync.Once
	detector     *detect.Detector
	detectorErr  error
	detectorMu   sync.Mutex // a Detector keeps per-scan state
	ciGlobs      = mustGlobs(CIConfig)
	manGlobs     = mustGlobs(Manifests)
	testGlobs    = mustGlobs(Tests)
)

func secrets() (*detect.Detector, error) {
	detectorOnce.Do(func() {
		// gitleaks logs through zerolog and the standard logger; keep both
		// quiet while it loads its rules.
		prev := log.Writer()
		log.SetOutput(io.Discard)
		detector, detectorErr = detect.NewDetectorDefaultConfig()
		log.SetOutput(prev)
		if detector != nil {
			// A "gitleaks:allow" comment is text the model (or the
			// repository it copies from) writes: it must not switch the
			// check off for its own line.
			detector.IgnoreGitleaksAllow = true
		}
	})
	return detector, detectorErr
}

// ScanText runs the secret scan on text that is not a diff (what the model
// wrote for a commit message and a pull request), returning a finding for
// each credential, with the secret redacted.
func ScanText(what, text string) ([]Finding, error) {
	d, err := secrets()
	if err != nil {
		return nil, fmt.Errorf("secret scan: %w", err)
	}
	detectorMu.Lock()
	found := d.DetectString(text)
	detectorMu.Unlock()
	var out []Finding
	for _, s := range found {
		out = append(out, Finding{Kind: FindSecret, Action: Block, Path: what, Rule: s.RuleID,
			Message: fmt.Sprintf("%s: %s", s.RuleID, redactSecret(s.Secret))})
	}
	return out, nil
}

// RedactText is text (not a diff) with each credential the secret scan
// finds in it cut to its first four characters, as a finding shows it,
// and how many it found: for text the model controls that is published,
// such as its tests' output.
func RedactText(text string) (string, int, error) {
	d, err := secrets()
	if err != nil {
		return "", 0, fmt.Errorf("secret scan: %w", err)
	}
	detectorMu.Lock()
	found := d.DetectString(text)
	detectorMu.Unlock()
	for _, s := range found {
		if s.Secret != "" {
			text = strings.ReplaceAll(text, s.Secret, redactSecret(s.Secret))
		}
	}
	return text, len(found), nil
}

// Check runs the checks on a diff.
func Check(diff []byte, cfg CheckConfig) (*Report, error) {
	actions := DefaultActions()
	for k, v := range cfg.Actions {
		actions[k] = v
	}
	maxFiles, maxLines, maxBytes := orInt(cfg.MaxFiles, 100), orInt(cfg.MaxLines, 5000), orInt(cfg.MaxFileBytes, 1<<20)
	r := &Report{SHA256: DiffSHA256(diff)}
	add := func(f Finding) {
		f.Action = actions[f.Kind]
		if f.Action == "" {
			f.Action = Flag
		}
		r.Findings = append(r.Findings, f)
	}
	d, err := secrets()
	if err != nil {
		return nil, fmt.Errorf("secret scan: %w", err)
	}
	files := ParseDiff(diff)
	r.Files = len(files)
	for _, f := range files {
		r.Added += len(f.Added)
		r.Deleted += f.Removed
		switch {
		case ciGlobs.match(f.Path):
			add(Finding{Kind: FindCIConfig, Path: f.Path, Message: "edits CI configuration"})
		case manGlobs.match(f.Path):
			add(Finding{Kind: FindManifest, Path: f.Path, Message: "edits a dependency manifest"})
		}
		if !cfg.TestsRequested && testGlobs.match(f.Path) {
			add(Finding{Kind: FindTests, Path: f.Path, Message: "edits tests, which the task did not ask for"})
		}
		if f.Unreadable {
			r.Findings = append(r.Findings, Finding{Kind: FindSize, Action: Block, Path: f.Path,
				Message: "has a hunk header without line counts git would write: its lines cannot be checked"})
		}
		size := f.Bytes
		if !f.Binary {
			for _, l := range f.Added {
				size += len(l.Text) + 1
			}
		}
		if size > maxBytes {
			add(Finding{Kind: FindSize, Path: f.Path, Message: fmt.Sprintf("adds %d bytes, over the cap of %d", size, maxBytes)})
		}
		if len(f.Added) == 0 {
			continue
		}
		var text bytes.Buffer
		for _, l := range f.Added {
			text.WriteString(l.Text)
			text.WriteByte('\n')
		}
		detectorMu.Lock()
		found := d.DetectString(text.String())
		detectorMu.Unlock()
		for _, s := range found {
			line := 0
			if s.StartLine >= 0 && s.StartLine < len(f.Added) {
				line = f.Added[s.StartLine].N
			}
			add(Finding{Kind: FindSecret, Path: f.Path, Line: line, Rule: s.RuleID,
				Message: fmt.Sprintf("%s: %s", s.RuleID, redactSecret(s.Secret))})
		}
	}
	if r.Files > maxFiles {
		add(Finding{Kind: FindSize, Message: fmt.Sprintf("changes %d files, over the cap of %d", r.Files, maxFiles)})
	}
	if n := r.Added + r.Deleted; n > maxLines {
		add(Finding{Kind: FindSize, Message: fmt.Sprintf("changes %d lines, over the cap of %d", n, maxLines)})
	}
	sort.SliceStable(r.Findings, func(i, j int) bool { return rank(r.Findings[i].Action) < rank(r.Findings[j].Action) })
	for _, f := range r.Findings {
		r.Blocked = r.Blocked || f.Action == Block
		r.NeedsApproval = r.NeedsApproval || f.Action == Approve
	}
	return r, nil
}

func rank(action string) int {
	switch action {
	case Block:
		return 0
	case Approve:
		return 1
	}
	return 2
}

// redactSecret keeps a secret's first four characters: enough to find it,
// not enough to use it.
func redactSecret(s string) string {
	if len(s) <= 4 {
		return "[redacted]"
	}
	return s[:4] + "…[redacted]"
}

func orInt(v, d int) int {
	if v <= 0 {
		return d
	}
	return v
}

// ParseActions parses "kind=action,..." (e.g. "tests=block,ci_config=flag").
func ParseActions(s string) (map[string]string, error) {
	out := map[string]string{}
	for _, kv := range strings.Split(s, ",") {
		if kv = strings.TrimSpace(kv); kv == "" {
			continue
		}
		k, v, ok := strings.Cut(kv, "=")
		if _, known := DefaultActions()[k]; !ok || !known {
			return nil, fmt.Errorf("%q: want KIND=ACTION with KIND one of secret, ci_config, manifest, tests, size", kv)
		}
		switch v {
		case Block, Approve, Flag:
		default:
			return nil, fmt.Errorf("%q: the action must be block, approve or flag", kv)
		}
		out[k] = v
	}
	return out, nil
}
