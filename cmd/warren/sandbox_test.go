package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"connectrpc.com/connect"

	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
	"github.com/warrenhq/warren/api/gen/warren/v1/warrenv1connect"
	"github.com/warrenhq/warren/noded"
)

// Bad sandbox and task flags are refused before any call, naming the
// flag: a TTL below 0, values that would wrap in the API's 32-bit fields,
// and input over the API's limits (not read whole into memory first).
func TestSandboxFlagErrors(t *testing.T) {
	big := filepath.Join(t.TempDir(), "big")
	if err := os.WriteFile(big, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(big, noded.MaxFileBytes+1); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"sandbox", "create", "--ttl", "-1s"}, "ttl -1s: must not be negative"},
		{[]string{"sandbox", "create", "--memory-mb", "4294967424"}, "memory-mb 4294967424: over 4294967295"},
		{[]string{"sandbox", "create", "--vcpus", "4294967296"}, "vcpus 4294967296: over"},
		{[]string{"sandbox", "cp", big, "sb-0000000000-dev:/x"}, "over the limit of 33554432"},
		{[]string{"pool", "set", "default", "4294967296"}, "pool set: N 4294967296: over the limit of 1000 per node"},
		{[]string{"pool", "set", "default", "99999999999999999999999"}, "over the limit of 1000 per node"},
		{[]string{"pool", "set", "default", "007"}, `pool set: N "007": want a whole number`},
		{[]string{"task", "list", "--limit", "-1"}, "limit: -1 must not be negative (0: all)"},
		{[]string{"sandbox", "create", "--env", "A=1,B=2,A=3"}, "env: A given twice"},
		{[]string{"sandbox", "exec", "--env", "A=1,A=1", "sb-0000000000-dev", "--", "true"}, "env: A given twice"},
		{[]string{"sandbox", "exec", "--cmd-timeout", "-1s", "sb-0000000000-dev", "--", "true"}, "--cmd-timeout -1s: must not be negative"},
		{[]string{"task", "create", "--repo", "https://example.com/r.git", "--base", "main", "--title", "t",
			"--script-steps", "1", "--script-step-millis", "4294967496"}, "script-step-millis 4294967496: over 4294967295"},
		{[]string{"task", "create", "--repo", "https://example.com/r.git", "--base", "main", "--title", "t",
			"--script-steps", "1", "--script-output-bytes", "4294967297"}, "script-output-bytes 4294967297: over"},
	} {
		var out, errOut bytes.Buffer
		err := run(c.args, &out, &errOut)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("warren %s: error %v, want it to say %q", strings.Join(c.args, " "), err, c.want)
		}
	}
}

func TestReadAtMost(t *testing.T) {
	if b, err := readAtMost(strings.NewReader("12345"), 5, "stdin"); err != nil || string(b) != "12345" {
		t.Errorf("at the limit: %q %v", b, err)
	}
	if _, err := readAtMost(strings.NewReader("123456"), 5, "stdin"); err == nil || !strings.Contains(err.Error(), "stdin: over the limit of 5 bytes") {
		t.Errorf("over the limit: %v", err)
	}
}

// fakeSandboxes answers pool set and sandbox ls as a cluster with a
// microvm node (n1), a container node (n2, which keeps no pool), a node
// that did not answer (n3) and one that refused (n4).
type fakeSandboxes struct {
	warrenv1connect.UnimplementedSandboxServiceHandler
}

func (fakeSandboxes) SetPoolTarget(context.Context, *connect.Request[warrenv1.SetPoolTargetRequest]) (*connect.Response[warrenv1.SetPoolTargetResponse], error) {
	return connect.NewResponse(&warrenv1.SetPoolTargetResponse{
		Pools: []*warrenv1.PoolStatus{{NodeId: "n1", Template: "default", Target: 4, Snapshot: "ready"},
			{NodeId: "n2", Template: "default", Note: "the container driver keeps no warm pool"}},
		UnreachableNodes: []string{"n3: unavailable: dial tcp 10.0.0.3:7000: connect: connection refused"},
		RefusedNodes:     []string{`n4: not_found: template "default": not on this node`},
	}), nil
}

func (fakeSandboxes) ListSandboxes(context.Context, *connect.Request[warrenv1.ListSandboxesRequest]) (*connect.Response[warrenv1.ListSandboxesResponse], error) {
	return connect.NewResponse(&warrenv1.ListSandboxesResponse{Sandboxes: []*warrenv1.Sandbox{
		{Id: "sb-0000000000-n1", NodeId: "n1"},
		{Id: "01JABCDEFGHJKMNPQRSTVWXYZ0-e1", NodeId: "n1", TaskId: "01JABCDEFGHJKMNPQRSTVWXYZ0"},
	}}), nil
}

