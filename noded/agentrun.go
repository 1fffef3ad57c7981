package noded

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/warrenhq/warren/actor"
	"github.com/warrenhq/warren/agent"
	"github.com/warrenhq/warren/agent/model"
	"github.com/warrenhq/warren/api"
	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
	"github.com/warrenhq/warren/guest"
	"github.com/warrenhq/warren/noded/driver"
)

// Models is the node's model gateway settings: credentials (from the
// node's config or environment only; never sent to a sandbox, an event or
// a log), prices and rate limits.
type Models struct {
	AnthropicKey, AnthropicURL string
	OpenAIKey, OpenAIURL       string
	// Prices by model name; a model without one costs 0 (and a cost budget
	// cannot stop it).
	Prices map[string]model.Price
	// TPM is each provider's tokens-per-minute budget, shared by all the
	// node's tasks; 0 means none.
	TPM map[string]int64
	// ContextWindows are models' context windows in tokens, by name; a
	// model without one gets DefaultContextWindow.
	ContextWindows map[string]int64
	// BlobDir keeps full tool outputs ("" : DataDir/blobs).
	BlobDir string

	mu       sync.Mutex
	limiters map[string]*model.Limiter
}

// DefaultContextWindow is a model's context window when the node's
// --model-context does not give it: Claude's 200,000 tokens, and 128,000
// for other models (an OpenAI-compatible server's may be smaller still,
// which --model-context says).
func DefaultContextWindow(model string) int64 {
	if strings.HasPrefix(model, "claude") {
		return 200_000
	}
	return 128_000
}

// contextWindow is model's context window on this node.
func (m *Models) contextWindow(model string) int64 {
	if n := m.ContextWindows[model]; n > 0 {
		return n
	}
	return DefaultContextWindow(model)
}

func (m *Models) limiter(provider string) *model.Limiter {
	m.mu.Lock()
	defer m.mu.Unlock()
	tpm := m.TPM[provider]
	if tpm <= 0 {
		return nil
	}
	if m.limiters == nil {
		m.limiters = map[string]*model.Limiter{}
	}
	if m.limiters[provider] == nil {
		m.limiters[provider] = model.NewLimiter(tpm, nil)
	}
	return m.limiters[provider]
}

// provider picks a task's provider: its own script (scripted), Claude
// models (anthropic), anything else through an OpenAI-compatible server.
func (m *Models) provider(spec *warrenv1.TaskSpec) (model.Provider, string, error) {
	if s := spec.GetModelScript(); s != "" {
		p, err := model.ParseScripted("spec.model_script", []byte(s))
		return p, "scripted", err
	}
	name := spec.GetModel()
	switch {
	case name == "" || name == "scripted":
		return nil, "", errors.New("no model: the task names none and has no model_script")
	case strings.HasPrefix(name, "claude"):
		if m.AnthropicKey == "" {
			return nil, "", fmt.Errorf("model %q: this node has no Anthropic credentials (ANTHROPIC_API_KEY)", name)
		}
		return &model.Anthropic{BaseURL: m.AnthropicURL, APIKey: m.AnthropicKey}, name, nil
	default:
		if m.OpenAIURL == "" && m.OpenAIKey == "" {
			return nil, "", fmt.Errorf("model %q: this node has no OpenAI-compatible server (OPENAI_BASE_URL or OPENAI_API_KEY)", name)
		}
		return &model.OpenAI{BaseURL: m.OpenAIURL, APIKey: m.OpenAIKey}, name, nil
	}
}

// WorkRoot is where a task's repository is in its sandbox.
const WorkRoot = "/work/repo"

// agentSandbox is a driver sandbox as the agent's tools see it.
type agentSandbox struct{ ia driver.Interactive }

// maxToolOutput bounds what the node keeps of each of a tool command's
// streams (the model sees a view of its head and tail; the blob store gets
// what is kept): a command may print for its whole timeout.
const maxToolOutput = 8 << 20

// refused marks what the guest agent answered with an error (a call it
// refused: the model's input was at fault) as agent.ErrRefused, so the
// model sees it instead of the task retrying the call until it gives up.
func refused(err error) error {
	var re *guest.RemoteError
	if errors.As(err, &re) {
		return agent.Refused(err)
	}
	return err
}

