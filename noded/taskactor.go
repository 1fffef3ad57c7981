package noded

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"

	"github.com/warrenhq/warren/actor"
	"github.com/warrenhq/warren/agent"
	"github.com/warrenhq/warren/agent/model"
	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
	"github.com/warrenhq/warren/api/gen/warren/v1/warrenv1connect"
	"github.com/warrenhq/warren/api/textcut"
	"github.com/warrenhq/warren/client"
	"github.com/warrenhq/warren/netpolicy"
	"github.com/warrenhq/warren/noded/driver"
)

// Messages of a task actor.
type (
	startMsg struct{}
	stepMsg  struct{}
	// approvalPollMsg looks for the decision a waiting agent loop needs.
	approvalPollMsg struct {
		toolCallID string
		decided    bool // found on the log; what is left is to resume
		finish     bool // the push's approval: the finish phase goes on
	}
	// endMsg records an agent task's last event.
	endMsg struct {
		key     string
		payload map[string]any
		why     string
	}
	// awaitMsg records again that a task waits for a decision.
	awaitMsg struct {
		prefix string
		poll   approvalPollMsg
	}
	// finishMsg runs (again) the finish phase of an agent task whose
	// model has finished.
	finishMsg struct{}
	// parkMsg lets a task that waits for approval go (retried until its
	// parked event lands).
	parkMsg struct{ toolCallID string }
	// egressMsg says the sandbox's egress audit has batches queued.
	egressMsg struct{}
	// egressBatch is one queued audit batch, numbered for its append's
	// idempotency key.
	egressBatch struct {
		n uint64
		b netpolicy.AuditBatch
		// sandbox is the sandbox whose attempts b holds: the task's own
		// when it was queued (a sandbox that went away has been replaced
		// since), or a verification sandbox of the finish step (see
		// egressSink); "" is the task's current one.
		sandbox string
	}
)

// defaultScript is what a task with neither a script, a model nor a
// model_script runs: three short scripted steps, a placeholder that calls
// no model (the benchmarks' and tests' tasks).
var defaultScript = &warrenv1.Script{Steps: 3, StepMillis: 200}

// retryAfter is how long an actor waits before retrying a step whose
// append failed for a reason other than losing its lease.
const retryAfter = 500 * time.Millisecond

// taskActor runs one task's scripted steps under one lease epoch,
// write-ahead: a step's tool_call is committed before its command runs,
// its effect is recorded once under an idempotency key (task id + step)
// whoever runs it, and its tool_result is committed before the next step
// starts. It reads the task's log first and resumes after the last step
// with a result, so a requeued task continues where its last node stopped.
type taskActor struct {
	d      *Daemon
	id     string
	epoch  uint64
	resume bool
	given  *warrenv1.Task // from StartTask, used by the first start only
	ctx    context.Context
	// yield holds why the task is to be given back, once the node is
	// asked to (a drain). It is the taskRef's, not a message: a message
	// could find the mailbox full, and an actor restarted after a panic
	// is a new taskActor.
	yield *atomic.Pointer[yieldRequest]

	script  *warrenv1.Script
	next    uint32 // the next step to run, from 1
	sb      driver.Sandbox
	cancel  bool // the task has a cancel request
	started bool
	// began: this actor's start has read the task and its log. A message
	// that reaches an actor before that was sent to the one a panic
	// replaced (the mailbox outlives it), and is dropped: this one's
	// start sends its own.
	began   bool
	done    bool
	bound   bool   // the sandbox's network has the task's policy
	egressN uint64 // egress batches numbered so far
	// egressGen names this actor among those that ran the task under the
	// epoch (set with its first batch): its batches' idempotency keys
	// must not be taken for a former actor's (a restart after a panic, or
	// the node restarted within its TTL) and dropped as retries.
	egressGen string
	// egressQ is filled by the node's auditor (another goroutine);
	// egressPending holds numbered batches until their append lands.
	egressMu      sync.Mutex
	egressQ       []egressBatch // numbered when they move to egressPending
	egressPending []egressBatch
	// egressTold is set while an egressMsg is on its way: the sink sends
	// one for any number of reports, so the audit (a report a second, or
	// more often) cannot fill the mailbox while a step runs, where the
	// step's own next message would be dropped and the task would stall.
	egressTold atomic.Bool
	// lastFlushed: the flush before the task's last event (success,
	// cancellation, or giving it back) landed. A retry of that event, whose
	// first append may have landed with the task then ended or its lease
	// moved, must not flush again: a new batch would be refused and end
	// the actor as if the event had been.
	lastFlushed bool
	// the agent loop, for a task that runs one (no scripted steps)
	agentMode bool
	agentSeen uint64   // the last seq the loop has looked at (steering)
	heldMsgs  []string // user messages read during an approval wait
	waitSince time.Time
	loop      *agent.Loop
	ws        *agent.Workspace // the task's workspace on the node (git, outside the sandbox)
	finished  *agent.Outcome   // the model finished: the finish phase runs
	fin       *finishRound     // the finish phase's round so far
	created   time.Time        // the task's creation
	// waitingOn: the calls the task waited for a decision on when this
	// actor started (recorded by the one before it): not recorded again.
	waitingOn []string

	claimRefused int         // claims refused for good in a row (see permanentClaimError)
	sandboxLost  int         // sandboxes that went away under the task (see sandboxGone)
	streak       retryStreak // the failure retried last, to give up on one that never clears

	spec *warrenv1.TaskSpec
}

