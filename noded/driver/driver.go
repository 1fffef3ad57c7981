// Package driver defines the sandbox driver interface of node daemons.
// Each driver lives in noded/driver/<name>.
package driver

import (
	"context"
	"time"
)

// Driver creates sandboxes of one kind.
type Driver interface {
	// Name is "microvm", "container" or "sim".
	Name() string
	// Accelerator is "kvm", "tcg" or "" for drivers without one.
	Accelerator() string
	// Claim returns a running sandbox of the template: warm from a pool
	// when one is ready, cold otherwise.
	Claim(ctx context.Context, req ClaimRequest) (Sandbox, error)
	// SetPoolTarget sets how many warm sandboxes of template to keep.
	SetPoolTarget(template string, n int)
	// Close destroys every sandbox and pool of the driver.
	Close() error
}

// ClaimRequest binds a sandbox's identity at claim time.
type ClaimRequest struct {
	ID       string // sandbox id, unique on the node
	Template string // "" means the driver's default
}

// Sandbox is one isolated environment.
type Sandbox interface {
	ID() string
	// Warm reports whether the sandbox came from a warm pool.
	Warm() bool
	// Exec runs a shell command and waits for it.
	Exec(ctx context.Context, req ExecRequest) (ExecResult, error)
	// Destroy stops the sandbox and frees everything it holds.
	Destroy() error
}

// ExecRequest is one command.
type ExecRequest struct {
	Command string
	Timeout time.Duration // 0 means no limit beyond ctx
}

// ExecResult is what a command did.
type ExecResult struct {
	ExitCode int
	Output   []byte
	Duration time.Duration
}