func (s agentSandbox) Exec(ctx context.Context, argv []string, dir string, timeout time.Duration) (agent.ExecResult, error) {
	// The client would refuse these too (a NUL byte, a command over
	// the limit), but not as the guest's answer.
	if err := guest.CheckExec(argv, nil); err != nil {
		return agent.ExecResult{}, agent.Refused(err)
	}
	out, errb := driver.NewCappedOutput(maxToolOutput), driver.NewCappedOutput(maxToolOutput)
	res, err := s.ia.Run(ctx, guest.ExecRequest{Argv: argv, Dir: dir, Timeout: timeout}, out, errb)
	if err != nil {
		return agent.ExecResult{}, refused(err)
	}
	return agent.ExecResult{Stdout: out.Bytes(), Stderr: errb.Bytes(), ExitCode: res.ExitCode, TimedOut: res.TimedOut}, nil
}

func (s agentSandbox) ReadFile(ctx context.Context, path string, limit int64) ([]byte, error) {
	var b bytes.Buffer
	if _, err := s.ia.ReadFile(ctx, path, limit, &b); err != nil {
		return nil, refused(err) // the guest's answer (a missing file) is the model's
	}
	return b.Bytes(), nil
}

// The node's own commands in a sandbox (a write's mkdir, the checkout's
// unpack) are bounded like the model's: the sandbox's code can replace
// mkdir or tar, and the guest agent itself is not trusted, so what they
// print is capped (it used to be kept whole, and endless stderr grew the
// node's memory until it was killed) and they get a timeout.
const (
	maxHelperStderr = 4 << 10
	mkdirTimeout    = time.Minute
	unpackTimeout   = 10 * time.Minute
)

func (s agentSandbox) WriteFile(ctx context.Context, path string, data []byte) error {
	errb := driver.NewCappedOutput(maxHelperStderr)
	res, err := s.ia.Run(ctx, guest.ExecRequest{Argv: []string{"mkdir", "-p", filepath.Dir(path)}, Timeout: mkdirTimeout}, nil, errb)
	if err != nil {
		return refused(err)
	}
	if res.TimedOut {
		return agent.Refused(fmt.Errorf("mkdir -p %s: did not end within %v", filepath.Dir(path), mkdirTimeout))
	}
	if res.ExitCode != 0 { // a parent is a file, say
		return agent.Refused(fmt.Errorf("mkdir -p %s: %s", filepath.Dir(path), strings.TrimSpace(string(errb.Bytes()))))
	}
	_, err = s.ia.WriteFile(ctx, path, nil, bytes.NewReader(data)) // 0644
	return refused(err)
}

// actorRecorder writes the loop's events through the task actor, fenced
// by its lease epoch.
type actorRecorder struct{ a *taskActor }

func (r actorRecorder) Record(ctx context.Context, key, kind string, payload any) error {
	b, err := api.MarshalPlain(payload)
	if err != nil {
		return err
	}
	// A payload over the log's limit (a model's turn that writes a large
	// file, and that call's tool_call) goes as payload_part events and the
	// event, in one append: all of it lands, or none.
	evs, err := api.SplitPayload(kind, b)
	if err != nil {
		return err
	}
	req := leaseAppend(r.a.id, r.a.epoch, "agent/"+key, evs[0])
	req.Events = evs
	if _, err := r.a.appendReq(ctx, req); err != nil {
		return err
	}
	if f := r.a.d.cfg.AfterRecord; f != nil {
		f("agent/" + key)
	}
	return nil
}

// checkoutInto makes the task's workspace on the node (git runs here,
// outside the sandbox: the clone cache, the pinned commit, HEAD verified)
// and copies its tree into the sandbox at WorkRoot. pinned is the commit a
// resumed task checked out first ("" the first time).
func (a *taskActor) checkoutInto(ctx context.Context, ia driver.Interactive, pinned string) (*agent.Workspace, error) {
	dir := filepath.Join(workRoot(a.d.cfg.DataDir), fmt.Sprintf("%s-e%d", a.id, a.epoch))
	ws, err := a.d.git.Checkout(ctx, a.spec.GetRepo(), a.spec.GetBase(), pinned, dir)
	if err == nil {
		err = unpackInto(ctx, ia, ws)
	}
	if err != nil {
		// Not a.ws yet, so Stopped would not remove it: a failed start
		// (a tree too large for the sandbox's disk, the actor stopped
		// meanwhile) left a whole checkout on the node.
		_ = os.RemoveAll(dir)
		return nil, err
	}
	return ws, nil
}