// Started runs at spawn and after a restart: (re)read the log.
func (a *taskActor) Started(c *actor.Context) { _ = c.Self().Send(startMsg{}) }

// Stopped destroys the sandbox.
func (a *taskActor) Stopped(*actor.Context) {
	if a.ws != nil {
		_ = os.RemoveAll(a.ws.Dir)
		a.ws = nil
	}
	if a.sb != nil {
		a.d.cfg.Egress.unbind(a.sb.ID())
		_ = a.sb.Destroy()
		a.sb = nil
	}
}

func (a *taskActor) Receive(c *actor.Context, msg any) {
	if a.done || a.ctx.Err() != nil {
		return
	}
	if !a.began {
		switch msg.(type) {
		case startMsg, egressMsg:
		default:
			c.Logger().Debug("dropped a message sent before the actor's restart", "task", a.id, "msg", fmt.Sprintf("%T", msg))
			return
		}
	}
	switch m := msg.(type) {
	case startMsg:
		a.start(c)
	case stepMsg:
		a.step(c)
	case approvalPollMsg:
		a.pollApproval(c, m)
	case parkMsg:
		a.park(c, m.toolCallID)
	case endMsg:
		a.end(c, m)
	case finishMsg:
		a.finishTask(c)
	case awaitMsg:
		a.awaitDecision(c, m.prefix, m.poll, m)
	case egressMsg:
		a.egressTold.Store(false)
		if err := a.recordEgress(); err != nil {
			a.failed(c, "record egress", err, egressMsg{})
		}
	}
}

