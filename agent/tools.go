package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/warrenhq/warren/agent/model"
	"github.com/warrenhq/warren/api/textcut"
)

// Sandbox is what the tools need of a task's sandbox. Paths are absolute
// in the sandbox. Implementations are safe for concurrent use.
type Sandbox interface {
	// Exec runs argv in dir, killing its process group after timeout
	// (0: no limit beyond ctx), and returns its output and exit code.
	Exec(ctx context.Context, argv []string, dir string, timeout time.Duration) (ExecResult, error)
	// ReadFile returns at most limit bytes of a file (0: all).
	ReadFile(ctx context.Context, path string, limit int64) ([]byte, error)
	// WriteFile replaces a file atomically, making its directory.
	WriteFile(ctx context.Context, path string, data []byte) error
}

// ErrRefused marks an error that is the sandbox's answer to a call it
// refused (a path that is a directory, a working directory that is
// missing, a NUL byte in a command): the call's input was at fault, so
// the model gets it as a tool error and can do otherwise. Any other error
// from a Sandbox is the sandbox failing, which the caller retries.
// Sandboxes mark such errors with Refused.
var ErrRefused = errors.New("refused by the sandbox")

// Refused marks err as the sandbox's refusal (ErrRefused), keeping its
// message.
func Refused(err error) error {
	if err == nil {
		return nil
	}
	return refusedError{err}
}

type refusedError struct{ error }

func (e refusedError) Unwrap() error        { return e.error }
func (e refusedError) Is(target error) bool { return target == ErrRefused }

// sandboxErr is a tool's result for a Sandbox call's error: a tool
// error for a refusal, else the error itself.
func sandboxErr(err error, format string, args ...any) (Result, error) {
	msg := fmt.Sprintf(format, args...)
	if errors.Is(err, ErrRefused) {
		return toolError("%s: %v", msg, err), nil
	}
	return Result{}, fmt.Errorf("%s: %w", msg, err)
}

// ExecResult is a finished command.
type ExecResult struct {
	Stdout, Stderr []byte
	ExitCode       int
	TimedOut       bool
}

// Tool names, in the order the model sees them (stable across calls, so
// the prompt cache holds).
const (
	ToolReadFile   = "read_file"
	ToolListFiles  = "list_files"
	ToolSearch     = "search"
	ToolEditFile   = "edit_file"
	ToolWriteFile  = "write_file"
	ToolRunCommand = "run_command"
	ToolRepoMap    = "repo_map"
	ToolFinish     = "finish"
)

// Limits of what the model sees of a tool's output; the full output is
// kept (Result.Full) for the blob store.
const (
	ViewBytes         = 16 << 10 // a tool result's view
	ReadLinesDefault  = 400      // read_file without a range
	MaxFileBytes      = 8 << 20  // read_file, edit_file, write_file
	DefaultCmdTimeout = 10 * time.Minute
	MaxCmdTimeout     = time.Hour
)

