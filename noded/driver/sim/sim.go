// Package sim is a SIMULATED sandbox driver: sandboxes are in-memory
// records and commands are not run. Claiming takes the configured restore
// latency; a command takes the configured exec latency, and `sleep N`
// takes N seconds more, so scripted tasks can model long tool calls. It
// exists for tests and for capacity benchmarks of the control plane only,
// and is reported as the "sim" driver (simulated) everywhere.
package sim

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/warrenhq/warren/noded/driver"
)

// Config sets the simulated latencies.
type Config struct {
	RestoreLatency time.Duration // a cold claim; 0 means none
	WarmLatency    time.Duration // a claim served from the simulated pool
	ExecLatency    time.Duration // every command, on top of any sleep
}

// Driver is the simulated driver.
type Driver struct {
	cfg     Config
	mu      sync.Mutex
	live    map[string]*sandbox
	targets map[string]int
	warm    map[string]int // simulated warm sandboxes per template
}

// New returns a simulated driver.
func New(cfg Config) *Driver {
	return &Driver{cfg: cfg, live: map[string]*sandbox{}, targets: map[string]int{}, warm: map[string]int{}}
}

// Name is "sim".
func (d *Driver) Name() string { return "sim" }

// Accelerator is "": nothing is virtualised.
func (d *Driver) Accelerator() string { return "" }

// SetPoolTarget records the target; the simulated pool refills at once.
func (d *Driver) SetPoolTarget(template string, n int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.targets[template] = n
	d.warm[template] = n
}

// PoolMemberBytes is 0: a simulated warm sandbox is a counter and holds no
// memory, so no target is too large for a node's memory.
func (d *Driver) PoolMemberBytes(string) int64 { return 0 }

var _ driver.PoolSizer = (*Driver)(nil)

// Live returns the number of sandboxes not yet destroyed.
func (d *Driver) Live() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.live)
}

// Claim creates a simulated sandbox.
func (d *Driver) Claim(ctx context.Context, req driver.ClaimRequest) (driver.Sandbox, error) {
	d.mu.Lock()
	if _, dup := d.live[req.ID]; dup {
		d.mu.Unlock()
		return nil, driver.Errorf(driver.ErrExists, "sim: sandbox %q exists", req.ID)
	}
	warm := d.warm[req.Template] > 0 // the simulated pool refills at once
	sb := &sandbox{d: d, id: req.ID, warm: warm}
	d.live[req.ID] = sb
	d.mu.Unlock()
	lat := d.cfg.RestoreLatency
	if warm {
		lat = d.cfg.WarmLatency
	}
	if err := sleep(ctx, lat); err != nil {
		_ = sb.Destroy()
		return nil, err
	}
	return sb, nil
}

// Get returns a live simulated sandbox. (The sim driver is no
// driver.Lister: the SandboxService offers no simulated sandboxes.)
func (d *Driver) Get(id string) (driver.Sandbox, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	sb, ok := d.live[id]
	return sb, ok
}

// Close destroys every simulated sandbox.
func (d *Driver) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.live = map[string]*sandbox{}
	return nil
}

type sandbox struct {
	d    *Driver
	id   string
	warm bool
}

func (s *sandbox) ID() string { return s.id }
func (s *sandbox) Warm() bool { return s.warm }

// Exec simulates a command: `sleep N` waits N seconds (plus the exec
// latency), anything else only the exec latency; the exit code is 0 and
// the output is "simulated: <command>".
func (s *sandbox) Exec(ctx context.Context, req driver.ExecRequest) (driver.ExecResult, error) {
	s.d.mu.Lock()
	_, ok := s.d.live[s.id]
	s.d.mu.Unlock()
	if !ok {
		return driver.ExecResult{}, fmt.Errorf("sim: sandbox %q is destroyed", s.id)
	}
	start := time.Now()
	d := s.d.cfg.ExecLatency
	if f := strings.Fields(req.Command); len(f) == 2 && f[0] == "sleep" {
		if sec, err := strconv.ParseFloat(f[1], 64); err == nil && sec > 0 {
			d += time.Duration(sec * float64(time.Second))
		}
	}
	if req.Timeout > 0 && d > req.Timeout {
		if err := sleep(ctx, req.Timeout); err != nil {
			return driver.ExecResult{}, err
		}
		return driver.ExecResult{ExitCode: 124, Output: []byte("simulated: timed out"), Duration: time.Since(start)}, nil
	}
	if err := sleep(ctx, d); err != nil {
		return driver.ExecResult{}, err
	}
	return driver.ExecResult{Output: []byte("simulated: " + req.Command), Duration: time.Since(start)}, nil
}

func (s *sandbox) Destroy() error {
	s.d.mu.Lock()
	delete(s.d.live, s.id)
	s.d.mu.Unlock()
	return nil
}

func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Target returns the pool target last set for template.
func (d *Driver) Target(template string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.targets[template]
}
