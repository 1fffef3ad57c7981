// Package driver defines the sandbox driver interface of node daemons.
// Each driver lives in noded/driver/<name>.
package driver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/warrenhq/warren/guest"
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

// The sandbox lifetimes a driver gives by default: DefaultTTL to a claim
// that asks for none, and MaxTTL as the most one may ask for.
const (
	DefaultTTL = time.Hour
	MaxTTL     = 24 * time.Hour
)

// ClaimRequest binds a sandbox's identity at claim time.
type ClaimRequest struct {
	ID       string // sandbox id, unique on the node
	Template string // "" means the driver's default
	Limits   Limits // zero fields take the driver's defaults
	// TTL is the sandbox's wall-clock life; the node destroys it then,
	// whether or not the servers are reachable. 0 means the default.
	TTL time.Duration
	// Env is set in every command's environment.
	Env map[string]string
	// Force, if set, makes the sandbox start this way even when a faster
	// one is ready (benchmarks measure each path): StartRestore skips the
	// pool, StartBoot also skips the snapshot.
	Force Start
}

// Limits bound one sandbox.
type Limits struct {
	VCPUs  int
	MemMB  int
	DiskMB int
	Pids   int // processes inside the sandbox
}

// Start says how a sandbox came to run.
type Start string

// The ways a sandbox starts: from a warm pool, restored from the
// template's snapshot on demand (a cold claim), or booted from scratch.
const (
	StartWarm    Start = "warm"
	StartRestore Start = "restore"
	StartBoot    Start = "boot"
)

// Info describes a sandbox.
type Info struct {
	ID          string
	Template    string // name@version
	State       string // "running" or "paused"; "pausing" or "resuming" while one is under way
	Start       Start
	Limits      Limits
	Created     time.Time
	Expires     time.Time
	ClaimTime   time.Duration // from the claim's start to the guest answering
	Accelerator string
}

// Errors every driver returns for bad input, so the API maps them once.
var (
	ErrInvalid     = errors.New("invalid argument")
	ErrNotFound    = errors.New("not found")
	ErrExists      = errors.New("already exists") // a claim's id is taken
	ErrUnavailable = errors.New("unavailable")
)

// Errorf returns an error of kind (ErrInvalid, ErrNotFound, ErrExists,
// ErrUnavailable)
// whose message is only the formatted text: errors.Is(err, kind) holds.
func Errorf(kind error, format string, args ...any) error {
	return &kindError{kind: kind, msg: fmt.Sprintf(format, args...)}
}

type kindError struct {
	kind error
	msg  string
}

func (e *kindError) Error() string { return e.msg }
func (e *kindError) Unwrap() error { return e.kind }

// Interactive is a sandbox with a real guest: the microvm and container
// drivers' sandboxes implement it, the sim driver's do not.
type Interactive interface {
	Sandbox
	Info() Info
	// Run runs argv, streaming its output as it comes.
	Run(ctx context.Context, req guest.ExecRequest, stdout, stderr io.Writer) (guest.ExecResult, error)
	ReadFile(ctx context.Context, path string, limit int64, w io.Writer) (guest.FileInfo, error)
	// WriteFile writes r's bytes to path with mode (nil: the default,
	// guest.DefaultFileMode; 0 makes a file 0000).
	WriteFile(ctx context.Context, path string, mode *uint32, r io.Reader) (guest.FileInfo, error)
	ListFiles(ctx context.Context, path string) ([]guest.FileInfo, error)
	// Pause saves the sandbox to disk and stops it; Resume brings it back
	// on the same node.
	Pause(ctx context.Context) error
	Resume(ctx context.Context) error
}

// Lister is a driver that can list its live sandboxes (those it re-adopted
// after a restart included).
type Lister interface {
	Sandboxes() []Sandbox
	Get(id string) (Sandbox, bool)
}

// PoolStatus is one template's warm pool on a node.
type PoolStatus struct {
	Template string
	Target   int
	Ready    int
	Filling  int
	Snapshot string // "ready", "making" or why there is none
	// Standby counts QEMUs launched ahead for cold claims, waiting to
	// load the template's snapshot (microvm; zero for other drivers).
	Standby int
}

// PoolSizer is a driver that knows how much memory one warm sandbox of a
// template holds, so that a node can refuse a pool target its memory
// cannot hold.
type PoolSizer interface {
	// PoolMemberBytes is the memory of one warm pool member of template:
	// at most what it can take while it waits and once claimed. 0 means
	// unknown (or none), and no target is refused for it. Safe to call
	// concurrently.
	PoolMemberBytes(template string) int64
}

// Pooler is a driver with real warm pools.
type Pooler interface {
	Pools() []PoolStatus
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

// HostMemoryBytes is the host's memory (MemTotal in /proc/meminfo), or 0
// if unknown.
func HostMemoryBytes() int64 { return hostMemory() }

// hostMemory reads /proc/meminfo once: every claim checks its limits
// against it, and the kernel makes the whole file at each read (a p50 of
// 36 µs here, p99 0.2 ms, on a warm claim's path).
var hostMemory = sync.OnceValue(readHostMemory)

func readHostMemory() int64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "MemTotal:" {
			if kb, err := strconv.ParseInt(f[1], 10, 64); err == nil {
				return kb << 10
			}
		}
	}
	return 0
}

// CheckMemoryMB refuses a sandbox's memory over the host's (when known):
// a guest told it has more than the host would push the host into its
// OOM killer, taking other sandboxes or the node with it.
func CheckMemoryMB(mb int) error {
	if host := HostMemoryBytes() >> 20; host > 0 && int64(mb) > host {
		return fmt.Errorf("limits.memory_mb %d: over this node's memory (%d MiB)", mb, host)
	}
	return nil
}