// workRoot holds the node's task workspaces, one per task and lease epoch.
func workRoot(dataDir string) string { return filepath.Join(dataDir, "work") }

// workspaceResetNote tells the model of a task resumed without its changes.
const workspaceResetNote = "Note from the node: this task was resumed in a new sandbox, and the last checkpoint of your workspace was too large to record " +
	"(over 64 MiB), so the workspace is back at the base commit and your changes to the files are gone. Make them again, " +
	"and leave large or generated files out of the repository."

// unpackInto copies the workspace's tree at its pinned commit (Tar: what
// the commit holds, not the work tree) into the sandbox at WorkRoot, in
// place of whatever was there (a start tried again in the same sandbox
// finds the last try's tree, and the model's changes, there).
func unpackInto(ctx context.Context, ia driver.Interactive, ws *agent.Workspace) error {
	tar, err := ws.Tar(ctx)
	if err != nil {
		return err
	}
	return unpackTar(ctx, ia, tar)
}

// unpackTar is unpackInto's part in the sandbox.
func unpackTar(ctx context.Context, ia driver.Interactive, tar []byte) error {
	errb := driver.NewCappedOutput(maxHelperStderr)
	res, err := ia.Run(ctx, guest.ExecRequest{Argv: []string{"/bin/sh", "-c", "rm -rf " + WorkRoot + " && mkdir -p " + WorkRoot + " && tar -x -C " + WorkRoot},
		Stdin: bytes.NewReader(tar), Timeout: unpackTimeout}, nil, errb)
	if err != nil {
		return err
	}
	if res.TimedOut {
		return fmt.Errorf("unpack in the sandbox: did not end within %v", unpackTimeout)
	}
	if res.ExitCode != 0 {
		return fmt.Errorf("unpack in the sandbox: exit %d: %s", res.ExitCode, strings.TrimSpace(string(errb.Bytes())))
	}
	return nil
}

// newLoop makes the agent loop of a task whose sandbox is claimed.
func (a *taskActor) newLoop(t *warrenv1.Task) (*agent.Loop, error) {
	ia, ok := a.sb.(driver.Interactive)
	if !ok {
		return nil, fmt.Errorf("the %s driver's sandboxes have no guest to run tools in", a.d.cfg.Driver.Name())
	}
	m := a.d.cfg.Models
	if m == nil {
		m = &Models{}
	}
	spec := t.GetSpec()
	p, name, err := m.provider(spec)
	if err != nil {
		return nil, err
	}
	price := m.Prices[name]
	var rules []agent.Rule
	for _, r := range spec.GetPolicy() {
		rules = append(rules, agent.Rule{Tool: r.GetTool(), Path: r.GetPath(), Command: r.GetCommand(), Tier: agent.Tier(r.GetTier()), Reason: r.GetReason()})
	}
	pol, err := agent.NewPolicy(append(rules, agent.DefaultPolicy()...))
	if err != nil {
		return nil, fmt.Errorf("spec.policy: %w", err)
	}
	b := spec.GetBudgets()
	cfg := agent.Config{Model: name, Price: price, Policy: pol, Blobs: agent.DirBlobs{Dir: blobDir(a.d.cfg)}, Clock: actor.RealClock(), Checkpoints: true,

		Budgets: agent.Budgets{MaxSteps: b.GetMaxSteps(), MaxTokens: b.GetMaxTokens(), MaxCostMicroUSD: b.GetMaxCostMicroUsd(),
			MaxWallClock: time.Duration(b.GetMaxWallClockSeconds()) * time.Second}}
	if ts := t.GetCreatedAt(); ts != nil {
		cfg.Started = ts.AsTime() // the budget runs from the task's creation, across resumes
	}
	cfg.ContextWindow = m.contextWindow(name)
	g := &model.Gateway{Provider: p, Price: price, Limiter: m.limiter(p.Name())}
	tools := &agent.Tools{SB: agentSandbox{ia}, Root: WorkRoot}
	return agent.NewLoop(cfg, g, tools, actorRecorder{a}), nil
}