// start loads the task and its log, claims a sandbox and records that the
// task runs here.
func (a *taskActor) start(c *actor.Context) {
	ctx := a.ctx
	t := a.given
	a.given = nil // a retry reads the task afresh (a restart has none: startTask)
	if t == nil {
		var err error
		if t, err = a.d.getTask(ctx, a.id); err != nil {
			a.failed(c, "read task", err, startMsg{})
			return
		}
	}
	switch e := t.GetLease().GetEpoch(); {
	case isTerminal(t.GetState()):
		a.finish(c, "task already ended", &a.d.stats.Finished)
		return
	case e > a.epoch:
		a.finish(c, fmt.Sprintf("lease moved on to epoch %d", e), &a.d.stats.StoppedStale)
		return
	case e < a.epoch: // the server that answered lags behind
		c.After(50*time.Millisecond, startMsg{})
		return
	}
	// A task placed for the first time has run no step: only a resumed
	// one (requeued, or running here before a restart) reads its log.
	var done uint32
	if t.GetState() != warrenv1.TaskState_TASK_STATE_PLACED || t.GetResume() {
		var err error
		if done, err = a.d.completedSteps(ctx, a.id, t.GetNextSeq()-1); err != nil {
			a.failed(c, "read log", err, startMsg{})
			return
		}
	}
	a.cancel = t.GetCancelRequested()
	a.spec = t.GetSpec()
	if ts := t.GetCreatedAt(); ts != nil {
		a.created = ts.AsTime()
	}
	a.script = t.GetSpec().GetScript()
	a.agentMode = a.script == nil && (a.spec.GetModelScript() != "" || (a.d.cfg.Models != nil && a.spec.GetModel() != ""))
	if a.script == nil && !a.agentMode && a.spec.GetModel() != "" {
		// It ran the placeholder steps and succeeded, having done
		// nothing: a task that names a model gets that model, or fails
		// saying why. Begun, so that a retry of the failure's append (an
		// endMsg) is handled, not dropped as from before a restart.
		a.began = true
		a.failTask(c, "no-model", failedReason(fmt.Sprintf("model %q: node %s has no model provider (set ANTHROPIC_API_KEY or OPENAI_API_KEY in the environment of warren node)", a.spec.GetModel(), a.d.cfg.ID)))
		return
	}
	if a.script == nil {
		a.script = defaultScript
	}
	a.next = done + 1
	a.began = true
	// A cancel, or a drain's request, ends the task here, before the
	// sandbox: a claim that keeps failing must not keep it in placed.
	if a.stopAtBoundary(c) {
		return
	}
	if a.sb == nil {
		id := fmt.Sprintf("%s-e%d", a.id, a.epoch)
		// Left by this node's last run (a driver re-adopts its sandboxes
		// after a restart; no actor here holds it: a restarted one
		// destroyed its own). Its claim would be refused for good; the
		// task resumes from its log into a fresh sandbox, as on any other
		// node.
		if err := a.destroyLeft(c.Logger(), id, "sandbox"); err != nil {
			a.failed(c, "destroy the last run's sandbox", err, startMsg{})
			return
		}
		sb, err := a.claim(c, t, id)
		if err != nil {
			if a.permanentClaimError(err, id) {
				if a.claimRefused++; a.claimRefused >= maxClaimRefusals {
					reason := failedReason("claim sandbox: " + err.Error())
					c.Logger().Warn("task cannot start; it fails", "task", a.id, "reason", reason)
					a.failTask(c, "start-failed", reason)
					return
				}
			}
			a.failed(c, "claim sandbox", err, startMsg{})
			return
		}
		a.claimRefused = 0
		a.sb = sb
		a.d.cfg.Metrics.claimed(sb)
	}
	if !a.bound {
		policy, err := taskPolicy(t.GetSpec())
		if err != nil { // the servers validate specs; deny all if one slips by
			c.Logger().Warn("task egress policy invalid; allowing nothing", "task", a.id, "err", err)
			policy = netpolicy.Policy{Profile: netpolicy.ProfileNone}
		}
		if err := a.d.cfg.Egress.bind(a.sb, policy, a.egressSink(c.Self(), a.sb.ID())); err != nil {
			a.failed(c, "set egress policy", err, startMsg{})
			return
		}
		a.bound = true
	}
	if t.GetState() == warrenv1.TaskState_TASK_STATE_PLACED {
		payload := map[string]any{"to": "running", "node": a.d.cfg.ID, "epoch": a.epoch,
			"sandbox": a.sb.ID(), "driver": a.d.cfg.Driver.Name(), "warm": a.sb.Warm()}
		if ia, ok := a.sb.(driver.Interactive); ok {
			info := ia.Info()
			payload["start"], payload["claim_ms"] = string(info.Start), info.ClaimTime.Milliseconds()
		}
		if a.next > 1 {
			payload["resumed_at_step"] = a.next
		}
		if _, err := a.append(ctx, "running", ev("state_changed", payload)); err != nil {
			a.failed(c, "record running", err, startMsg{})
			return
		}
		a.d.cfg.Metrics.recordedRunning.Add(1)
	}
	if t.GetState() == warrenv1.TaskState_TASK_STATE_WAITING_APPROVAL {
		if len(t.GetPendingApprovals()) == 0 {
			// Decided while no actor ran the task here (the node
			// restarted within its TTL: same lease, same epoch): the
			// waiting actor would have recorded that it runs again, and
			// the replay goes on from the decision. Keyed by the log's
			// end, so a later wait's resume records its own.
			if _, err := a.append(ctx, fmt.Sprintf("agent/running-resumed-%d", t.GetNextSeq()),
				ev("state_changed", map[string]any{"to": "running", "resumed": true, "node": a.d.cfg.ID})); err != nil {
				a.failed(c, "record running", err, startMsg{})
				return
			}
		} else {
			a.waitingOn = t.GetPendingApprovals() // recorded already: awaitDecision does not again
		}
	}
	// A cancel the running append reported (asked during the claim) ends
	// the task before anything else runs in the sandbox.
	if a.stopAtBoundary(c) {
		return
	}
	if a.agentMode && a.loop == nil {
		if done := a.startAgent(c, t); done {
			return
		}
	}
	a.started = true
	_ = c.Self().Send(stepMsg{})
}

// Sandbox lifetimes asked of the driver (ClaimRequest.TTL): the sandbox
// must outlive its task, or every call to it fails.
const (
	// maxSandboxTTL is the drivers' default MaxTTL: a task without a
	// wall-clock budget asks for all of it.
	maxSandboxTTL = driver.MaxTTL
	// sandboxTTLMargin is what a task with a wall-clock budget gets past
	// it: the budget stops model calls, and the finish phase (the tests,
	// up to testTimeout, then the push) runs after.
	sandboxTTLMargin = testTimeout + 10*time.Minute
)

// sandboxTTL is the TTL a task's sandbox is claimed with: an agent task's
// remaining wall-clock budget (from its creation) and the margin, at most
// maxSandboxTTL; maxSandboxTTL for any other.
func sandboxTTL(spec *warrenv1.TaskSpec, agentMode bool, created, now time.Time) time.Duration {
	wall := time.Duration(spec.GetBudgets().GetMaxWallClockSeconds()) * time.Second
	if !agentMode || wall <= 0 || created.IsZero() {
		return maxSandboxTTL
	}
	left := max(created.Add(wall).Sub(now), 0)
	return min(left+sandboxTTLMargin, maxSandboxTTL)
}

// maxClaimRefusals is how many claims in a row may be refused for good
// (permanentClaimError) before the task fails.
const maxClaimRefusals = 3

// claim claims the task's sandbox under id, with the task's TTL. A driver
// whose MaxTTL is below it refuses the TTL (driver.ErrInvalid); the claim
// is then made again with the driver's default, and a sandbox that goes
// away before the task ends is replaced (sandboxGone).
func (a *taskActor) claim(c *actor.Context, t *warrenv1.Task, id string) (driver.Sandbox, error) {
	req := driver.ClaimRequest{ID: id, Template: t.GetSpec().GetTemplate(), TTL: sandboxTTL(t.GetSpec(), a.agentMode, a.created, time.Now()),
		Limits: taskLimits(t.GetSpec())}
	return a.claimTTL(a.ctx, c.Logger(), req)
}

