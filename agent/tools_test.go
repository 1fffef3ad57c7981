package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
)

// hostSandbox is a TEST DOUBLE of a sandbox: it runs commands as
// processes of this host in a temporary directory, with no isolation.
// The tools' logic is what these tests check; the real sandboxes' tests
// live with their drivers.
type hostSandbox struct{}

func (hostSandbox) Exec(ctx context.Context, argv []string, dir string, timeout time.Duration) (ExecResult, error) {
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Start(); err != nil {
		return ExecResult{Stderr: []byte(err.Error()), ExitCode: 127}, nil
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var res ExecResult
	select {
	case err := <-done:
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			res.ExitCode = ee.ExitCode()
		}
	case <-ctx.Done():
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
		res.TimedOut, res.ExitCode = true, -1
	}
	res.Stdout, res.Stderr = out.Bytes(), errb.Bytes()
	return res, nil
}

func (hostSandbox) ReadFile(ctx context.Context, path string, limit int64) ([]byte, error) {
	b, err := os.ReadFile(path)
	if limit > 0 && int64(len(b)) > limit {
		b = b[:limit]
	}
	return b, Refused(err) // the file system's answer, as a guest's is
}

func (hostSandbox) WriteFile(ctx context.Context, path string, data []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, data, 0o644)
}

func newRepo(t *testing.T) *Tools {
	t.Helper()
	if _, err := exec.LookPath("rg"); err != nil {
		t.Skip("needs ripgrep (apt-get install ripgrep; .ci/run installs it)")
	}
	root := t.TempDir()
	files := map[string]string{
		"go.mod":            "module demo\n",
		"calc/calc.go":      "package calc\n\n// Add adds.\nfunc Add(a, b int) int { return a - b }\n\ntype Acc struct{}\n\nfunc (a *Acc) Sum() int { return 0 }\n",
		"calc/calc_test.go": "package calc\n\nimport \"testing\"\n\nfunc TestAdd(t *testing.T) {\n\tif Add(2, 2) != 4 {\n\t\tt.Fatal(\"2+2\")\n\t}\n}\n",
		"tools/gen.py":      "import os\n\nclass Gen:\n    pass\n\ndef main():\n    pass\n",
		".git/config":       "[core]\n",
	}
	for p, c := range files {
		os.MkdirAll(filepath.Join(root, filepath.Dir(p)), 0o755)
		os.WriteFile(filepath.Join(root, p), []byte(c), 0o644)
	}
	return &Tools{SB: hostSandbox{}, Root: root}
}

func call(t *testing.T, tl *Tools, name string, input string) Result {
	t.Helper()
	r, err := tl.Run(context.Background(), name, json.RawMessage(input))
	if err != nil {
		t.Fatalf("%s %s: %v", name, input, err)
	}
	return r
}

func TestToolSpecsAreStable(t *testing.T) {
	var names []string
	for _, s := range ToolSpecs() {
		names = append(names, s.Name)
		var schema map[string]any
		if err := json.Unmarshal(s.InputSchema, &schema); err != nil || schema["type"] != "object" {
			t.Errorf("%s: schema %s", s.Name, s.InputSchema)
		}
	}
	if got := strings.Join(names, ","); got != "read_file,list_files,search,edit_file,write_file,run_command,repo_map,finish" {
		t.Fatalf("tools: %s", got)
	}
	a, _ := json.Marshal(ToolSpecs())
	b, _ := json.Marshal(ToolSpecs())
	if !bytes.Equal(a, b) {
		t.Fatal("the tool list must render the same every time")
	}
}

func TestReadListSearch(t *testing.T) {
	tl := newRepo(t)
	r := call(t, tl, ToolReadFile, `{"path":"calc/calc.go","start_line":4,"end_line":4}`)
	if r.IsError || r.View != "     4\tfunc Add(a, b int) int { return a - b }\n[lines 4-4 of 8; ask for more with start_line]\n" {
		t.Errorf("read_file range: %q", r.View)
	}
	if r := call(t, tl, ToolReadFile, `{"path":"calc/calc.go","start_line":99}`); !r.IsError || !strings.Contains(r.View, "has 8 lines") {
		t.Errorf("past the end: %+v", r)
	}
	for _, p := range []string{"../../etc/passwd", "/etc/passwd"} {
		if r := call(t, tl, ToolReadFile, `{"path":"`+p+`"}`); !r.IsError || !strings.Contains(r.View, "outside the repository") {
			t.Errorf("%s: %+v", p, r)
		}
	}
	r = call(t, tl, ToolListFiles, `{"path":"."}`)
	if !strings.Contains(r.View, "calc/calc.go\n") || !strings.Contains(r.View, "tools/\n") || strings.Contains(r.View, ".git") {
		t.Errorf("list_files: %q", r.View)
	}
	r = call(t, tl, ToolSearch, `{"pattern":"func Add","glob":"*.go"}`)
	if r.IsError || !strings.Contains(r.View, "calc/calc.go:4:func Add") {
		t.Errorf("search: %+v", r)
	}
	if r := call(t, tl, ToolSearch, `{"pattern":"no_such_symbol_anywhere"}`); r.IsError || r.View != "no matches" {
		t.Errorf("search without matches: %+v", r)
	}
	if r := call(t, tl, ToolSearch, `{"pattern":"(unclosed"}`); !r.IsError {
		t.Errorf("a bad regex: %+v", r)
	}
	m := call(t, tl, ToolRepoMap, `{}`)
	for _, want := range []string{"calc/calc.go: Add, Acc, Sum\n", "calc/calc_test.go: TestAdd\n", "tools/gen.py: Gen, main\n", "go.mod\n"} {
		if !strings.Contains(m.View, want) {
			t.Errorf("repo_map lacks %q:\n%s", want, m.View)
		}
	}
}

