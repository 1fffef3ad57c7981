package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/warrenhq/warren/agent/model"
)

// cappedSandbox is a TEST DOUBLE of the node's sandbox (noded's
// agentSandbox): a command's output is kept up to max bytes, as its head
// (a quarter) and its tail, with a line saying how much was left out
// between them, as driver.CappedOutput keeps it.
type cappedSandbox struct {
	hostSandbox
	max int
}

func (s cappedSandbox) Exec(ctx context.Context, argv []string, dir string, timeout time.Duration) (ExecResult, error) {
	res, err := s.hostSandbox.Exec(ctx, argv, dir, timeout)
	res.Stdout, res.Stderr = s.capped(res.Stdout), s.capped(res.Stderr)
	return res, err
}

func (s cappedSandbox) capped(b []byte) []byte {
	if len(b) <= s.max {
		return b
	}
	head, tail := s.max/4, s.max-s.max/4
	out := append([]byte(nil), b[:head]...)
	out = fmt.Appendf(out, "\n[... %d bytes of output left out ...]\n", len(b)-head-tail)
	return append(out, b[len(b)-tail:]...)
}

// bigChange writes files whose diff is well over 256 KiB: n files of
// 8 KiB of lines each.
func bigChange(t *testing.T, root string, n int) {
	t.Helper()
	line := strings.Repeat("x", 63) + "\n"
	for i := range n {
		p := filepath.Join(root, "gen", fmt.Sprintf("f%03d.txt", i))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(fmt.Sprintf("file %d\n", i)+strings.Repeat(line, 128)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// gitDiff is the work tree's patch against the base, made on the host
// with git itself: what Checkpoint must return.
func gitDiff(t *testing.T, root string) string {
	t.Helper()
	for _, args := range [][]string{{"add", "-A"}, {"diff", "--cached", "--binary", "--no-color", "--no-ext-diff", "--no-textconv", "--no-renames", "warren-base"}} {
		cmd := exec.Command("git", append(append([]string{}, gitIdentity...), args...)...)
		cmd.Dir = root
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("git %s: %v", args[0], err)
		}
		if args[0] == "diff" {
			return string(out)
		}
	}
	return ""
}

// A workspace's patch longer than the sandbox keeps of a command's output
// is returned whole, not as the head and tail the sandbox kept: such a
// patch, cut in its middle, can still apply without the files left out,
// and the finish step would publish it.
func TestCheckpointIsNeverCut(t *testing.T) {
	tl := newRepo(t)
	tl.SB = cappedSandbox{max: 64 << 10}
	ctx := context.Background()
	if err := tl.InitBase(ctx); err != nil {
		t.Fatal(err)
	}
	bigChange(t, tl.Root, 40) // a patch of about 330 KiB
	patch, err := tl.Checkpoint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := gitDiff(t, tl.Root)
	if len(want) < 256<<10 {
		t.Fatalf("the test's patch is only %d bytes", len(want))
	}
	if patch != want {
		t.Fatalf("Checkpoint returned %d bytes (left out: %v), git diff %d", len(patch), strings.Contains(patch, "left out"), len(want))
	}
	// It restores on a fresh checkout, every file whole.
	tl2 := newRepo(t)
	tl2.SB = tl.SB
	if err := tl2.InitBase(ctx); err != nil {
		t.Fatal(err)
	}
	if err := tl2.Restore(ctx, patch); err != nil {
		t.Fatal(err)
	}
	if got := gitDiff(t, tl2.Root); got != want {
		t.Errorf("the restored workspace's patch differs: %d bytes, want %d", len(got), len(want))
	}
}

// A patch over the limit is an error naming its size and the limit, and
// is not returned (cut or not).
func TestCheckpointOverTheLimitFails(t *testing.T) {
	tl := newRepo(t)
	ctx := context.Background()
	if err := tl.InitBase(ctx); err != nil {
		t.Fatal(err)
	}
	bigChange(t, tl.Root, 40)
	size := len(gitDiff(t, tl.Root))
	patch, got, err := tl.patch(ctx, 100<<10)
	if !errors.Is(err, ErrPatchTooLarge) || patch != "" || got != int64(size) {
		t.Fatalf("patch: %d bytes, size %d, %v; want ErrPatchTooLarge, size %d", len(patch), got, err, size)
	}
	for _, want := range []string{fmt.Sprint(size), "limit of 102400"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error %q does not say %q", err, want)
		}
	}
	// An empty change is an empty patch.
	tl2 := newRepo(t)
	if err := tl2.InitBase(ctx); err != nil {
		t.Fatal(err)
	}
	if p, err := tl2.Checkpoint(ctx); p != "" || err != nil {
		t.Errorf("no change: %q, %v", p, err)
	}
}

// A step's checkpoint too large for its event is recorded as too_large,
// with the patch's true size (not what a capped output kept of it), and
// the task goes on.
func TestLargeStepCheckpointIsRecordedTooLarge(t *testing.T) {
	tl := newRepo(t)
	tl.SB = cappedSandbox{max: 64 << 10}
	ctx := context.Background()
	if err := tl.InitBase(ctx); err != nil {
		t.Fatal(err)
	}
	script := `{"content":[{"type":"tool_use","name":"run_command","input":{"command":"seq 1 200000 > big.txt"}}]}
{"content":[{"type":"tool_use","name":"finish","input":{"summary":"done"}}]}
`
	log := &memLog{}
	l := NewLoop(Config{Model: "scripted", Checkpoints: true}, &model.Gateway{Provider: scriptedFrom(t, script)}, tl, log)
	if err := l.Start(ctx, Task{IssueTitle: "x"}); err != nil {
		t.Fatal(err)
	}
	out, err := l.Run(ctx)
	if err != nil || out.Reason != "finished" {
		t.Fatalf("%+v %v", out, err)
	}
	want := len(gitDiff(t, tl.Root))
	if want <= MaxCheckpointBytes {
		t.Fatalf("the patch is %d bytes, within the limit", want)
	}
	var cp struct {
		Bytes    int  `json:"bytes"`
		TooLarge bool `json:"too_large"`
		Limit    int  `json:"limit"`
		Patch    *string
	}
	for _, e := range log.events {
		if e.Kind == "checkpoint" {
			if err := json.Unmarshal(e.Payload, &cp); err != nil {
				t.Fatal(err)
			}
		}
	}
	if !cp.TooLarge || cp.Bytes != want || cp.Limit != MaxCheckpointBytes || cp.Patch != nil {
		t.Errorf("checkpoint %+v; want too_large, bytes %d, limit %d, no patch", cp, want, MaxCheckpointBytes)
	}
	if l.Resumable() {
		t.Error("a task whose last checkpoint is not on the log says it is resumable")
	}
}

// A start tried again in the same sandbox checks the tree out afresh and
// makes it the base again; the checkpoints after it are against that
// tree. Before, the second InitBase failed ("tag 'warren-base' already
// exists") and the task ended failed at its checkout.
func TestInitBaseTwice(t *testing.T) {
	tl := newRepo(t)
	ctx := context.Background()
	if err := tl.InitBase(ctx); err != nil {
		t.Fatal(err)
	}
	calc := filepath.Join(tl.Root, "calc", "calc.go")
	orig, err := os.ReadFile(calc)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(calc, []byte("package calc\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// The fresh checkout: the tree as it was (noded's unpackInto empties
	// the directory, then unpacks the commit; .git stays here, as the
	// directory's removal in the sandbox would only make it anew).
	if err := os.WriteFile(calc, orig, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := tl.InitBase(ctx); err != nil {
		t.Fatalf("InitBase again: %v", err)
	}
	if patch, err := tl.Checkpoint(ctx); err != nil || patch != "" {
		t.Fatalf("checkpoint of the fresh tree: %q %v, want none", patch, err)
	}
	if err := os.WriteFile(calc, []byte("package calc\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if patch, err := tl.Checkpoint(ctx); err != nil || !strings.Contains(patch, "calc/calc.go") {
		t.Fatalf("checkpoint of a change after the second base: %q %v", patch, err)
	}
}

// loudGit is a TEST DOUBLE of a sandbox whose code replaced git with a
// program that fails, printing 4 MiB to stderr and the same to stdout.
type loudGit struct{ hostSandbox }

func (loudGit) Exec(context.Context, []string, string, time.Duration) (ExecResult, error) {
	big := []byte(strings.Repeat("e", 4<<20) + "the end")
	return ExecResult{ExitCode: 1, Stdout: big, Stderr: big}, nil
}

// A checkpoint's error quotes only the tail of what git printed: the
// sandbox chooses that text, and the node logs the error at every retry
// of the step (it used to be the whole 4 MiB, every 500 ms).
func TestCheckpointErrorQuotesLittleOfGitsOutput(t *testing.T) {
	tl := &Tools{SB: loudGit{}, Root: t.TempDir()}
	_, err := tl.Checkpoint(context.Background())
	if err == nil || len(err.Error()) > 4<<10 || !strings.HasSuffix(err.Error(), "the end") {
		t.Fatalf("checkpoint's error: %d bytes, ends %q", len(fmt.Sprint(err)), fmt.Sprint(err)[max(len(fmt.Sprint(err))-20, 0):])
	}
}