var toolSpecs = []model.Tool{
	{Name: ToolReadFile, Description: "Read a file of the repository, with line numbers. Give start_line and end_line (1-based, inclusive) for a part of a long file.",
		InputSchema: json.RawMessage(`{"type":"object","properties":{"path":{"type":"string","description":"path relative to the repository root"},"start_line":{"type":"integer","minimum":1},"end_line":{"type":"integer","minimum":1}},"required":["path"],"additionalProperties":false}`)},
	{Name: ToolListFiles, Description: "List the files under a directory of the repository (not .git), to a depth.",
		InputSchema: json.RawMessage(`{"type":"object","properties":{"path":{"type":"string","description":"directory relative to the repository root; \".\" is the root"},"depth":{"type":"integer","minimum":1,"maximum":8}},"additionalProperties":false}`)},
	{Name: ToolSearch, Description: "Search the repository with ripgrep: a regular expression, optionally under a path and limited to a glob. Prints file:line:text.",
		InputSchema: json.RawMessage(`{"type":"object","properties":{"pattern":{"type":"string"},"path":{"type":"string"},"glob":{"type":"string"}},"required":["pattern"],"additionalProperties":false}`)},
	{Name: ToolEditFile, Description: "Replace old_string with new_string in a file. old_string must match the file exactly once; include enough context to make it unique.",
		InputSchema: json.RawMessage(`{"type":"object","properties":{"path":{"type":"string"},"old_string":{"type":"string"},"new_string":{"type":"string"}},"required":["path","old_string","new_string"],"additionalProperties":false}`)},
	{Name: ToolWriteFile, Description: "Write a whole file (created or replaced).",
		InputSchema: json.RawMessage(`{"type":"object","properties":{"path":{"type":"string"},"content":{"type":"string"}},"required":["path","content"],"additionalProperties":false}`)},
	{Name: ToolRunCommand, Description: "Run a shell command in the repository root (sh -c). You see the exit code and a truncated view of the output.",
		InputSchema: json.RawMessage(`{"type":"object","properties":{"command":{"type":"string"},"timeout_seconds":{"type":"integer","minimum":1,"maximum":3600}},"required":["command"],"additionalProperties":false}`)},
	{Name: ToolRepoMap, Description: "The repository's files and their top-level symbols (functions, types, classes), computed when the task started.",
		InputSchema: json.RawMessage(`{"type":"object","properties":{},"additionalProperties":false}`)},
	{Name: ToolFinish, Description: "Finish the task: summarise the change, the cause of the problem and the fix.",
		InputSchema: json.RawMessage(`{"type":"object","properties":{"summary":{"type":"string"},"cause":{"type":"string"},"fix":{"type":"string"}},"required":["summary"],"additionalProperties":false}`)},
}

// ToolSpecs returns the tools' definitions, always the same, in the same
// order. The caller may not change them.
func ToolSpecs() []model.Tool { return toolSpecs }

// Result is a tool call's outcome.
type Result struct {
	View    string // what the model sees (truncated)
	Full    []byte // the whole output, for the blob store
	IsError bool   // the call failed; View says why
	// Changed reports whether the call may have changed the workspace
	// (edit, write, run_command): such a call is rerun only after the
	// workspace is restored to the last checkpoint.
	Changed bool
	Finish  *Finish // set by finish
}

// Finish is what the model said when it finished.
type Finish struct {
	Summary string `json:"summary"`
	Cause   string `json:"cause,omitempty"`
	Fix     string `json:"fix,omitempty"`
}

// Tools runs tool calls in one task's sandbox, on the repository checked
// out at Root.
type Tools struct {
	SB      Sandbox
	Root    string // the repository in the sandbox, e.g. /work/repo
	repoMap string // computed by RepoMap at start
}

// MutatesWorkspace reports whether a tool may change the workspace.
func MutatesWorkspace(name string) bool {
	return name == ToolEditFile || name == ToolWriteFile || name == ToolRunCommand
}

// toolError is an error the model should see and recover from.
func toolError(format string, args ...any) Result {
	return Result{View: fmt.Sprintf(format, args...), IsError: true}
}

// resolve turns a path the model gave into an absolute path under Root;
// paths that leave the repository are refused.
func (t *Tools) resolve(p string) (string, error) {
	if p == "" {
		p = "."
	}
	if strings.ContainsRune(p, 0) {
		return "", errors.New("the path has a NUL byte")
	}
	full := path.Clean(path.Join(t.Root, p))
	if path.IsAbs(p) {
		full = path.Clean(p)
	}
	if full != t.Root && !strings.HasPrefix(full, t.Root+"/") {
		return "", fmt.Errorf("%q is outside the repository (%s)", p, t.Root)
	}
	return full, nil
}

// symlinkScript prints, NUL-separated, the first prefix of the relative
// path $1 (run in the repository root) that is a symbolic link, and
// where it points; nothing when there is none. POSIX sh only: it must run
// in any sandbox image.
const symlinkScript = `set -f; IFS=/; p=.
for c in $1; do
	[ -n "$c" ] || continue
	p="$p/$c"
	if [ -L "$p" ]; then printf '%s\0' "${p#./}"; readlink -- "$p"; exit 0; fi
done`