// `warren pool set` says which nodes did not answer and which refused
// (with their reason), apart; a node that keeps no pool on purpose gets
// a note, not a warning. `warren sandbox ls` shows a task's sandboxes
// with their task, and says how they are managed.
func TestPoolAndSandboxListingsNameEachNodesOutcome(t *testing.T) {
	mux := http.NewServeMux()
	mux.Handle(warrenv1connect.NewSandboxServiceHandler(fakeSandboxes{}))
	hs := httptest.NewServer(mux)
	defer hs.Close()

	var out, errOut bytes.Buffer
	if err := run([]string{"pool", "set", "--server", hs.URL, "default", "4"}, &out, &errOut); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"warning: node n3 did not answer (unavailable: dial tcp",
		`warning: node n4 refused: not_found: template "default": not on this node`,
		"note: node n2: the container driver keeps no warm pool (template default)",
	} {
		if !strings.Contains(errOut.String(), want) {
			t.Errorf("pool set: stderr %q, want %q", errOut.String(), want)
		}
	}
	if strings.Contains(errOut.String(), "n2 did not answer") || strings.Contains(errOut.String(), "n4 did not answer") || strings.Contains(out.String(), "n2") {
		t.Errorf("pool set: stdout %q stderr %q", out.String(), errOut.String())
	}

	out.Reset()
	errOut.Reset()
	if err := run([]string{"sandbox", "ls", "--server", hs.URL}, &out, &errOut); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 3 || !strings.HasSuffix(strings.TrimSpace(lines[0]), "TASK") ||
		!strings.HasSuffix(lines[1], " -") || !strings.HasSuffix(lines[2], " 01JABCDEFGHJKMNPQRSTVWXYZ0") {
		t.Errorf("sandbox ls:\n%s", out.String())
	}
	if !strings.Contains(errOut.String(), "warren task cancel") {
		t.Errorf("sandbox ls: stderr %q, want a note on task sandboxes", errOut.String())
	}
}

// A local source whose size says nothing (a pipe, <(cmd), a device) is
// read within the limit too, not whole into memory and then sent.
func TestSandboxCpFromAPipeKeepsTheLimit(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		f, err := os.OpenFile(fifo, os.O_WRONLY, 0)
		if err != nil {
			return
		}
		defer f.Close()
		chunk := make([]byte, 1<<20)
		for n := 0; n <= noded.MaxFileBytes; n += len(chunk) {
			if _, err := f.Write(chunk); err != nil {
				return // the reader stopped at the limit
			}
		}
	}()
	var out, errOut bytes.Buffer
	// No server answers here: the limit must stop cp before any call.
	err := run([]string{"sandbox", "cp", "--server", "http://127.0.0.1:1", fifo, "sb-0000000000-dev:/x"}, &out, &errOut)
	if err == nil || !strings.Contains(err.Error(), "over the limit of 33554432 bytes") {
		t.Errorf("cp from a fifo of more than %d bytes: %v", noded.MaxFileBytes, err)
	}
	<-done
}

// noNodesYet answers pool set as a cluster with no sandbox node up: the
// servers record the cluster's target, and no node has taken it.
type noNodesYet struct {
	warrenv1connect.UnimplementedSandboxServiceHandler
}

func (noNodesYet) SetPoolTarget(context.Context, *connect.Request[warrenv1.SetPoolTargetRequest]) (*connect.Response[warrenv1.SetPoolTargetResponse], error) {
	return connect.NewResponse(&warrenv1.SetPoolTargetResponse{}), nil
}

// A cluster target no node has taken yet is recorded, and pool set exits
// 0 saying so (it exited 1, "no node took the target", for a target the
// nodes then took at their next session); one node's target (--node) that
// the node did not take is still an error.
func TestPoolSetWithNoNodeUpIsRecorded(t *testing.T) {
	mux := http.NewServeMux()
	mux.Handle(warrenv1connect.NewSandboxServiceHandler(noNodesYet{}))
	hs := httptest.NewServer(mux)
	defer hs.Close()
	var out, errOut bytes.Buffer
	if err := run([]string{"pool", "set", "--server", hs.URL, "default", "3"}, &out, &errOut); err != nil {
		t.Fatalf("the cluster's target: %v", err)
	}
	if !strings.Contains(errOut.String(), "the cluster's target is recorded; no node has taken it yet") {
		t.Errorf("stderr %q", errOut.String())
	}
	err := run([]string{"pool", "set", "--server", hs.URL, "--node", "n1", "default", "3"}, &out, &errOut)
	if err == nil || !strings.Contains(err.Error(), "node n1 did not take the target") {
		t.Errorf("one node's target: %v", err)
	}
}