// claimTTL claims req's sandbox; a driver whose MaxTTL is below req.TTL
// refuses it (driver.ErrInvalid), and the claim is made again with the
// driver's default TTL, unless the refusal was of a sandbox id still taken.
func (a *taskActor) claimTTL(ctx context.Context, log *slog.Logger, req driver.ClaimRequest) (driver.Sandbox, error) {
	sb, err := a.d.cfg.Driver.Claim(ctx, req)
	if err != nil && errors.Is(err, driver.ErrInvalid) && !a.idTaken(req.ID) {
		log.Info("claim refused; claiming again with the driver's default TTL", "task", a.id, "sandbox", req.ID, "ttl", req.TTL, "err", err)
		req.TTL = 0
		sb, err = a.d.cfg.Driver.Claim(ctx, req)
	}
	return sb, err
}

// destroyLeft destroys the sandbox (what: the kind, for the log) that
// this node's last run left under id, if the driver holds one.
func (a *taskActor) destroyLeft(log *slog.Logger, id, what string) error {
	old, ok := a.held(id)
	if !ok {
		return nil
	}
	log.Info("destroying the "+what+" this node's last run left", "task", a.id, "sandbox", id)
	return old.Destroy()
}

// permanentClaimError reports whether a claim failed for a reason that
// another claim would fail for too: the template is missing
// (driver.ErrNotFound), or the request is invalid (driver.ErrInvalid) but
// for a sandbox of the same id still there (a destroy under way).
func (a *taskActor) permanentClaimError(err error, id string) bool {
	return errors.Is(err, driver.ErrNotFound) || (errors.Is(err, driver.ErrInvalid) && !a.idTaken(id))
}

// idTaken reports whether the driver has a sandbox under id.
func (a *taskActor) idTaken(id string) bool {
	_, taken := a.held(id)
	return taken
}

// held returns the driver's sandbox under id, if the driver lists its
// sandboxes and holds one.
func (a *taskActor) held(id string) (driver.Sandbox, bool) {
	l, ok := a.d.cfg.Driver.(interface {
		Get(string) (driver.Sandbox, bool)
	})
	if !ok {
		return nil, false
	}
	return l.Get(id)
}

// failTask ends the task failed, saying why, its end recorded under key.
func (a *taskActor) failTask(c *actor.Context, key, reason string) {
	a.end(c, endMsg{key: key, payload: map[string]any{"to": "failed", "reason": reason}, why: reason})
}

// takeYield returns the request to give the task back, if there is one,
// marked taken: an uncordon can no longer withdraw it.
func (a *taskActor) takeYield() *yieldRequest {
	for {
		p := a.yield.Load()
		if p == nil || p.taken {
			return p
		}
		if a.yield.CompareAndSwap(p, &yieldRequest{why: p.why, taken: true}) {
			return p
		}
	}
}

// step runs one scripted step, or ends the actor at a step boundary.
func (a *taskActor) step(c *actor.Context) {
	if a.stopAtBoundary(c) {
		return
	}
	a.runStep(c)
}

// stopAtBoundary records a cancellation, or gives the task back to a
// drain, if either was asked; it reports whether it did (or will retry).
// start calls it too, before the sandbox: a task whose claim keeps failing
// is still cancelled (or given back), not stuck in placed.
func (a *taskActor) stopAtBoundary(c *actor.Context) bool {
	ctx := a.ctx
	if a.cancel {
		at := int64(a.next)
		if a.loop != nil {
			at = a.loop.Spent().Steps
		}
		// The sandbox goes with the actor: what its egress audit holds
		// lands before the task's last event, as when it succeeds.
		if err := a.flushBeforeLast(); err != nil {
			a.failed(c, "record egress", err, stepMsg{})
			return true
		}
		if _, err := a.append(ctx, "cancelled", ev("state_changed", map[string]any{"to": "cancelled", "reason": "cancel requested", "at_step": at})); err != nil {
			a.failed(c, "record cancellation", err, stepMsg{})
			return true
		}
		a.finish(c, "cancelled", &a.d.stats.Finished)
		return true
	}
	if y := a.takeYield(); y != nil {
		if err := a.flushBeforeLast(); err != nil {
			a.failed(c, "record egress", err, stepMsg{})
			return true
		}
		if _, err := a.append(ctx, "yield", ev("state_changed", map[string]any{"to": "pending", "reason": y.why, "node": a.d.cfg.ID})); err != nil {
			a.failed(c, "give the task back", err, stepMsg{})
			return true
		}
		a.finish(c, "gave the task back: "+y.why, &a.d.stats.Yielded)
		return true
	}
	return false
}