// checkNoSymlink refuses a path under Root that goes through a symbolic
// link (a folder of it, or the file itself). Policy matches the path as
// the model gave it, so the tool must act on that path and not on where
// a link points: with ci -> .github/workflows, write_file ci/x.yml would
// be an edit of CI configuration that no rule sees. The model is told
// the real path to use instead. An error is returned only when the
// sandbox failed.
func (t *Tools) checkNoSymlink(ctx context.Context, tool, p, full string) (*Result, error) {
	rel := strings.TrimPrefix(strings.TrimPrefix(full, t.Root), "/")
	if rel == "" {
		return nil, nil
	}
	res, err := t.SB.Exec(ctx, []string{"/bin/sh", "-c", symlinkScript, "sh", rel}, t.Root, 30*time.Second)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", tool, err)
	}
	link, target, found := strings.Cut(string(res.Stdout), "\x00")
	if res.ExitCode != 0 || !found || link == "" {
		return nil, nil
	}
	r := toolError("%s: %s goes through the symbolic link %s (to %s); name the file by its real path, which is what the task's policy is checked against",
		tool, p, link, strings.TrimSpace(target))
	return &r, nil
}

// Run runs one tool call. Bad input, a missing file or a failing command
// are results the model sees (IsError); an error is returned only when the
// sandbox itself failed.
func (t *Tools) Run(ctx context.Context, name string, input json.RawMessage) (Result, error) {
	return t.RunWithin(ctx, name, input, 0)
}

// RunWithin is Run with a command's time bounded by limit as well (0: no
// bound but the tool's own): what the task's wall-clock budget leaves.
func (t *Tools) RunWithin(ctx context.Context, name string, input json.RawMessage, limit time.Duration) (Result, error) {
	dec := func(v any) error {
		d := json.NewDecoder(strings.NewReader(string(input)))
		d.DisallowUnknownFields()
		return d.Decode(v)
	}
	switch name {
	case ToolReadFile:
		var in struct {
			Path      string `json:"path"`
			StartLine int    `json:"start_line"`
			EndLine   int    `json:"end_line"`
		}
		if err := dec(&in); err != nil {
			return toolError("read_file: bad input: %v", err), nil
		}
		return t.readFile(ctx, in.Path, in.StartLine, in.EndLine)
	case ToolListFiles:
		var in struct {
			Path  string `json:"path"`
			Depth int    `json:"depth"`
		}
		if err := dec(&in); err != nil {
			return toolError("list_files: bad input: %v", err), nil
		}
		return t.listFiles(ctx, in.Path, in.Depth)
	case ToolSearch:
		var in struct{ Pattern, Path, Glob string }
		if err := dec(&in); err != nil {
			return toolError("search: bad input: %v", err), nil
		}
		return t.search(ctx, in.Pattern, in.Path, in.Glob)
	case ToolEditFile:
		var in struct {
			Path      string  `json:"path"`
			OldString *string `json:"old_string"`
			NewString *string `json:"new_string"`
		}
		if err := dec(&in); err != nil {
			return toolError("edit_file: bad input: %v", err), nil
		}
		// A missing new_string is not "": read as one, it deleted the
		// text the model meant to replace.
		switch {
		case in.Path == "":
			return toolError("edit_file: path: required"), nil
		case in.OldString == nil:
			return toolError("edit_file: old_string: required"), nil
		case in.NewString == nil:
			return toolError("edit_file: new_string: required (give \"\" to delete old_string)"), nil
		}
		return t.editFile(ctx, in.Path, *in.OldString, *in.NewString)
	case ToolWriteFile:
		var in struct {
			Path    string
			Content *string
		}
		if err := dec(&in); err != nil {
			return toolError("write_file: bad input: %v", err), nil
		}
		switch {
		case in.Path == "":
			return toolError("write_file: path: required"), nil
		case in.Content == nil: // not "": that would empty the file
			return toolError("write_file: content: required (give \"\" for an empty file)"), nil
		}
		content := *in.Content
		p, err := t.resolve(in.Path)
		if err != nil {
			return toolError("write_file: %v", err), nil
		}
		if len(content) > MaxFileBytes {
			return toolError("write_file: %d bytes is over the limit of %d", len(content), MaxFileBytes), nil
		}
		if r, err := t.checkNoSymlink(ctx, "write_file", in.Path, p); r != nil || err != nil {
			return deref(r), err
		}
		if err := t.SB.WriteFile(ctx, p, []byte(content)); err != nil {
			return sandboxErr(err, "write_file: %s", in.Path)
		}
		return Result{View: fmt.Sprintf("wrote %s (%d bytes)", in.Path, len(content)), Changed: true}, nil
	case ToolRunCommand:
		var in struct {
			Command        string `json:"command"`
			TimeoutSeconds int    `json:"timeout_seconds"`
		}
		if err := dec(&in); err != nil {
			return toolError("run_command: bad input: %v", err), nil
		}
		// Clamped in seconds: a huge count of seconds wrapped around
		// time.Duration to a timeout of a few ms.
		secs := min(max(in.TimeoutSeconds, 0), int(MaxCmdTimeout/time.Second))
		return t.runCommand(ctx, in.Command, time.Duration(secs)*time.Second, limit)
	case ToolRepoMap:
		if t.repoMap == "" {
			if _, err := t.RepoMap(ctx); err != nil {
				return Result{}, err
			}
		}
		return Result{View: view([]byte(t.repoMap)), Full: []byte(t.repoMap)}, nil
	case ToolFinish:
		var f Finish
		if err := dec(&f); err != nil {
			return toolError("finish: %v", err), nil
		}
		if strings.TrimSpace(f.Summary) == "" {
			return toolError("finish: give at least a summary"), nil
		}
		return Result{View: "finished", Finish: &f}, nil
	}
	return toolError("%q is not a tool; the tools are read_file, list_files, search, edit_file, write_file, run_command, repo_map and finish", name), nil
}

