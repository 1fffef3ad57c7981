package driver

import (
	"context"
	"io"
	"strings"

	"github.com/warrenhq/warren/guest"
)

// AgentCalls implements the calls of Interactive (and Sandbox.Exec) that
// go straight to a sandbox's guest agent. A driver's sandbox embeds it and
// sets Agent to a function that returns the agent of a running sandbox, or
// a driver error saying why there is none (destroyed, paused).
type AgentCalls struct {
	Agent func() (*guest.Client, error)
	// CallErr, if set, may replace the error of a call that failed (with
	// the reason the sandbox went away, say).
	CallErr func(error) error
}

func (a AgentCalls) callErr(err error) error {
	if err == nil || a.CallErr == nil {
		return err
	}
	return a.CallErr(err)
}

func (a AgentCalls) agent() (*guest.Client, error) {
	if a.Agent == nil {
		return nil, Errorf(ErrUnavailable, "sandbox has no agent")
	}
	return a.Agent()
}

// MaxExecOutput bounds the output Exec keeps (its head and its tail).
const MaxExecOutput = 4 << 20

// Exec runs a shell command and returns its combined output (task actors),
// at most MaxExecOutput of it.
func (a AgentCalls) Exec(ctx context.Context, req ExecRequest) (ExecResult, error) {
	out := NewCappedOutput(MaxExecOutput)
	res, err := a.Run(ctx, guest.ExecRequest{Argv: []string{"/bin/sh", "-c", req.Command}, Timeout: req.Timeout}, out, out)
	if err != nil {
		return ExecResult{}, err
	}
	return ExecResult{ExitCode: res.ExitCode, Output: out.Bytes(), Duration: res.Duration}, nil
}

// Run runs argv in the sandbox, streaming its output.
func (a AgentCalls) Run(ctx context.Context, req guest.ExecRequest, stdout, stderr io.Writer) (guest.ExecResult, error) {
	c, err := a.agent()
	if err != nil {
		return guest.ExecResult{}, err
	}
	res, err := c.Exec(ctx, req, stdout, stderr)
	return res, a.callErr(err)
}

// ReadFile copies a file out of the sandbox to w.
func (a AgentCalls) ReadFile(ctx context.Context, path string, limit int64, w io.Writer) (guest.FileInfo, error) {
	c, err := a.agent()
	if err != nil {
		return guest.FileInfo{}, err
	}
	fi, err := c.ReadFile(ctx, path, limit, w)
	return fi, a.callErr(err)
}

// WriteFile writes a file in the sandbox (mode as guest.Client.WriteFile's).
func (a AgentCalls) WriteFile(ctx context.Context, path string, mode *uint32, r io.Reader) (guest.FileInfo, error) {
	c, err := a.agent()
	if err != nil {
		return guest.FileInfo{}, err
	}
	fi, err := c.WriteFile(ctx, path, mode, r)
	return fi, a.callErr(err)
}

// ListFiles lists a directory in the sandbox.
func (a AgentCalls) ListFiles(ctx context.Context, path string) ([]guest.FileInfo, error) {
	c, err := a.agent()
	if err != nil {
		return nil, err
	}
	fs, err := c.List(ctx, path)
	return fs, a.callErr(err)
}

// ShellQuote quotes s as one word for /bin/sh, for the command lines a
// driver hands to a shell (QEMU's exec: migration, a runtime wrapper).
func ShellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// Hostname is a sandbox id cut to a valid host name (63 bytes at most).
func Hostname(id string) string {
	if len(id) > 63 {
		return id[:63]
	}
	return id
}