// startAgent checks the repository out into the sandbox and sets up the
// loop: from the log when the task has run before (replaying, with the
// last workspace checkpoint restored), else fresh. It reports whether the
// actor is done (the task failed to start).
func (a *taskActor) startAgent(c *actor.Context, t *warrenv1.Task) (done bool) {
	ctx := a.ctx
	fail := func(why string, err error) bool {
		if a.cancelRequested() {
			// Cancelled meanwhile (a checkout of a repository that cannot
			// be cloned fails after it): the task ends cancelled.
			a.loop = nil
			return a.stopAtBoundary(c)
		}
		reason := fmt.Sprintf("%s: %v", why, err)
		c.Logger().Warn("agent task cannot start", "task", a.id, "err", reason)
		if _, aerr := a.append(ctx, "agent/failed-start", ev("state_changed", map[string]any{"to": "failed", "reason": reason})); aerr != nil {
			a.failed(c, "record the failed start", aerr, startMsg{})
			return true
		}
		a.finish(c, reason, &a.d.stats.Finished)
		return true
	}
	l, err := a.newLoop(t)
	if err != nil {
		return fail("agent", err)
	}
	ia := a.sb.(driver.Interactive)
	evs, err := a.agentLog(ctx, t.GetNextSeq()-1)
	if err != nil {
		a.failed(c, "read log", err, startMsg{})
		return true
	}
	pinned := ""
	for _, e := range evs {
		var p struct{ Commit string }
		if e.Kind == "checkout" && json.Unmarshal(e.Payload, &p) == nil && p.Commit != "" {
			pinned = p.Commit
		}
	}
	ws, err := a.checkoutInto(ctx, ia, pinned)
	if err != nil {
		return fail("checkout", err)
	}
	a.ws = ws
	commit := ws.Commit
	if err := l.Tools().InitBase(ctx); err != nil {
		return fail("checkout", err)
	}
	if pinned == "" {
		if _, err := a.append(ctx, "agent/checkout", ev("checkout", map[string]any{"repo": a.spec.GetRepo(), "base": a.spec.GetBase(), "commit": commit})); err != nil {
			a.failed(c, "record the checkout", err, startMsg{})
			return true
		}
	}
	a.agentSeen = t.GetNextSeq() - 1 // what Replay (or Start) covers
	resumed := slices.ContainsFunc(evs, func(e agent.Event) bool { return e.Kind == "model_call" })
	if resumed {
		if _, err := l.Replay(evs); err != nil {
			return fail("replay", err)
		}
		if patch, ok := l.LastCheckpoint(); ok {
			if err := l.Tools().Restore(ctx, patch); err != nil {
				return fail("restore the workspace checkpoint", err)
			}
		} else if !l.Resumable() {
			// The last checkpoint's patch was too large for the log, so
			// the workspace is the base again: the model is told, rather
			// than going on as if its changes were there.
			c.Logger().Warn("agent task resumed without its changes: its last workspace checkpoint was too large to record", "task", a.id)
			if _, err := a.append(ctx, fmt.Sprintf("agent/workspace-reset-%d", t.GetNextSeq()), ev("message", map[string]any{"from": "node", "text": workspaceResetNote})); err != nil {
				a.failed(c, "record the workspace's reset", err, startMsg{})
				return true
			}
			// The next step's steer gives it to the model, in the log's
			// order with any user message that came after the replay's
			// mark, as a replay of this log will.
		}
		c.Logger().Info("agent task resumed from its log", "task", a.id, "steps", l.Spent().Steps, "commit", commit)
		a.loop = l
		sctx, end := a.stepContext()
		out, err := l.FinishReplayedTurn(sctx)
		end()
		if a.cancelled(c, sctx) {
			return true
		}
		if err != nil {
			a.failed(c, "finish the replayed turn", err, startMsg{})
			a.loop = nil
			return true
		}
		if out != nil {
			a.agentOutcome(c, out)
			return true
		}
		return false
	}
	if err := l.Start(ctx, agent.Task{IssueTitle: a.spec.GetIssueTitle(), IssueBody: a.spec.GetIssueBody(), TestCommand: a.spec.GetTestCommand()}); err != nil {
		a.failed(c, "record the task's context", err, startMsg{})
		return true
	}
	// The user's messages sent before the task started are on the log,
	// behind the mark: the model sees them after its context, where a
	// replay puts them.
	for _, e := range evs {
		if text, ok := userMessage(&warrenv1.Event{Kind: e.Kind, Payload: e.Payload}); ok {
			l.Steer(text)
		}
	}
	a.loop = l
	return false
}

