package main

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"testing"

	"connectrpc.com/connect"

	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
	"github.com/warrenhq/warren/api/gen/warren/v1/warrenv1connect"
	"github.com/warrenhq/warren/internal/freeaddr"
)

// execFails answers Exec with an error (a FAKE sandbox service; the
// messages are what a node sends for each).
type execFails struct {
	warrenv1connect.UnimplementedSandboxServiceHandler
	err *connect.Error
}

func (e execFails) Exec(context.Context, *connect.Request[warrenv1.ExecRequest], *connect.ServerStream[warrenv1.ExecResponse]) error {
	return e.err
}

// runWarren runs the warren binary and returns its exit status and stderr.
func runWarren(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	cmd := exec.Command(warrenBin, args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	var exit *exec.ExitError
	if err := cmd.Run(); err != nil && !errors.As(err, &exit) {
		t.Fatal(err)
	}
	return cmd.ProcessState.ExitCode(), out.String(), errb.String()
}

// sandbox exec's own failures exit 125, 126 or 127, never 1, which is
// many commands' own answer (grep found nothing): before, a sandbox that
// was gone, a server that could not be reached and a command not found
// all exited 1, as a grep that matched nothing does.
func TestSandboxExecOwnFailuresAreNotTheCommands(t *testing.T) {
	for _, tc := range []struct {
		name   string
		err    *connect.Error
		status int
	}{
		{"no such sandbox", connect.NewError(connect.CodeNotFound, errors.New("sandbox sb-0000000000-n1: not found (destroyed, expired, or never made)")), 125},
		{"node unavailable", connect.NewError(connect.CodeUnavailable, errors.New("node n1 is not reachable")), 125},
		{"not found", connect.NewError(connect.CodeFailedPrecondition, errors.New(`guest: start "nope": exec: "nope": executable file not found in $PATH`)), 127},
		{"a path not found", connect.NewError(connect.CodeFailedPrecondition, errors.New(`guest: start "/x/nope": fork/exec /x/nope: no such file or directory`)), 127},
		{"not executable", connect.NewError(connect.CodeFailedPrecondition, errors.New(`guest: start "/etc/passwd": fork/exec /etc/passwd: permission denied`)), 126},
		{"bad directory", connect.NewError(connect.CodeFailedPrecondition, errors.New(`guest: start "true": dir /nope: no such file or directory`)), 126},
		// A start failure's words under another code are not a start
		// failure of the command.
		{"other code", connect.NewError(connect.CodeInternal, errors.New(`guest: start "nope": exec: "nope": executable file not found in $PATH`)), 125},
	} {
		mux := http.NewServeMux()
		mux.Handle(warrenv1connect.NewSandboxServiceHandler(execFails{err: tc.err}))
		hs := httptest.NewServer(mux)
		status, _, stderr := runWarren(t, "sandbox", "exec", "--server", hs.URL, "sb-0000000000-n1", "--", "nope")
		hs.Close()
		if status != tc.status || !strings.Contains(stderr, tc.err.Message()) {
			t.Errorf("%s: exit status %d, stderr %q; want %d and the error", tc.name, status, stderr, tc.status)
		}
	}

	// The command's own codes pass through, 1 included.
	mux := http.NewServeMux()
	mux.Handle(warrenv1connect.NewSandboxServiceHandler(execCode{code: 1}))
	hs := httptest.NewServer(mux)
	defer hs.Close()
	if status, _, stderr := runWarren(t, "sandbox", "exec", "--server", hs.URL, "sb-0000000000-n1", "--", "false"); status != 1 || stderr != "" {
		t.Errorf("exit code 1: exit status %d, stderr %q; want 1 and nothing", status, stderr)
	}

	// Warren's own failures before any call: bad flags, no server.
	for _, args := range [][]string{
		{"sandbox", "exec", "--server", hs.URL, "--cmd-timeout", "-1s", "sb-0000000000-n1", "--", "true"},
		{"sandbox", "exec", "--server", hs.URL, "--no-such-flag", "sb-0000000000-n1", "--", "true"},
		{"sandbox", "exec", "--server", hs.URL, "sb-0000000000-n1"},
		{"sandbox", "exec", "--server", "http://" + freeaddr.Loopback(t), "--timeout", "5s", "sb-0000000000-n1", "--", "true"},
	} {
		if status, _, stderr := runWarren(t, args...); status != 125 || stderr == "" {
			t.Errorf("%q: exit status %d, stderr %q; want 125 and an error", args, status, stderr)
		}
	}
	if status, _, _ := runWarren(t, "sandbox", "exec", "-h"); status != 0 {
		t.Errorf("sandbox exec -h: exit status %d, want 0", status)
	}
}

// -o json is taken by exec, cp and rm, which print no JSON (the command's
// output, the file's bytes, the ids removed): the command table is
// stable, and scripts pass -o json to every command.
func TestSandboxJSONOutputKeepsWorking(t *testing.T) {
	mux := http.NewServeMux()
	mux.Handle(warrenv1connect.NewSandboxServiceHandler(execOnce{}))
	hs := httptest.NewServer(mux)
	defer hs.Close()
	if status, out, stderr := runWarren(t, "sandbox", "exec", "--server", hs.URL, "-o", "json", "sb-0000000000-n1", "--", "true"); status != 0 || out != "output" {
		t.Errorf("exec -o json: exit status %d, stdout %q, stderr %q; want 0 and the command's output", status, out, stderr)
	}
	url := serveDelete(t, 0)
	status, out, stderr := runWarren(t, "sandbox", "rm", "--server", url, "-o", "json", "sb-0000000000-n1", "sb-0000000001-n1")
	if status != 0 || out != "sb-0000000000-n1\nsb-0000000001-n1\n" {
		t.Errorf("rm -o json: exit status %d, stdout %q, stderr %q", status, out, stderr)
	}
}