// runStep runs one step of the task.
func (a *taskActor) runStep(c *actor.Context) {
	ctx := a.ctx
	if a.agentMode {
		a.agentStep(c)
		return
	}
	if a.next > a.script.GetSteps() {
		if err := a.flushBeforeLast(); err != nil {
			a.failed(c, "record egress", err, stepMsg{})
			return
		}
		if _, err := a.append(ctx, "done", ev("state_changed", map[string]any{"to": "succeeded", "steps": a.script.GetSteps()})); err != nil {
			a.failed(c, "record success", err, stepMsg{})
			return
		}
		a.finish(c, "succeeded", &a.d.stats.Finished)
		return
	}
	n := a.next
	callID := fmt.Sprintf("step-%d", n)
	cmd := a.script.GetCommand()
	if cmd == "" {
		cmd = "sleep " + strconv.FormatFloat(float64(a.script.GetStepMillis())/1000, 'f', -1, 64)
	}
	called, err := a.append(ctx, fmt.Sprintf("s%d/call", n), ev("tool_call", map[string]any{
		"tool_call_id": callID, "tool": "run_command", "input": map[string]any{"command": cmd}, "scripted": true}))
	if err != nil {
		a.failed(c, "record tool_call", err, stepMsg{})
		return
	}
	// A spec's own command may run for as long as it likes (a sleep of a
	// day, a hung test): it runs under a step's context, which a cancel
	// request ends, killing its process group, as an agent step's does.
	// The built-in step (a sleep of step_millis) lasts as long as a step
	// should, and watches for nothing, so that the capacity benchmark's
	// tens of thousands of tasks hold no stream each.
	ectx, end := ctx, func() {}
	if a.script.GetCommand() != "" {
		a.agentSeen = max(a.agentSeen, called.GetLastSeq())
		ectx, end = a.stepContext()
	}
	res, err := a.sb.Exec(ectx, driver.ExecRequest{Command: cmd})
	end()
	if a.cancelled(c, ectx) {
		return
	}
	if err != nil {
		a.failed(c, "exec", err, stepMsg{})
		return
	}
	// The step's external effect and its result, in one append: recorded
	// once per (task, step) in the replicated state, whichever owner and
	// epoch gets there first (a rerun gets the first record back), and
	// never an effect without its result.
	out, cut := stepOutput(res.Output)
	if want := int(a.script.GetOutputBytes()); len(out) < want {
		out += strings.Repeat(".", want-len(out))
	}
	result := map[string]any{"tool_call_id": callID, "exit_code": res.ExitCode, "output": out,
		"duration_ms": res.Duration.Milliseconds()}
	if cut > 0 {
		result["output_cut_bytes"] = cut
	}
	key := fmt.Sprintf("%s/step-%d", a.id, n)
	if _, err := a.appendReq(ctx, &warrenv1.AppendEventsRequest{TaskId: a.id, LeaseEpoch: a.epoch,
		RequestId: "effect/" + callID, Events: []*warrenv1.EventInput{
			ev("effect", map[string]any{"idempotency_key": key, "tool_call_id": callID, "node": a.d.cfg.ID, "epoch": a.epoch}),
			ev("tool_result", result),
		}}); err != nil {
		a.failed(c, "record effect and tool_result", err, stepMsg{})
		return
	}
	a.next++
	a.streak = retryStreak{} // a step went through: what failed before cleared
	_ = c.Self().Send(stepMsg{})
}

// recordEgress appends the queued egress audit batches as "egress"
// events, in order; a batch whose append fails stays for the retry.
func (a *taskActor) recordEgress() error {
	// Also without a sandbox (it went away, and the task ends before the
	// next claim): every queued batch names its own.
	a.egressMu.Lock()
	q := a.egressQ
	a.egressQ = nil
	a.egressMu.Unlock()
	if a.egressGen == "" && len(q) > 0 {
		a.egressGen = fmt.Sprintf("%s.%d", a.d.incarnation, actorGen.Add(1))
	}
	for _, b := range q {
		a.egressN++
		b.n = a.egressN
		a.egressPending = append(a.egressPending, b)
	}
	for len(a.egressPending) > 0 {
		if err := a.appendEgress(a.egressPending[0]); err != nil {
			return err
		}
		a.egressPending = a.egressPending[1:]
	}
	return nil
}

// flushBeforeLast is flushEgress before the task's last event, once.
func (a *taskActor) flushBeforeLast() error {
	if a.lastFlushed {
		return nil
	}
	if err := a.flushEgress(); err != nil {
		return err
	}
	a.lastFlushed = true
	return nil
}

// flushEgress records everything the sandbox's audit has not reported
// yet, so it lands before the task's last event: it reads the audit sets
// once more (every report read before has reached the queue when Collect
// returns), stops the auditor reporting for the sandbox (so a later report
// cannot come after the task's last event), and appends the queue. A
// report read between the two still reaches the queue: unbind waits for it.
func (a *taskActor) flushEgress() error {
	if a.sb == nil { // what a sandbox that went away left queued
		return a.recordEgress()
	}
	a.collectEgress(a.sb, "before the last event")
	a.d.cfg.Egress.unbind(a.sb.ID())
	return a.recordEgress()
}