// cancelRequested reports whether the task has a cancel request: one the
// actor has seen, or, asked again, one on the task.
func (a *taskActor) cancelRequested() bool {
	if !a.cancel {
		t, err := a.d.getTask(a.ctx, a.id)
		if err == nil && t.GetCancelRequested() {
			a.cancel = true
		}
	}
	return a.cancel
}

// steer hands the loop the user messages that reached the task's log since
// it last looked; the model sees them at this step. (On a resume, Replay
// finds them in the log, in the same place.)
func (a *taskActor) steer() error {
	evs, err := a.newEvents()
	if err != nil {
		return err
	}
	for _, e := range evs {
		if text, ok := userMessage(e); ok {
			a.heldMsgs = append(a.heldMsgs, text)
		}
	}
	for _, text := range a.heldMsgs { // with those read while waiting for an approval
		a.loop.Steer(text)
	}
	a.heldMsgs = nil
	return nil
}

// userMessage is the text of a user's message event, or of a note the
// node gave the model as one (from "node"; Replay treats it the same).
func userMessage(e *warrenv1.Event) (string, bool) {
	var p struct{ From, Text string }
	if e.GetKind() != "message" || json.Unmarshal(e.GetPayload(), &p) != nil || p.From != "user" && p.From != "node" || p.Text == "" {
		return "", false
	}
	return p.Text, true
}

// newEvents returns a page of the task's events past the last one the loop
// has looked at, and moves that mark.
func (a *taskActor) newEvents() ([]*warrenv1.Event, error) {
	evs, err := a.d.listEvents(a.ctx, a.id, a.agentSeen, 1000)
	if err != nil {
		return nil, err
	}
	for _, e := range evs {
		a.agentSeen = max(a.agentSeen, e.GetSeq())
		if e.GetKind() == "cancel_requested" {
			// Past the mark now, so no step's watch (stepContext) will
			// see it: note it here.
			a.cancel = true
		}
	}
	// A page that ends among an event's payload_part events leaves the
	// mark before them: agentLog reads up to the mark, and the event they
	// belong to (past the page) must come with them. (An event's parts and
	// itself fit in one page: api.SplitPayload bounds them so, and the
	// mark moves on.)
	for i := len(evs) - 1; i >= 0 && evs[i].GetKind() == api.KindPayloadPart; i-- {
		a.agentSeen = evs[i].GetSeq() - 1
	}
	return evs, nil
}

// agentStep runs one step of the loop.
func (a *taskActor) agentStep(c *actor.Context) {
	if err := a.steer(); err != nil {
		a.failed(c, "read steering messages", err, stepMsg{})
		return
	}
	if a.cancel { // read with the messages: record it before another step
		_ = c.Self().Send(stepMsg{})
		return
	}
	sctx, end := a.stepContext()
	out, err := a.loop.Step(sctx)
	end()
	if a.cancelled(c, sctx) {
		return
	}
	if err != nil {
		if modelFailed(err) {
			a.agentOutcome(c, &agent.Outcome{Reason: "model_error: " + err.Error(), Spent: a.loop.Spent()})
			return
		}
		a.failed(c, "agent step", err, stepMsg{})
		return
	}
	a.streak = retryStreak{} // a step went through: what failed before cleared
	if out != nil {
		a.agentOutcome(c, out)
		return
	}
	_ = c.Self().Send(stepMsg{})
}

// modelFailed reports whether a step's error is the model's, for good: a
// response the gateway cannot read, a refusal it does not retry, or the
// scripted model's (its script ran out). The step would fail the same
// again, so the task fails with a model_error; any other error (the
// sandbox's, the log's) is retried. It goes by the errors' types, never
// their text: a sandbox error names the path the model chose, which can
// read like anything.
func modelFailed(err error) bool {
	var he *model.HTTPError
	return errors.Is(err, model.ErrMalformed) || errors.Is(err, model.ErrScript) || (errors.As(err, &he) && !he.Retryable())
}

// agentOutcome records how the loop ended.
func (a *taskActor) agentOutcome(c *actor.Context, out *agent.Outcome) {
	if out.Reason == "waiting_approval" {
		poll := approvalPollMsg{toolCallID: out.Approval.ToolCallID}
		a.awaitDecision(c, "agent/waiting-", poll, awaitMsg{prefix: "agent/waiting-", poll: poll})
		return
	}
	if out.Reason == "finished" {
		a.finished = out
		a.finishTask(c)
		return
	}
	a.end(c, agentStopped(out))
}