func TestEditWriteRun(t *testing.T) {
	tl := newRepo(t)
	if r := call(t, tl, ToolEditFile, `{"path":"calc/calc.go","old_string":"return a - b","new_string":"return a + b"}`); r.IsError || !r.Changed || r.View != "edited calc/calc.go at line 4" {
		t.Fatalf("edit: %+v", r)
	}
	if r := call(t, tl, ToolEditFile, `{"path":"calc/calc.go","old_string":"return a - b","new_string":"x"}`); !r.IsError || !strings.Contains(r.View, "does not occur") {
		t.Errorf("no match: %+v", r)
	}
	if r := call(t, tl, ToolEditFile, `{"path":"calc/calc.go","old_string":"int","new_string":"int64"}`); !r.IsError || !strings.Contains(r.View, "occurs 3 times") {
		t.Errorf("many matches: %+v", r)
	}
	if r := call(t, tl, ToolEditFile, `{"path":"calc/calc.go","old_string":"a","new_string":"a"}`); !r.IsError {
		t.Errorf("same strings: %+v", r)
	}
	if r := call(t, tl, ToolWriteFile, `{"path":"docs/new/NOTES.md","content":"hi\n"}`); r.IsError || !r.Changed {
		t.Fatalf("write: %+v", r)
	}
	if b, _ := os.ReadFile(filepath.Join(tl.Root, "docs/new/NOTES.md")); string(b) != "hi\n" {
		t.Errorf("written: %q", b)
	}
	if _, err := exec.LookPath("go"); err == nil {
		r := call(t, tl, ToolRunCommand, `{"command":"go test ./... 2>&1"}`)
		if r.IsError || !strings.HasPrefix(r.View, "exit code 0") {
			t.Errorf("tests after the fix: %s", r.View)
		}
	}
	r := call(t, tl, ToolRunCommand, `{"command":"yes warren | head -c 100000; echo done >&2; exit 3"}`)
	if !r.IsError || !strings.HasPrefix(r.View, "exit code 3") || !strings.Contains(r.View, "bytes left out") || len(r.Full) != 100005 || len(r.View) > ViewBytes+200 {
		t.Errorf("big output: view %d bytes, full %d: %.200q", len(r.View), len(r.Full), r.View)
	}
	r = call(t, tl, ToolRunCommand, `{"command":"sleep 30 & sleep 30","timeout_seconds":1}`)
	if !r.IsError || !strings.Contains(r.View, "timed out after 1s") {
		t.Errorf("timeout: %+v", r)
	}
	if r := call(t, tl, ToolFinish, `{"summary":"fixed Add","cause":"subtraction","fix":"addition"}`); r.Finish == nil || r.Finish.Cause != "subtraction" {
		t.Errorf("finish: %+v", r)
	}
	if r := call(t, tl, ToolFinish, `{}`); !r.IsError {
		t.Errorf("finish without a summary: %+v", r)
	}
	if r := call(t, tl, "rm_rf", `{}`); !r.IsError || !strings.Contains(r.View, "is not a tool") {
		t.Errorf("unknown tool: %+v", r)
	}
	if r := call(t, tl, ToolReadFile, `{"path":"go.mod","mode":"x"}`); !r.IsError || !strings.Contains(r.View, "bad input") {
		t.Errorf("unknown field: %+v", r)
	}
	if MutatesWorkspace(ToolReadFile) || !MutatesWorkspace(ToolRunCommand) {
		t.Error("MutatesWorkspace")
	}
}

// The servers check policy rules against api.AgentTools: it must be the
// tools, in order.
func TestAgentToolsListMatchesTheTools(t *testing.T) {
	var names []string
	for _, s := range toolSpecs {
		names = append(names, s.Name)
	}
	if !slices.Equal(names, api.AgentTools) {
		t.Fatalf("tools %v, api.AgentTools %v", names, api.AgentTools)
	}
}