// egressSink is the Egress sink of a sandbox of the task (the task's own,
// or a verification sandbox): its batches, each naming the sandbox (not
// the one the actor holds when they are appended: sandboxGone), join the
// queue recordEgress appends, and self is told. Called on the auditor's
// goroutine, it does not block.
func (a *taskActor) egressSink(self *actor.Ref, sandbox string) func(netpolicy.AuditBatch) {
	return func(b netpolicy.AuditBatch) {
		a.egressMu.Lock()
		a.egressQ = append(a.egressQ, egressBatch{b: b, sandbox: sandbox})
		a.egressMu.Unlock()
		// One message at a time: Receive clears egressTold before it
		// takes the queue, so a batch queued after that take sends another.
		if a.egressTold.CompareAndSwap(false, true) {
			if err := self.Send(egressMsg{}); err != nil {
				a.egressTold.Store(false) // the queue stays for the next report or flush
			}
		}
	}
}

// collectEgress queues what sb's audit has not reported yet (when, for the
// log): every report read before has reached the queue when it returns.
func (a *taskActor) collectEgress(sb driver.Sandbox, when string) {
	n, ok := netOf(sb)
	if !ok {
		return
	}
	bs, err := n.Collect()
	if err != nil {
		a.d.log.Debug("egress: collect "+when, "task", a.id, "sandbox", sb.ID(), "err", err)
	}
	if len(bs) == 0 {
		return
	}
	a.egressMu.Lock()
	for _, b := range bs {
		a.egressQ = append(a.egressQ, egressBatch{b: b, sandbox: sb.ID()})
	}
	a.egressMu.Unlock()
}

func (a *taskActor) appendEgress(m egressBatch) error {
	sb := m.sandbox
	if sb == "" && a.sb != nil { // (every batch is stamped when queued)
		sb = a.sb.ID()
	}
	payload := map[string]any{"sandbox": sb, "events": m.b.Events}
	if m.b.Omitted > 0 {
		payload["omitted"], payload["omitted_count"] = m.b.Omitted, m.b.OmittedCount
	}
	_, err := a.append(a.ctx, fmt.Sprintf("egress-%s-%d", a.egressGen, m.n), ev("egress", payload))
	return err
}

// actorGen numbers the task actors of the process, for egressGen: with
// the daemon's incarnation, it tells the actors of one task and epoch
// apart across a node's restarts and an actor's.
var actorGen atomic.Uint64

// append appends one event under the actor's epoch with an idempotency key
// scoped to the epoch, so a retry by this owner lands once.
func (a *taskActor) append(ctx context.Context, key string, e *warrenv1.EventInput) (*warrenv1.AppendEventsResponse, error) {
	return a.appendReq(ctx, leaseAppend(a.id, a.epoch, key, e))
}

// leaseAppend is the append of one event under a task's lease, its
// request id key scoped to the epoch (so a retry by this holder lands
// once, and the next holder's own appends are not taken for it).
func leaseAppend(task string, epoch uint64, key string, e *warrenv1.EventInput) *warrenv1.AppendEventsRequest {
	return &warrenv1.AppendEventsRequest{TaskId: task, LeaseEpoch: epoch,
		RequestId: fmt.Sprintf("e%d/%s", epoch, key), Events: []*warrenv1.EventInput{e}}
}

// failedReason is a reason for a failed task, cut to 1000 bytes.
func failedReason(s string) string { return textcut.Ellipsis(s, 1000) }

// appendReq appends and notes a cancel request the log reports.
func (a *taskActor) appendReq(ctx context.Context, req *warrenv1.AppendEventsRequest) (*warrenv1.AppendEventsResponse, error) {
	start := time.Now()
	res, err := a.d.app.Append(ctx, req)
	a.d.cfg.Metrics.observe(time.Since(start), len(req.GetEvents()), err)
	if res.GetCancelRequested() {
		a.cancel = true
	}
	return res, err
}