// agentStopped is the end of a task whose loop stopped short of a finish
// (a budget, the model's failure): failed, with the outcome's reason cut
// by failedReason. The reason can carry what a provider sent (a model
// error's type and message) or a replay's error, of any length.
func agentStopped(out *agent.Outcome) endMsg {
	reason := failedReason(out.Reason)
	return endMsg{key: "agent/stopped", payload: map[string]any{"to": "failed", "reason": reason, "spent": out.Spent}, why: reason}
}

// end records the task's last event (after the sandbox's last egress
// attempts) and stops the actor; a failed append retries the end only.
func (a *taskActor) end(c *actor.Context, m endMsg) {
	if err := a.flushEgress(); err != nil {
		a.failed(c, "record egress", err, m)
		return
	}
	if _, err := a.append(a.ctx, m.key, ev("state_changed", m.payload)); err != nil {
		a.failed(c, "record the end", err, m)
		return
	}
	a.finish(c, m.why, &a.d.stats.Finished)
}

// agentLog reads the task's log up to seq upTo as the loop replays it,
// with split events joined back together. (A split event's parts and the
// event itself are one append, so upTo, a task's last seq, never falls
// between them.)
func (a *taskActor) agentLog(ctx context.Context, upTo uint64) ([]agent.Event, error) {
	evs, err := a.d.readLog(ctx, a.id, 0, upTo)
	if err != nil {
		return nil, err
	}
	out := make([]agent.Event, 0, len(evs))
	var j api.PartJoiner
	for _, e := range evs {
		p, ok, err := j.Add(e.GetKind(), e.GetPayload())
		if err != nil {
			return nil, fmt.Errorf("event %d: %w", e.GetSeq(), err)
		}
		if ok {
			out = append(out, agent.Event{Kind: e.GetKind(), Payload: p})
		}
	}
	return out, nil
}

// DefaultApprovalGrace is how long a task waiting for approval keeps its
// sandbox on the node before it parks.
const DefaultApprovalGrace = time.Minute

// approvalPoll is how often a waiting task looks for its decision.
const approvalPoll = time.Second

// errCancelRequested ends a step's context when the task is cancelled.
var errCancelRequested = errors.New("the task was cancelled")