func (t *Tools) readFile(ctx context.Context, p string, start, end int) (Result, error) {
	full, err := t.resolve(p)
	if err != nil {
		return toolError("read_file: %v", err), nil
	}
	if r, err := t.checkNoSymlink(ctx, "read_file", p, full); r != nil || err != nil {
		return deref(r), err
	}
	b, err := t.SB.ReadFile(ctx, full, MaxFileBytes+1)
	if err != nil {
		return sandboxErr(err, "read_file: %s", p)
	}
	if len(b) > MaxFileBytes {
		// Refused whole: a range of it would need the whole file read
		// from the sandbox first.
		return toolError("read_file: %s is over %d bytes, too large for read_file, whatever range you ask for; look into it with run_command (head, tail, sed -n 'A,Bp', rg)", p, MaxFileBytes), nil
	}
	return numberLines(b, p, start, end, MaxFileBytes), nil
}

// numberLines is read_file's result for a file's content b: lines start
// to end (1-based, inclusive; 0 for the defaults), numbered, at most
// limit bytes of them with the note that ends them. The lines are found
// by scanning b, never split into a slice of them all: a file of 8 MiB of
// newlines has 8 million lines, and a range over them all, formatted
// whole, made some 75 MiB (and a slice of 134 MiB) that the loop then
// kept as a blob. What the limit cuts, the note says, with the line to
// ask for next.
func numberLines(b []byte, p string, start, end, limit int) Result {
	total := bytes.Count(b, []byte("\n"))
	if len(b) > 0 && b[len(b)-1] != '\n' {
		total++
	}
	if start <= 0 {
		start = 1
	}
	if end <= 0 {
		end = start + ReadLinesDefault - 1
	}
	if start > total && total > 0 {
		return toolError("read_file: %s has %d lines; start_line %d is past the end", p, total, start)
	}
	end = min(end, total)
	// the offset of line start
	off := 0
	for i := 1; i < start && off < len(b); i++ {
		nl := bytes.IndexByte(b[off:], '\n')
		if nl < 0 {
			off = len(b)
			break
		}
		off += nl + 1
	}
	const noteRoom = 160 // the note at the end, with its numbers
	var out bytes.Buffer
	var num []byte
	shown, kept := start-1, -1 // kept: the bytes of a line cut short
	for i := start; i <= end; i++ {
		line := b[off:]
		if nl := bytes.IndexByte(line, '\n'); nl >= 0 {
			line = line[:nl+1]
		}
		num = fmt.Appendf(num[:0], "%6d\t", i)
		if out.Len()+len(num)+len(line)+1 > limit-noteRoom {
			if i == start { // one line over the limit: its head
				keep := textcut.Head(line, limit-noteRoom-len(num)-1)
				out.Write(num)
				out.Write(keep)
				out.WriteByte('\n')
				shown, kept = i, len(keep)
			}
			break
		}
		out.Write(num)
		out.Write(line)
		if line[len(line)-1] != '\n' {
			out.WriteByte('\n')
		}
		off += len(line)
		shown = i
	}
	switch {
	case kept >= 0:
		fmt.Fprintf(&out, "[line %d of %d cut after its first %d bytes: read_file returns at most %d bytes; see the rest with run_command]\n", shown, total, kept, limit)
	case shown < end:
		fmt.Fprintf(&out, "[lines %d-%d of %d: read_file returns at most %d bytes; ask for more with start_line %d]\n", start, shown, total, limit, shown+1)
	case end < total:
		fmt.Fprintf(&out, "[lines %d-%d of %d; ask for more with start_line]\n", start, end, total)
	}
	return Result{View: view(out.Bytes()), Full: out.Bytes()}
}