// failed handles an error: a stale lease or an ended task stops the actor
// (another owner has the task, or it is over); anything else is retried.
func (a *taskActor) failed(c *actor.Context, what string, err error, retry any) {
	switch {
	case a.ctx.Err() != nil:
		return // stopped
	case client.IsStaleEpoch(err):
		c.Logger().Info("lease lost: stopping", "task", a.id, "epoch", a.epoch, "during", what)
		a.finish(c, "stale lease epoch", &a.d.stats.StoppedStale)
	case connect.CodeOf(err) == connect.CodeFailedPrecondition, connect.CodeOf(err) == connect.CodeNotFound:
		c.Logger().Info("task refused the write: stopping", "task", a.id, "during", what, "err", err)
		a.finish(c, err.Error(), &a.d.stats.Stopped)
	case connect.CodeOf(err) == connect.CodeInvalidArgument:
		// The same write would be refused again: end the task, saying why.
		reason := failedReason(fmt.Sprintf("%s: an event was refused: %s", what, err.Error()))
		c.Logger().Warn("an event was refused; the task fails", "task", a.id, "during", what, "err", err)
		_, _ = a.append(a.ctx, "refused", ev("state_changed", map[string]any{"to": "failed", "reason": reason}))
		a.finish(c, reason, &a.d.stats.Finished)
	case errors.Is(err, driver.ErrNotFound) && a.sb != nil:
		// The sandbox is gone (its TTL ended, something destroyed it):
		// every call to it would fail the same way.
		a.sandboxGone(c, what, err)
	default:
		if n, span := a.streak.note(what, err, time.Now()); n > 1 && span >= giveUpAfter {
			reason := failedReason(fmt.Sprintf("%s kept failing for %s (%d tries): %v", what, span.Round(time.Second), n, err))
			c.Logger().Warn("a failure does not clear; the task fails", "task", a.id, "during", what, "err", err, "tries", n)
			// A new streak for the end's own appends: one that fails as
			// this did is retried, not given up on again from within.
			a.streak = retryStreak{}
			a.failTask(c, "gave-up", reason)
			return
		}
		// Cut: the error may quote what the sandbox printed, and this
		// logs it at every retry.
		c.Logger().Warn("step failed; retrying", "task", a.id, "during", what, "err", textcut.Ellipsis(err.Error(), maxLoggedErr))
		c.After(retryAfter, retry)
	}
}

// giveUpAfter is how long the same failure (same step, same error) may be
// retried before the task fails: a sandbox or a driver that fails every
// call would have the actor retry for good, the task leased to a live node
// with nothing running it. Failures of the servers (a connect error) are
// not bounded here: those leave the lease to run out.
const giveUpAfter = 10 * time.Minute

// retryStreak follows the failure an actor retries: the same step failing
// with the same error (streakKey), each retry within streakGap of the
// last.
type retryStreak struct {
	key         string
	n           int
	since, last time.Time
}

// streakGap: a failure later than this after the last is a new streak.
const streakGap = time.Minute

// note counts a failure at now; it returns how many times in a row this
// failure has come, and since when (0 for a failure it does not follow:
// a server's error, a model provider's retryable one, a context's end;
// those are waited out, however long an outage lasts).
func (s *retryStreak) note(what string, err error, now time.Time) (n int, span time.Duration) {
	var ce *connect.Error
	var he *model.HTTPError
	if errors.As(err, &ce) || errors.As(err, &he) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		*s = retryStreak{}
		return 0, 0
	}
	key := streakKey(what, err)
	if key != s.key || now.Sub(s.last) > streakGap {
		*s = retryStreak{key: key, since: now}
	}
	s.n++
	s.last = now
	return s.n, now.Sub(s.since)
}

// streakKey is what a failure is known by in a streak: its step alone,
// whatever the error says (a step that goes through ends the streak).
// The error's text is often the sandbox's to choose: a guest agent's
// answer, or the output of a command the sandbox's code replaced (git
// printing a counter at each checkpoint); keyed on it, such a failure
// started a new streak at every retry and was retried, and logged, for
// good.
func streakKey(what string, _ error) string { return what }

// maxLoggedErr bounds an error's text in a retry's log line.
const maxLoggedErr = 4 << 10

// maxSandboxLosses is how many times a task's sandbox may go away under
// it on one node before the task fails.
const maxSandboxLosses = 3

// sandboxGone replaces a sandbox that is gone: the actor lets it go and
// starts over, claiming a new one and resuming from the task's log (the
// scripted steps with a result; the agent's conversation, replayed, and
// its workspace's last checkpoint), as a restarted node does. Past
// maxSandboxLosses, the task fails: "sandbox gone: ...".
func (a *taskActor) sandboxGone(c *actor.Context, what string, err error) {
	if a.sandboxLost++; a.sandboxLost > maxSandboxLosses {
		reason := failedReason(fmt.Sprintf("sandbox gone: %s: %v (lost %d times)", what, err, a.sandboxLost))
		c.Logger().Warn("the task's sandbox keeps going away; the task fails", "task", a.id, "err", err)
		a.failTask(c, "sandbox-gone", reason)
		return
	}
	c.Logger().Warn("the task's sandbox is gone; claiming a new one", "task", a.id, "sandbox", a.sb.ID(), "during", what, "err", err)
	if ferr := a.flushEgress(); ferr != nil { // what it holds stays queued for the next sandbox's
		c.Logger().Debug("egress: flush before the sandbox goes", "task", a.id, "err", ferr)
	}
	a.Stopped(c)
	a.bound, a.started, a.loop, a.finished, a.fin = false, false, nil, nil, nil
	a.heldMsgs, a.waitSince, a.waitingOn = nil, time.Time{}, nil
	// Messages sent before now (retries of what failed) are dropped until
	// the start has run again, as after a restart.
	a.began = false
	_ = c.Self().Send(startMsg{})
}

func (a *taskActor) finish(c *actor.Context, why string, counter *int) {
	a.done = true
	c.Logger().Debug("task actor ends", "task", a.id, "epoch", a.epoch, "why", why)
	a.d.actorDone(a.id, a.epoch, counter)
	c.Stop()
}