// execOnce answers Exec with some output and exit code 0 (a FAKE
// sandbox service).
type execOnce struct {
	warrenv1connect.UnimplementedSandboxServiceHandler
}

func (execOnce) Exec(_ context.Context, _ *connect.Request[warrenv1.ExecRequest], st *connect.ServerStream[warrenv1.ExecResponse]) error {
	if err := st.Send(&warrenv1.ExecResponse{Event: &warrenv1.ExecResponse_Stdout{Stdout: []byte("output")}}); err != nil {
		return err
	}
	return st.Send(&warrenv1.ExecResponse{Event: &warrenv1.ExecResponse_Exit{Exit: &warrenv1.ExitStatus{Code: 0}}})
}

// execCode answers Exec with the exit code it holds (a FAKE sandbox
// service, as a node passing on what a hostile guest reported).
type execCode struct {
	warrenv1connect.UnimplementedSandboxServiceHandler
	code int32
}

func (e execCode) Exec(_ context.Context, _ *connect.Request[warrenv1.ExecRequest], st *connect.ServerStream[warrenv1.ExecResponse]) error {
	return st.Send(&warrenv1.ExecResponse{Event: &warrenv1.ExecResponse_Exit{Exit: &warrenv1.ExitStatus{Code: e.code}}})
}

// warren sandbox exec never exits 0 for a command that did not exit 0: a
// code no process can exit with (outside 0..255) exits 125 (sandbox
// exec's own failure) with an error naming it. Before, it exited with os.Exit(code), and os.Exit(256) exits
// 0, a success.
func TestSandboxExecExitCodeOutsideAByteFails(t *testing.T) {
	for _, tc := range []struct {
		code   int32
		status int
		stderr string
	}{
		{0, 0, ""},
		{3, 3, ""},
		{255, 255, ""},
		{256, 125, "exit code 256, outside 0..255"},
		{512, 125, "exit code 512, outside 0..255"},
		{-1, 125, "exit code -1, outside 0..255"},
		{-256, 125, "exit code -256, outside 0..255"},
	} {
		mux := http.NewServeMux()
		mux.Handle(warrenv1connect.NewSandboxServiceHandler(execCode{code: tc.code}))
		hs := httptest.NewServer(mux)
		cmd := exec.Command(warrenBin, "sandbox", "exec", "--server", hs.URL, "sb-0000000000-n1", "--", "true")
		var errb bytes.Buffer
		cmd.Stderr = &errb
		err := cmd.Run()
		hs.Close()
		var exit *exec.ExitError
		if err != nil && !errors.As(err, &exit) {
			t.Fatal(err)
		}
		status := cmd.ProcessState.ExitCode()
		if status != tc.status || (tc.stderr == "") != (errb.Len() == 0) || !strings.Contains(errb.String(), tc.stderr) {
			t.Errorf("exit code %d from the node: exit status %d, stderr %q; want %d, %q", tc.code, status, errb.String(), tc.status, tc.stderr)
		}
	}
}

type failingWriter struct{}

func (failingWriter) Write([]byte) (int, error) { return 0, syscall.ENOSPC }

// Output that cannot be written (a full disk, a closed stdout) fails
// sandbox exec; before, it was dropped and the command's exit code, 0,
// returned.
func TestSandboxExecFailsWhenItsOutputCannotBeWritten(t *testing.T) {
	mux := http.NewServeMux()
	mux.Handle(warrenv1connect.NewSandboxServiceHandler(execOnce{}))
	hs := httptest.NewServer(mux)
	defer hs.Close()
	var errOut bytes.Buffer
	err := run([]string{"sandbox", "exec", "--server", hs.URL, "sb-0000000000-n1", "--", "true"}, failingWriter{}, &errOut)
	if err == nil || !strings.Contains(err.Error(), "no space left") {
		t.Fatalf("exec with a stdout that fails: %v, want the write's error", err)
	}
}