func (t *Tools) listFiles(ctx context.Context, p string, depth int) (Result, error) {
	full, err := t.resolve(p)
	if err != nil {
		return toolError("list_files: %v", err), nil
	}
	if r, err := t.checkNoSymlink(ctx, "list_files", p, full); r != nil || err != nil {
		return deref(r), err
	}
	if depth <= 0 {
		depth = 2
	}
	res, err := t.SB.Exec(ctx, []string{"find", ".", "-maxdepth", strconv.Itoa(min(depth, 8)), "-not", "-path", "./.git", "-not", "-path", "./.git/*", "-printf", "%y %P\n"}, full, time.Minute)
	if err != nil {
		return sandboxErr(err, "list_files: %s", p)
	}
	if res.ExitCode != 0 {
		return toolError("list_files: %s: %s", p, strings.TrimSpace(string(res.Stderr))), nil
	}
	var out []string
	for _, l := range strings.Split(strings.TrimSpace(string(res.Stdout)), "\n") {
		kind, name, ok := strings.Cut(l, " ")
		if !ok || name == "" {
			continue
		}
		if kind == "d" {
			name += "/"
		}
		out = append(out, name)
	}
	s := strings.Join(slices.Sorted(slices.Values(out)), "\n") + "\n"
	return Result{View: view([]byte(s)), Full: []byte(s)}, nil
}

func (t *Tools) search(ctx context.Context, pattern, p, glob string) (Result, error) {
	if pattern == "" {
		return toolError("search: pattern: required"), nil
	}
	full, err := t.resolve(p)
	if err != nil {
		return toolError("search: %v", err), nil
	}
	if r, err := t.checkNoSymlink(ctx, "search", p, full); r != nil || err != nil {
		return deref(r), err
	}
	argv := []string{"rg", "--line-number", "--no-heading", "--color", "never", "--max-columns", "300", "--max-count", "50"}
	if glob != "" {
		argv = append(argv, "--glob", glob)
	}
	argv = append(argv, "-e", pattern, "--", strings.TrimPrefix(strings.TrimPrefix(full, t.Root), "/"))
	if argv[len(argv)-1] == "" {
		argv[len(argv)-1] = "."
	}
	res, err := t.SB.Exec(ctx, argv, t.Root, 2*time.Minute)
	if err != nil {
		return sandboxErr(err, "search")
	}
	switch res.ExitCode {
	case 0:
		return Result{View: view(res.Stdout), Full: res.Stdout}, nil
	case 1:
		return Result{View: "no matches"}, nil
	}
	return toolError("search: %s", strings.TrimSpace(string(res.Stderr))), nil
}