// maxStepOutputJSON bounds a scripted step's output in its tool_result,
// as JSON: an event's payload may hold 64 KiB, and a step that printed
// more failed its task (its result was refused).
const maxStepOutputJSON = 48 << 10

// stepOutput is a scripted step's output for its tool_result: valid UTF-8,
// and, if its JSON would pass maxStepOutputJSON, its tail only; cut is how
// many bytes of the output were left out (0: none).
func stepOutput(raw []byte) (out string, cut int) {
	s := strings.ToValidUTF8(string(raw), "\uFFFD")
	fits := func(t string) bool { b, _ := json.Marshal(t); return len(b) <= maxStepOutputJSON }
	if fits(s) {
		return s, 0
	}
	keep := maxStepOutputJSON
	for {
		if t := textcut.Tail(s, keep); fits(t) {
			return t, len(s) - len(t)
		}
		keep /= 2
	}
}

func ev(kind string, payload any) *warrenv1.EventInput {
	b, err := json.Marshal(payload)
	if err != nil {
		panic(err) // payloads are built here from plain values
	}
	return &warrenv1.EventInput{Kind: kind, Payload: b}
}

func isTerminal(s warrenv1.TaskState) bool {
	return s == warrenv1.TaskState_TASK_STATE_SUCCEEDED || s == warrenv1.TaskState_TASK_STATE_FAILED ||
		s == warrenv1.TaskState_TASK_STATE_CANCELLED
}

// lastResultStep is the step of the last tool_result among events, or 0.
func lastResultStep(events []*warrenv1.Event) uint32 {
	var last uint32
	for _, e := range events {
		if e.GetKind() != "tool_result" {
			continue
		}
		var p struct {
			ID string `json:"tool_call_id"`
		}
		if json.Unmarshal(e.GetPayload(), &p) != nil || !strings.HasPrefix(p.ID, "step-") {
			continue
		}
		if n, err := strconv.ParseUint(strings.TrimPrefix(p.ID, "step-"), 10, 32); err == nil {
			last = max(last, uint32(n))
		}
	}
	return last
}

// completedSteps returns the last step with a result in the log of events
// 1..upTo. Steps run in order and a step's result is recorded only after
// every earlier step's, so steps 1..n are all complete when n has a
// result: it reads the log's tail, widening it until it holds a result or
// reaches the start, instead of reading the whole log on every resume.
func (d *Daemon) completedSteps(ctx context.Context, id string, upTo uint64) (uint32, error) {
	for k := uint64(8); ; k *= 4 {
		from := uint64(0)
		if upTo > k {
			from = upTo - k
		}
		events, err := d.readLog(ctx, id, from, upTo)
		if err != nil {
			return 0, err
		}
		if n := lastResultStep(events); n > 0 || from == 0 {
			return n, nil
		}
	}
}

// getTask reads a task through client.Read, which moves off a server that
// is gone.
func (d *Daemon) getTask(ctx context.Context, id string) (*warrenv1.Task, error) {
	var resp *connect.Response[warrenv1.GetTaskResponse]
	err := d.cl.Read(ctx, func(ctx context.Context, tc warrenv1connect.TaskServiceClient) (err error) {
		resp, err = tc.GetTask(ctx, connect.NewRequest(&warrenv1.GetTaskRequest{Id: id}))
		return err
	})
	if err != nil {
		return nil, err
	}
	return resp.Msg.GetTask(), nil
}

// listEvents reads a page of at most limit of a task's events after seq
// after, as getTask reads a task.
func (d *Daemon) listEvents(ctx context.Context, id string, after uint64, limit uint32) ([]*warrenv1.Event, error) {
	var resp *connect.Response[warrenv1.ListEventsResponse]
	err := d.cl.Read(ctx, func(ctx context.Context, tc warrenv1connect.TaskServiceClient) (err error) {
		resp, err = tc.ListEvents(ctx, connect.NewRequest(&warrenv1.ListEventsRequest{TaskId: id, AfterSeq: after, Limit: limit}))
		return err
	})
	if err != nil {
		return nil, err
	}
	return resp.Msg.GetEvents(), nil
}

// readLog reads a task's events after+1..upTo with ListEvents pages. The
// server that answers may not have applied up to upTo yet; it then asks
// again shortly.
func (d *Daemon) readLog(ctx context.Context, id string, after, upTo uint64) ([]*warrenv1.Event, error) {
	if upTo <= after {
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var out []*warrenv1.Event
	for after < upTo {
		evs, err := d.listEvents(ctx, id, after, uint32(min(upTo-after, 1000))) // 1000: the server's page limit
		if err != nil {
			return nil, err
		}
		if len(evs) == 0 {
			select {
			case <-ctx.Done():
				return nil, fmt.Errorf("the log ends at seq %d, before %d: %w", after, upTo, ctx.Err())
			case <-time.After(20 * time.Millisecond):
			}
			continue
		}
		for _, e := range evs {
			if e.GetSeq() > upTo {
				return out, nil
			}
			out = append(out, e)
			after = e.GetSeq()
		}
	}
	return out, nil
}