// stepContext is the context of one agent step: it ends when a cancel
// request reaches the task's log, which interrupts the model call or the
// command running in the sandbox (the guest kills its process group).
// Call end when the step is over.
func (a *taskActor) stepContext() (ctx context.Context, end func()) {
	ctx, cancel := context.WithCancelCause(a.ctx)
	after := a.agentSeen
	go func() {
		for ctx.Err() == nil {
			st, err := a.d.cl.Tasks().StreamEvents(ctx, connect.NewRequest(&warrenv1.StreamEventsRequest{TaskId: a.id, AfterSeq: after}))
			if err == nil {
				for st.Receive() {
					e := st.Msg().GetEvent()
					after = max(after, e.GetSeq())
					if e.GetKind() == "cancel_requested" {
						cancel(errCancelRequested)
					}
				}
				err = st.Err()
				st.Close()
			}
			if connect.CodeOf(err) == connect.CodeUnavailable && ctx.Err() == nil {
				a.d.cl.Failover() // the server is gone: the next one
			}
			select { // the stream broke (a server restarted): again shortly
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}()
	return ctx, func() { cancel(nil) }
}

// cancelled reports whether a step's context ended for a cancel request;
// the actor then records the cancellation.
func (a *taskActor) cancelled(c *actor.Context, stepCtx context.Context) bool {
	if !errors.Is(context.Cause(stepCtx), errCancelRequested) || a.ctx.Err() != nil {
		return false
	}
	c.Logger().Info("step interrupted: the task was cancelled", "task", a.id)
	a.cancel = true
	_ = c.Self().Send(stepMsg{})
	return true
}

// awaitDecision records that the task waits for a decision (the event's
// key is prefix + the call's id), starts its grace period and polls;
// retry is what a failed append sends.
func (a *taskActor) awaitDecision(c *actor.Context, prefix string, poll approvalPollMsg, retry any) {
	id := poll.toolCallID
	// The actor before this one (the node restarted within its TTL)
	// recorded this wait: a second waiting_approval would be refused.
	if !slices.Contains(a.waitingOn, id) {
		if _, err := a.append(a.ctx, prefix+id, ev("state_changed", map[string]any{"to": "waiting_approval", "tool_call_id": id})); err != nil {
			a.failed(c, "record waiting", err, retry)
			return
		}
	}
	if a.waitSince.IsZero() {
		a.waitSince = time.Now()
	}
	c.After(approvalPoll, poll)
}

// pollApproval waits (without a step running) for the decision on a call;
// then it replays the log, which holds the decision, and goes on. A task
// that has waited its grace period parks instead; a cancelled one ends.
func (a *taskActor) pollApproval(c *actor.Context, m approvalPollMsg) {
	ctx := a.ctx
	id := m.toolCallID
	retry := func(decided bool) {
		c.After(approvalPoll, approvalPollMsg{toolCallID: id, decided: decided, finish: m.finish})
	}
	if !m.decided {
		// Only the events since the last look: a long wait does not read
		// the whole log every second.
		evs, err := a.newEvents()
		if err != nil {
			retry(false)
			return
		}
		for _, e := range evs {
			var p struct {
				ID string `json:"tool_call_id"`
			}
			text, isMsg := userMessage(e)
			switch {
			case isMsg:
				a.heldMsgs = append(a.heldMsgs, text) // for the model's next step
			case e.GetKind() == "cancel_requested":
				a.cancel = true
			case e.GetKind() == "approval_decided" && json.Unmarshal(e.GetPayload(), &p) == nil && p.ID == id:
				m.decided = true
			}
		}
		if a.cancel {
			_ = c.Self().Send(stepMsg{}) // records the cancellation
			return
		}
		if !m.decided {
			grace := a.d.cfg.ApprovalGrace
			if grace <= 0 {
				grace = DefaultApprovalGrace
			}
			if time.Since(a.waitSince) >= grace && a.loop.Resumable() {
				a.park(c, id)
				return
			}
			retry(false)
			return
		}
	}
	a.waitSince = time.Time{}
	if _, err := a.append(ctx, "agent/running-"+id, ev("state_changed", map[string]any{"to": "running", "after_approval": id})); err != nil {
		a.failed(c, "record running", err, m)
		return
	}
	a.waitingOn = nil
	if m.finish { // the push's approval: the finish phase reads the decision
		a.finishTask(c)
		return
	}
	all, err := a.agentLog(ctx, a.agentSeen)
	if err != nil {
		retry(true)
		return
	}
	a.heldMsgs = nil // the replay puts them where they belong
	if _, err := a.loop.Replay(all); err != nil {
		a.agentOutcome(c, &agent.Outcome{Reason: "replay: " + err.Error(), Spent: a.loop.Spent()})
		return
	}
	sctx, end := a.stepContext()
	out, err := a.loop.FinishReplayedTurn(sctx)
	end()
	if a.cancelled(c, sctx) {
		return
	}
	if err != nil {
		a.failed(c, "run the approved call", err, stepMsg{})
		return
	}
	a.streak = retryStreak{} // a step went through: what failed before cleared
	if out != nil {
		a.agentOutcome(c, out)
		return
	}
	_ = c.Self().Send(stepMsg{})
}

// park lets a task that has waited its grace period for a decision go: it
// records the sandbox's last egress attempts and a parked event, which
// frees the task's room on the node and fences this actor off; the actor
// then ends and its sandbox is destroyed. The workspace is the last
// checkpoint on the log, and the decision puts the task back to pending
// to resume (replaying its log) on any node. A decision that lands first
// is not lost: the servers requeue the task at once.
func (a *taskActor) park(c *actor.Context, id string) {
	if err := a.flushEgress(); err != nil {
		a.failed(c, "record egress", err, parkMsg{toolCallID: id})
		return
	}
	p := map[string]any{"reason": fmt.Sprintf("no decision within %s: the sandbox is released", time.Since(a.waitSince).Round(time.Second)),
		"tool_call_id": id, "node": a.d.cfg.ID}
	if a.sb != nil {
		p["sandbox"] = a.sb.ID()
	}
	if _, err := a.append(a.ctx, "agent/parked-"+id, ev("parked", p)); err != nil {
		a.failed(c, "park", err, parkMsg{toolCallID: id})
		return
	}
	c.Logger().Info("agent task parked until its approval is decided", "task", a.id, "tool_call_id", id)
	a.finish(c, "parked for approval", &a.d.stats.Parked)
}
