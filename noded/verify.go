package noded

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/warrenhq/warren/actor"
	"github.com/warrenhq/warren/agent"
	"github.com/warrenhq/warren/guest"
	"github.com/warrenhq/warren/netpolicy"
	"github.com/warrenhq/warren/noded/driver"
)

// The finish step's tests run in a sandbox of their own, the verification
// sandbox: claimed from the node's driver with the task's template, it
// holds the repository at the pinned commit with the model's diff applied,
// and nothing else the model did in its own sandbox. There the model ran
// any command as root for the whole task: a file written outside the
// repository, a tool's settings (`go env -w GOFLAGS=-run=^$`), a binary
// replaced or an alias would make its tests pass there whatever the diff.

// verifyTTL is the TTL of a verification sandbox: the test run and a
// margin to claim it, unpack the repository and destroy it. It is
// destroyed as soon as the tests end; the TTL bounds what a node that
// dies meanwhile leaves behind.
const verifyTTL = testTimeout + 5*time.Minute

// verifySandboxID names a round's verification sandbox: the task's own
// sandbox id (TASK-eEPOCH) with -verify-ROUND.
func verifySandboxID(task string, epoch uint64, round int) string {
	return fmt.Sprintf("%s-e%d-verify-%d", task, epoch, round)
}

// runTestsClean runs cmd in a verification sandbox holding the
// repository at the workspace's pinned commit with patch (the model's
// diff against it) applied, as the model's sandbox got it: unpacked, made
// the base commit of a local git repository (Tools.InitBase), the patch
// restored on it (Tools.Restore). The sandbox has the task's egress
// policy, its audit joins the task's (egressSink, told to self), and it is
// destroyed before runTestsClean returns, whatever happens.
//
// A driver.ErrNotFound of the verification sandbox comes back without its
// chain: a.failed would take it for the task's own sandbox being gone.
func (a *taskActor) runTestsClean(ctx context.Context, self *actor.Ref, round int, patch, cmd string) (*testRun, error) {
	run, err := a.testInSandbox(ctx, self, verifySandboxID(a.id, a.epoch, round), patch, cmd)
	if errors.Is(err, driver.ErrNotFound) {
		err = fmt.Errorf("the verification sandbox: %v", err)
	}
	return run, err
}

func (a *taskActor) testInSandbox(ctx context.Context, self *actor.Ref, id, patch, cmd string) (run *testRun, err error) {
	// Left by this round's run on this node before a restart (the driver
	// re-adopted it): it may hold anything; claim anew.
	if err := a.destroyLeft(a.d.log, id, "verification sandbox"); err != nil {
		return nil, fmt.Errorf("destroy the last run's verification sandbox %s: %w", id, err)
	}
	// A driver whose MaxTTL is below verifyTTL gives its default (an hour).
	sb, err := a.claimTTL(ctx, a.d.log, driver.ClaimRequest{ID: id, Template: a.spec.GetTemplate(), TTL: verifyTTL,
		Limits: taskLimits(a.spec)})
	if err != nil {
		return nil, fmt.Errorf("claim the verification sandbox %s: %w", id, err)
	}
	a.d.cfg.Metrics.claimed(sb)
	defer a.d.holdVerifying(a.id)() // after the destroy below
	defer func() {
		// The audit's last attempts, then no more reports, then the
		// sandbox goes: on every path. The attempts are on the log before
		// the task's last event, whatever ended the run: a cancel, an
		// error, the tests' end (egressSink).
		a.collectEgress(sb, "before the verification sandbox goes")
		a.d.cfg.Egress.unbind(id) // a report being delivered lands first
		if derr := sb.Destroy(); derr != nil {
			// Its TTL reaps it; a rerun of the round destroys it first.
			a.d.log.Warn("destroy the verification sandbox", "task", a.id, "sandbox", id, "err", derr)
		}
	}()
	// The task's own policy, never more network than the model had.
	policy, perr := taskPolicy(a.spec)
	if perr != nil { // as start does: the servers validate specs
		policy = netpolicy.Policy{Profile: netpolicy.ProfileNone}
	}
	if err := a.d.cfg.Egress.bind(sb, policy, a.egressSink(self, id)); err != nil {
		return nil, fmt.Errorf("set the verification sandbox's egress policy: %w", err)
	}
	ia, ok := sb.(driver.Interactive)
	if !ok {
		return nil, fmt.Errorf("the %s driver's sandboxes have no guest to run the tests in", a.d.cfg.Driver.Name())
	}
	if err := unpackInto(ctx, ia, a.ws); err != nil {
		return nil, fmt.Errorf("the verification sandbox: %w", err)
	}
	tools := &agent.Tools{SB: agentSandbox{ia}, Root: WorkRoot}
	if err := tools.InitBase(ctx); err != nil {
		return nil, fmt.Errorf("the verification sandbox: %w", err)
	}
	if err := tools.Restore(ctx, patch); err != nil {
		return nil, fmt.Errorf("apply the diff in the verification sandbox: %w", err)
	}
	start := time.Now()
	outb := driver.NewCappedOutput(1 << 20) // its tail is what is shown
	// Within the sandbox's lifetime, whatever its setup took: a sandbox
	// whose TTL ended mid-run would fail the run, and the round would run
	// again, as long again.
	timeout := testTimeout
	if exp := ia.Info().Expires; !exp.IsZero() {
		timeout = max(min(timeout, time.Until(exp)-time.Minute), time.Second)
	}
	res, err := ia.Run(ctx, guest.ExecRequest{Argv: []string{"/bin/sh", "-c", cmd}, Dir: WorkRoot, Timeout: timeout}, outb, outb)
	if err != nil {
		return nil, err
	}
	return &testRun{res: res, out: tail(string(outb.Bytes()), 8<<10), took: time.Since(start), sandbox: id, timeout: timeout}, nil
}

// holdVerifying counts a verification sandbox of task as held, until the
// returned func is called: heartbeats report the tasks that hold one
// (Verifying), and the leader counts each such task's needs again
// while placing, as the sandbox takes about what the task's own does.
func (d *Daemon) holdVerifying(task string) (release func()) {
	d.mu.Lock()
	if d.verifying == nil {
		d.verifying = map[string]int{}
	}
	d.verifying[task]++
	d.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			d.mu.Lock()
			if d.verifying[task]--; d.verifying[task] <= 0 {
				delete(d.verifying, task)
			}
			d.mu.Unlock()
		})
	}
}

// Verifying lists, sorted, the tasks whose finish step holds a
// verification sandbox on this node now (nil: none), as the hello and
// heartbeats report them.
func (d *Daemon) Verifying() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.verifying) == 0 {
		return nil
	}
	out := make([]string, 0, len(d.verifying))
	for t := range d.verifying {
		out = append(out, t)
	}
	sort.Strings(out)
	return out
}