// writeSpy records the WriteFile it gets (a FAKE sandbox service).
type writeSpy struct {
	warrenv1connect.UnimplementedSandboxServiceHandler
	got chan *warrenv1.WriteFileRequest
}

func (w writeSpy) WriteFile(_ context.Context, req *connect.Request[warrenv1.WriteFileRequest]) (*connect.Response[warrenv1.WriteFileResponse], error) {
	w.got <- req.Msg
	return connect.NewResponse(&warrenv1.WriteFileResponse{File: &warrenv1.FileInfo{Name: "f", Size: int64(len(req.Msg.GetData()))}}), nil
}

// cp sends a file's setuid, setgid and sticky bits with its permissions,
// as Unix writes them; it sent Perm() alone, so 04755 arrived as 0755.
func TestSandboxCpKeepsSpecialModeBits(t *testing.T) {
	spy := writeSpy{got: make(chan *warrenv1.WriteFileRequest, 1)}
	mux := http.NewServeMux()
	mux.Handle(warrenv1connect.NewSandboxServiceHandler(spy))
	hs := httptest.NewServer(mux)
	defer hs.Close()
	f := filepath.Join(t.TempDir(), "tool")
	if err := os.WriteFile(f, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(f, 0o755|os.ModeSetuid|os.ModeSticky); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	if err := run([]string{"sandbox", "cp", "--server", hs.URL, f, "sb-0000000000-n1:/work/tool"}, &out, &errOut); err != nil {
		t.Fatal(err)
	}
	if m := (<-spy.got).GetMode(); m != 0o5755 {
		t.Fatalf("mode sent %o, want 5755", m)
	}
}

// cp of a mode-0000 file sends the mode set to 0; it sent 0 unset, which
// the wire reads as "the default", so the file arrived 0644.
func TestSandboxCpSendsModeZero(t *testing.T) {
	f := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(f, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(f, 0); err != nil {
		t.Fatal(err)
	}
	if r, err := os.Open(f); err != nil {
		t.Skipf("reading a mode-0000 file needs root (CAP_DAC_OVERRIDE): %v", err)
	} else {
		r.Close()
	}
	spy := writeSpy{got: make(chan *warrenv1.WriteFileRequest, 1)}
	mux := http.NewServeMux()
	mux.Handle(warrenv1connect.NewSandboxServiceHandler(spy))
	hs := httptest.NewServer(mux)
	defer hs.Close()
	var out, errOut bytes.Buffer
	if err := run([]string{"sandbox", "cp", "--server", hs.URL, f, "sb-0000000000-n1:/work/secret"}, &out, &errOut); err != nil {
		t.Fatal(err)
	}
	req := <-spy.got
	if m := req.ProtoReflect(); !m.Has(m.Descriptor().Fields().ByName("mode")) {
		t.Fatal("mode sent unset (the default, 0644), want set to 0")
	}
	if req.GetMode() != 0 {
		t.Fatalf("mode sent %o, want set to 0", req.GetMode())
	}
}

// deleteAnswer is a SandboxService whose DeleteSandbox answers code (0:
// deleted).
type deleteAnswer struct {
	warrenv1connect.UnimplementedSandboxServiceHandler
	code connect.Code
}

func (d deleteAnswer) DeleteSandbox(context.Context, *connect.Request[warrenv1.DeleteSandboxRequest]) (*connect.Response[warrenv1.DeleteSandboxResponse], error) {
	if d.code == 0 {
		return connect.NewResponse(&warrenv1.DeleteSandboxResponse{}), nil
	}
	return nil, connect.NewError(d.code, errors.New("as told"))
}

func serveDelete(t *testing.T, code connect.Code) string {
	mux := http.NewServeMux()
	mux.Handle(warrenv1connect.NewSandboxServiceHandler(deleteAnswer{code: code}))
	hs := httptest.NewServer(mux)
	t.Cleanup(hs.Close)
	return hs.URL
}

// A delete whose first server answered unavailable (it may have
// forwarded the delete, and died before the node's answer came back) and
// whose next server finds the sandbox gone succeeded: `sandbox rm`
// reported not_found and exit 1. A first server that could not be
// reached at all sent nothing, so not_found after it is still an error.
func TestSandboxRmAfterALostAnswer(t *testing.T) {
	gone := serveDelete(t, connect.CodeNotFound)
	var out, errb bytes.Buffer
	err := run([]string{"sandbox", "rm", "sb-0000000000-n1", "--server", serveDelete(t, connect.CodeUnavailable) + "," + gone}, &out, &errb)
	if err != nil || strings.TrimSpace(out.String()) != "sb-0000000000-n1" {
		t.Errorf("sandbox rm after a lost answer: %v, stdout %q; want the id, exit 0", err, out.String())
	}
	dead := httptest.NewServer(http.NotFoundHandler())
	dead.Close()
	err = run([]string{"sandbox", "rm", "sb-0000000000-n1", "--server", dead.URL + "," + gone}, &out, &errb)
	if !strings.Contains(fmt.Sprint(err), "not_found") {
		t.Errorf("sandbox rm after a server that could not be reached: %v, want not_found", err)
	}
}

// --env takes K=V, repeated or joined by commas; a comma not followed by
// a name and = is the value's own. PASS=x,y was refused with an error
// quoting "y", a piece of what is often a secret.
func TestParseEnv(t *testing.T) {
	for _, c := range []struct {
		in   []string
		want map[string]string
	}{
		{nil, nil},
		{[]string{"A=1"}, map[string]string{"A": "1"}},
		{[]string{"A=1,B=2"}, map[string]string{"A": "1", "B": "2"}},
		{[]string{"A=1", "B=2"}, map[string]string{"A": "1", "B": "2"}},
		{[]string{"PASS=x,y"}, map[string]string{"PASS": "x,y"}},
		{[]string{"L=a,b,E=f"}, map[string]string{"L": "a,b", "E": "f"}},
		{[]string{"Q=a,1x=2"}, map[string]string{"Q": "a,1x=2"}},
		{[]string{"EMPTY="}, map[string]string{"EMPTY": ""}},
	} {
		got, err := parseEnv(c.in...)
		if err != nil || !maps.Equal(got, c.want) {
			t.Errorf("parseEnv(%q) = %v, %v; want %v", c.in, got, err, c.want)
		}
	}
	for _, in := range [][]string{{"s3cr3t"}, {"=s3cr3t"}, {"A=1", "A=s3cr3t"}} {
		_, err := parseEnv(in...)
		if err == nil || strings.Contains(err.Error(), "s3cr3t") {
			t.Errorf("parseEnv(%q) = %v; want an error that does not quote the value", in, err)
		}
	}
}

// A file's name, which the sandbox chooses, is printed with its control
// characters as '?': an ESC in it reached the operator's terminal as is
// (moving the cursor, retitling the window, rewriting what was printed).
func TestSandboxFilesShowsControlCharactersAsQuestionMarks(t *testing.T) {
	mux := http.NewServeMux()
	mux.Handle(warrenv1connect.NewSandboxServiceHandler(evilNames{}))
	hs := httptest.NewServer(mux)
	defer hs.Close()
	var out, errb bytes.Buffer
	if err := run([]string{"sandbox", "files", "sb-0000000000-n1", "/", "--server", hs.URL}, &out, &errb); err != nil {
		t.Fatal(err)
	}
	if strings.ContainsAny(out.String(), "\x1b\x07\r") || !strings.Contains(out.String(), "?]0;owned?") {
		t.Errorf("sandbox files printed %q", out.String())
	}
	if got := termSafe("a\x1b[2Jb\nc\td\xff", true); got != "a?[2Jb\nc\td\uFFFD" {
		t.Errorf("termSafe kept lines as %q", got)
	}
}

type evilNames struct {
	warrenv1connect.UnimplementedSandboxServiceHandler
}

func (evilNames) ListFiles(context.Context, *connect.Request[warrenv1.ListFilesRequest]) (*connect.Response[warrenv1.ListFilesResponse], error) {
	return connect.NewResponse(&warrenv1.ListFilesResponse{Files: []*warrenv1.FileInfo{{Name: "\x1b]0;owned\x07\r", Mode: 0o644}}}), nil
}

// exitStatus never makes a failure exit 0: an exitCode a process cannot
// exit with is status 1, as any other error is.
func TestExitStatus(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want int
	}{
		{exitCode(1), 1}, {exitCode(255), 255}, {fmt.Errorf("wrapped: %w", exitCode(2)), 2},
		{exitCode(0), 1}, {exitCode(256), 1}, {exitCode(-1), 1}, {exitCode(1 << 32), 1},
		{errUsage, 1}, {errors.New("x"), 1}, {flag.ErrHelp, 0},
	} {
		if got := exitStatus(tc.err); got != tc.want {
			t.Errorf("exitStatus(%v) = %d, want %d", tc.err, got, tc.want)
		}
	}
}

// readServe answers ReadFile with data and mode (a FAKE sandbox service).
type readServe struct {
	warrenv1connect.UnimplementedSandboxServiceHandler
	data []byte
	mode uint32
}

func (r readServe) ReadFile(context.Context, *connect.Request[warrenv1.ReadFileRequest]) (*connect.Response[warrenv1.ReadFileResponse], error) {
	return connect.NewResponse(&warrenv1.ReadFileResponse{Data: r.data, File: &warrenv1.FileInfo{Name: "f", Size: int64(len(r.data)), Mode: r.mode}}), nil
}

func serveRead(t *testing.T, data []byte, mode uint32) string {
	t.Helper()
	mux := http.NewServeMux()
	mux.Handle(warrenv1connect.NewSandboxServiceHandler(readServe{data: data, mode: mode}))
	hs := httptest.NewServer(mux)
	t.Cleanup(hs.Close)
	return hs.URL
}

// A copy out that fails part way (here the file size limit, 64 KiB, of
// a 1 MiB file) leaves the old file as it was, and no temporary file.
// Before, the old file was truncated and left holding the first 64 KiB
// of the new one.
func TestSandboxCpOutFailureKeepsTheOldFile(t *testing.T) {
	url := serveRead(t, bytes.Repeat([]byte("new\n"), 1<<18), 0o644)
	dir := t.TempDir()
	dst := filepath.Join(dir, "f")
	if err := os.WriteFile(dst, []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	// ulimit -f counts blocks of 512 bytes (dash) or 1 KiB (bash): 64 KiB
	// at most either way. Go ignores SIGXFSZ: the write fails with EFBIG.
	cmd := exec.Command("sh", "-c", `ulimit -f 64 && exec "$0" "$@"`,
		warrenBin, "sandbox", "cp", "--server", url, "sb-0000000000-n1:/f", dst)
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 || !strings.Contains(string(out), "file too large") {
		t.Errorf("cp of 1 MiB under a limit of 64 KiB: %v, %s; want exit status 1 and EFBIG", err, out)
	}
	if got, err := os.ReadFile(dst); err != nil || string(got) != "old" {
		t.Errorf("after the failed copy the destination holds %d bytes (%.10q), %v; want %q", len(got), got, err, "old")
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("the failed copy left %d entries in the directory: %v", len(ents), ents)
	}
}

// A copy out replaces an existing file keeping its mode, writes through a
// symlink (the link stays), and makes a new file with the sandbox file's
// mode less the umask, as os.WriteFile did.
func TestSandboxCpOutModesAndLinks(t *testing.T) {
	url := serveRead(t, []byte("new"), 0o777)
	dir := t.TempDir()
	cp := func(dst string) {
		t.Helper()
		var out, errOut bytes.Buffer
		if err := run([]string{"sandbox", "cp", "--server", url, "sb-0000000000-n1:/f", dst}, &out, &errOut); err != nil {
			t.Fatalf("cp to %s: %v", dst, err)
		}
	}
	check := func(path string, mode os.FileMode) {
		t.Helper()
		fi, err := os.Lstat(path)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := os.ReadFile(path)
		if string(got) != "new" || fi.Mode() != mode {
			t.Errorf("%s: %q, mode %v; want %q, %v", filepath.Base(path), got, fi.Mode(), "new", mode)
		}
	}
	old := syscall.Umask(0o027)
	defer syscall.Umask(old)

	existing := filepath.Join(dir, "existing")
	os.WriteFile(existing, []byte("old"), 0o600)
	os.Chmod(existing, 0o600)
	cp(existing)
	check(existing, 0o600)

	fresh := filepath.Join(dir, "fresh")
	cp(fresh)
	check(fresh, 0o750)

	target, link := filepath.Join(dir, "target"), filepath.Join(dir, "link")
	os.WriteFile(target, []byte("old"), 0o640)
	os.Chmod(target, 0o640)
	if err := os.Symlink("target", link); err != nil {
		t.Fatal(err)
	}
	cp(link)
	check(target, 0o640)
	if fi, err := os.Lstat(link); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Errorf("the link was replaced: %v, %v", fi, err)
	}

	var out, errOut bytes.Buffer
	if err := run([]string{"sandbox", "cp", "--server", url, "sb-0000000000-n1:/f", dir}, &out, &errOut); err == nil || !strings.Contains(err.Error(), "is a directory") {
		t.Errorf("cp onto a directory: %v", err)
	}
}