func (t *Tools) editFile(ctx context.Context, p, old, new string) (Result, error) {
	full, err := t.resolve(p)
	if err != nil {
		return toolError("edit_file: %v", err), nil
	}
	if r, err := t.checkNoSymlink(ctx, "edit_file", p, full); r != nil || err != nil {
		return deref(r), err
	}
	if old == "" {
		return toolError("edit_file: old_string is empty; use write_file to create a file"), nil
	}
	if old == new {
		return toolError("edit_file: old_string and new_string are the same"), nil
	}
	b, err := t.SB.ReadFile(ctx, full, MaxFileBytes+1)
	if err != nil {
		return sandboxErr(err, "edit_file: %s", p)
	}
	if len(b) > MaxFileBytes {
		return toolError("edit_file: %s is over %d bytes", p, MaxFileBytes), nil
	}
	switch n := occurrences(string(b), old); n {
	case 1:
	case 0:
		return toolError("edit_file: old_string does not occur in %s; read the file and copy the text exactly, whitespace included", p), nil
	default:
		return toolError("edit_file: old_string occurs %d times in %s; include more surrounding lines so it occurs once", n, p), nil
	}
	out := strings.Replace(string(b), old, new, 1)
	if len(out) > MaxFileBytes {
		return toolError("edit_file: %s would be %d bytes, over the limit of %d", p, len(out), MaxFileBytes), nil
	}
	if err := t.SB.WriteFile(ctx, full, []byte(out)); err != nil {
		return sandboxErr(err, "edit_file: %s", p)
	}
	line := strings.Count(string(b)[:strings.Index(string(b), old)], "\n") + 1
	return Result{View: fmt.Sprintf("edited %s at line %d", p, line), Changed: true}, nil
}

func (t *Tools) runCommand(ctx context.Context, cmd string, timeout, limit time.Duration) (Result, error) {
	if strings.TrimSpace(cmd) == "" {
		return toolError("run_command: command: required"), nil
	}
	if timeout <= 0 {
		timeout = DefaultCmdTimeout
	}
	timeout = min(timeout, MaxCmdTimeout)
	if limit > 0 {
		timeout = min(timeout, limit)
	}
	res, err := t.SB.Exec(ctx, []string{"/bin/sh", "-c", cmd}, t.Root, timeout)
	if err != nil {
		return sandboxErr(err, "run_command")
	}
	full := append(append([]byte{}, res.Stdout...), res.Stderr...)
	head := fmt.Sprintf("exit code %d", res.ExitCode)
	if res.TimedOut {
		head = fmt.Sprintf("timed out after %v and was killed", timeout)
	}
	v := head + "\n"
	// Both streams share the view's size, so the result stays within it.
	each := ViewBytes - 64
	if len(res.Stdout) > 0 && len(res.Stderr) > 0 {
		each /= 2
	}
	if len(res.Stdout) > 0 {
		v += "stdout:\n" + viewN(res.Stdout, each) + "\n"
	}
	if len(res.Stderr) > 0 {
		v += "stderr:\n" + viewN(res.Stderr, each) + "\n"
	}
	return Result{View: v, Full: full, Changed: true, IsError: res.ExitCode != 0 || res.TimedOut}, nil
}

// occurrences counts where sub starts in s, overlapping matches
// included: strings.Count counted "}\n}\n" once in "}\n}\n}\n", so an
// ambiguous edit went to the first match.
func occurrences(s, sub string) int {
	if sub == "" {
		return strings.Count(s, sub)
	}
	n := 0
	for i := 0; ; n++ {
		j := strings.Index(s[i:], sub)
		if j < 0 {
			return n
		}
		i += j + 1
	}
}

func deref(r *Result) Result {
	if r == nil {
		return Result{}
	}
	return *r
}

// view truncates output for the model to at most ViewBytes: its head and
// its tail, with how much was left out between them.
func view(b []byte) string { return viewN(b, ViewBytes) }

// viewN is view within n bytes. The cuts fall between characters, not
// inside a UTF-8 sequence, and the note between head and tail counts
// against n.
func viewN(b []byte, n int) string {
	if len(b) <= n {
		return string(b)
	}
	const note = 48 // "\n[... %d bytes left out ...]\n", with room for the count
	head, tail := textcut.Head(b, (n-note)/4), textcut.Tail(b, (n-note)*3/4)
	return fmt.Sprintf("%s\n[... %d bytes left out ...]\n%s", head, len(b)-len(head)-len(tail), tail)
}
