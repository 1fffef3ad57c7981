package agent

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/warrenhq/warren/actor"
	"github.com/warrenhq/warren/agent/model"
	"github.com/warrenhq/warren/api/textcut"
)

// Recorder is the task's event log as the loop writes it: Record returns
// once the event is committed, and a second Record with the same key is
// applied once. The loop records before it acts (write-ahead).
type Recorder interface {
	Record(ctx context.Context, key, kind string, payload any) error
}

// Caller makes a model call: the gateway.
type Caller interface {
	Call(ctx context.Context, req model.Request) (*model.Result, error)
}

// Budgets are a task's limits; zero means none.
type Budgets struct {
	MaxSteps        int64
	MaxTokens       int64
	MaxCostMicroUSD int64
	MaxWallClock    time.Duration
}

// Spent is what a task has used so far.
type Spent struct {
	Steps        int64       `json:"steps"`
	Usage        model.Usage `json:"usage"`
	CostMicroUSD int64       `json:"cost_micro_usd"`
}

// Config is one task's loop.
type Config struct {
	Model     string
	MaxTokens int    // per call (default 8192); lowered to what the budgets leave
	System    string // "" means DefaultSystem
	Budgets   Budgets
	Price     model.Price // for the worst case of a call, before it is made
	Clock     actor.Clock // nil: real
	// Policy decides each tool call's tier; nil allows everything.
	Policy *Policy
	// Blobs keeps the full output of a tool call whose view the model saw
	// truncated; the event points at it. nil: only the view is kept.
	Blobs BlobStore
	// ContextWindow is the model's window in tokens (default 200,000).
	// When a request would fill CompactAt of it (default 0.8), the loop
	// compacts the history once, in one step, and goes on from there.
	ContextWindow int64
	CompactAt     float64
	// Checkpoints records the workspace's patch against the base after
	// each step that may have changed it (the tools' repository must have
	// been through InitBase).
	Checkpoints bool
	// Started is when the task's wall clock started (its creation, so a
	// resumed task does not start its budget over); zero: the loop's
	// creation.
	Started time.Time
	// MaxTurnsWithoutTools is how many model turns in a row may call no
	// tool (text only, an answer cut by the output limit, a pause) before
	// the task fails with model_stalled (default
	// DefaultMaxTurnsWithoutTools): each such turn is answered with a
	// nudge and another paid call, and a task without budgets would pay
	// for them for good.
	MaxTurnsWithoutTools int
}

// DefaultMaxTurnsWithoutTools is Config.MaxTurnsWithoutTools's default.
const DefaultMaxTurnsWithoutTools = 3

// DefaultSystem is the frozen system prompt.
const DefaultSystem = `You are a software engineer working in a sandbox on one repository, checked out at its root.
Find the cause of the issue you are given, fix it with the smallest change that is right, and run the repository's tests.
Use the tools: read and search before you edit; edit_file needs text that occurs exactly once.
When the tests pass, call finish with a summary, the cause and the fix. Do not ask questions: nobody answers them.`

// Task is what the loop works on.
type Task struct {
	IssueTitle, IssueBody string
	TestCommand           string
}

// Outcome is how a loop ended.
type Outcome struct {
	// Reason: "finished"; "waiting_approval" (Approval says for what; the
	// task resumes by Replay and Resume once the decision is on its log);
	// the budget that stopped it ("max_steps", "max_tokens", "max_cost",
	// "max_wall_clock"); or the model's failure, "model_refused: …",
	// "model_error: …" or "model_stalled: …" (MaxTurnsWithoutTools).
	Reason   string    `json:"reason"`
	Finish   *Finish   `json:"finish,omitempty"`
	Approval *Approval `json:"approval,omitempty"`
	Spent    Spent     `json:"spent"`
}

// Approval is a tool call waiting for a person.
type Approval struct {
	ToolCallID string          `json:"tool_call_id"`
	Tool       string          `json:"tool"`
	Input      json.RawMessage `json:"input"`
	Reason     string          `json:"reason"`
}

// decision is a recorded approval_decided.
type decision struct {
	approved bool
	comment  string
}

// ErrNotFinished is RejectFinish on a loop whose model has not finished.
var ErrNotFinished = errors.New("reject finish: the loop has not finished")

// ErrReplay is a log the loop cannot rebuild a conversation from.
var ErrReplay = errors.New("replay")

// Loop is one task's agent loop. It is not safe for concurrent use: the
// task actor drives it, one step at a time.
type Loop struct {
	cfg     Config
	caller  Caller
	tools   *Tools
	rec     Recorder
	clock   actor.Clock
	msgs    []model.Message
	spent   Spent
	started time.Time
	step    int64
	// compactedLast is set while the last model call was a compaction:
	// the next is a model turn, never another compaction (see
	// needsCompaction).
	compactedLast bool
	// the turn whose calls have not all run (see openTurn), and the user
	// messages that wait for its results
	open       *openTurn
	heldSteers []string
	// given counts the user's messages handed to the loop (Steer, or
	// found by Replay): a model_call records it as user_messages, so that
	// a replay gives the model each message where the live loop did, not
	// where its event lies on the log (one that came during a model call
	// is on the log before that call's event, and the model saw it after).
	given int64
	// set by Replay: the finish it found (its end was not recorded)
	replayFinish *Finish
	// the finishing turn's tool results, which its end keeps out of the
	// conversation until RejectFinish
	finishResults []model.Block
	finishID      string
	rejections    int
	// user messages Replay found after the finish, for RejectFinish
	deferredSteers []string
	// approvals asked (true) and decided, by tool call id, from the log
	asked     map[string]bool
	decisions map[string]decision
	// the last checkpoint (recorded, or found by Replay)
	checkpoint         string
	hasCheckpoint      bool
	checkpointTooLarge bool // the last one's patch is not on the log
	failedCalls        int  // model calls that failed in a row
	// model turns in a row without a tool call (recorded, or found by
	// Replay); compactions neither count nor reset it
	turnsWithoutTools int
	// every tool call id of the task's model calls (recorded, or found
	// by Replay), compacted ones included: approvals and results are
	// matched by id, so a new call gets none of them (see call)
	toolIDs map[string]bool
	// the last model call, if its model_call is not on the log yet
	unrecorded *unrecordedCall
}

// MaxFailedCalls is how many model calls in a row may fail (each after
// the gateway's own retries) before the task ends with a model_error.
const MaxFailedCalls = 5

// Resumable reports whether the log holds the workspace: the last
// checkpoint's patch is on it (or the workspace is the base). A task that
// is not resumable must not let its sandbox go.
func (l *Loop) Resumable() bool { return !l.checkpointTooLarge }

// LastCheckpoint is the workspace patch of the last checkpoint Replay
// found; ok is false when there is none (the base is the workspace).
func (l *Loop) LastCheckpoint() (patch string, ok bool) { return l.checkpoint, l.hasCheckpoint }

// NewLoop makes a loop; Start or Replay then sets its conversation.
func NewLoop(cfg Config, caller Caller, tools *Tools, rec Recorder) *Loop {
	if cfg.MaxTokens <= 0 {
		cfg.MaxTokens = 8192
	}
	if cfg.System == "" {
		cfg.System = DefaultSystem
	}
	if cfg.Clock == nil {
		cfg.Clock = actor.RealClock()
	}
	if cfg.MaxTurnsWithoutTools <= 0 {
		cfg.MaxTurnsWithoutTools = DefaultMaxTurnsWithoutTools
	}
	started := cfg.Started
	if started.IsZero() {
		started = cfg.Clock.Now()
	}
	return &Loop{cfg: cfg, caller: caller, tools: tools, rec: rec, clock: cfg.Clock, started: started}
}

// Spent returns what the task has used.
func (l *Loop) Spent() Spent { return l.spent }

// Start builds the first user message (the issue, the repository's
// AGENTS.md if it has one, its map) and records it. The user's messages
// already on the task's log (sent before the task started) are then
// Steered: Replay puts them after this message too.
func (l *Loop) Start(ctx context.Context, t Task) error {
	issue := fmt.Sprintf("Issue: %s\n\n%s\n", t.IssueTitle, strings.TrimSpace(t.IssueBody))
	if t.TestCommand != "" {
		issue += fmt.Sprintf("\nThe repository's tests run with: %s\n", t.TestCommand)
	}
	agents, repoMap := "", ""
	// The sandbox refuses a file over the limit (it does not cut it), so
	// AGENTS.md is read whole, up to the tools' limit, and cut here: its
	// head, which is all the message has room for, then fitJSON below.
	if b, err := l.tools.SB.ReadFile(ctx, path.Join(l.tools.Root, "AGENTS.md"), MaxFileBytes); err == nil && len(b) > 0 {
		if len(b) > MaxResultJSON {
			b = append(b[:MaxResultJSON:MaxResultJSON], fmt.Sprintf("\n[... %d bytes of AGENTS.md left out ...]", len(b)-MaxResultJSON)...)
		}
		agents = fmt.Sprintf("\nThe repository's AGENTS.md:\n%s\n", strings.ToValidUTF8(string(b), "\uFFFD"))
	}
	if m, err := l.tools.RepoMap(ctx); err == nil && m != "" {
		repoMap = "\nThe repository's files and top-level symbols:\n" + m
	}
	// The message is an event, which holds at most 64 KiB: the map goes
	// short first (the model has repo_map and list_files), then
	// AGENTS.md, then the issue.
	for _, part := range []*string{&repoMap, &agents, &issue} {
		if over := jsonLen(issue+agents+repoMap) - MaxResultJSON; over > 0 {
			*part = fitJSON(*part, jsonLen(*part)-over)
		}
	}
	text := issue + agents + repoMap
	if err := l.rec.Record(ctx, "context", "message", map[string]any{"from": "agent", "role": "user", "initial": true, "text": text}); err != nil {
		return err
	}
	l.msgs = []model.Message{{Role: model.RoleUser, Content: []model.Block{{Type: model.BlockText, Text: text}}}}
	return nil
}

// Steer adds a user's message; the model sees it at the next step, after
// the results of a turn still open. The caller gives the messages in the
// order of the log, each once.
func (l *Loop) Steer(text string) {
	l.given++
	l.steer(text)
}

// steer is Steer for a message the loop has counted already (held, or
// deferred past a finish). It is held while a turn is open, and while a
// paid model call waits to be recorded: the call's turn (or summary) was
// made without it, so the message follows it, as a replay gives it (the
// call's user_messages does not count it).
func (l *Loop) steer(text string) {
	if l.open != nil || l.unrecorded != nil {
		l.heldSteers = append(l.heldSteers, text)
		return
	}
	l.appendUser(model.Block{Type: model.BlockText, Text: "Message from the user: " + text})
}

// steerHeld gives the model the messages held while a turn was open,
// after its results.
func (l *Loop) steerHeld() {
	held := l.heldSteers
	l.heldSteers = nil
	for _, text := range held {
		l.steer(text)
	}
}

// appendUser adds blocks to the conversation's trailing user turn, or
// starts one.
func (l *Loop) appendUser(b ...model.Block) {
	if n := len(l.msgs); n > 0 && l.msgs[n-1].Role == model.RoleUser {
		l.msgs[n-1].Content = append(l.msgs[n-1].Content, b...)
		return
	}
	l.msgs = append(l.msgs, model.Message{Role: model.RoleUser, Content: b})
}

// Run steps until the model finishes or a budget stops it.
func (l *Loop) Run(ctx context.Context) (*Outcome, error) {
	for {
		out, err := l.Step(ctx)
		if err != nil || out != nil {
			return out, err
		}
	}
}

// budget returns the max_tokens the next call may use, or the budget
// that forbids the call: checked against the call's worst case, so the
// task never overspends.
func (l *Loop) budget(req model.Request) (int, string) {
	b := l.cfg.Budgets
	if b.MaxSteps > 0 && l.spent.Steps+1 > b.MaxSteps {
		return 0, "max_steps"
	}
	if b.MaxWallClock > 0 && l.clock.Now().Sub(l.started) >= b.MaxWallClock {
		return 0, "max_wall_clock"
	}
	maxTok := int64(l.cfg.MaxTokens)
	in := model.EstimateInputTokens(req)
	if b.MaxTokens > 0 {
		maxTok = min(maxTok, b.MaxTokens-l.spent.Usage.Total()-in)
	}
	if b.MaxCostMicroUSD > 0 {
		left := b.MaxCostMicroUSD - l.spent.CostMicroUSD - l.cfg.Price.WorstCaseMicroUSD(in, 0)
		if l.cfg.Price.Output > 0 {
			maxTok = min(maxTok, int64(float64(left)/l.cfg.Price.Output))
		} else if left < 0 {
			maxTok = 0
		}
	}
	const minUseful = 256 // fewer output tokens cannot make progress
	if maxTok < minUseful {
		if b.MaxCostMicroUSD > 0 && l.spent.CostMicroUSD+l.cfg.Price.WorstCaseMicroUSD(in, minUseful) > b.MaxCostMicroUSD {
			return 0, "max_cost"
		}
		return 0, "max_tokens"
	}
	return int(maxTok), ""
}

// Step makes one model call and runs the tools it asks for. It returns an
// outcome when the task is over.
func (l *Loop) Step(ctx context.Context) (*Outcome, error) {
	if l.open != nil { // a step that failed part-way: finish its turn first
		return l.runTurn(ctx, l.open)
	}
	// The live loop ends at the turn that reaches the limit; a replay of
	// a log that ends there (the node died before the task's end was
	// recorded) ends here, without another call.
	if out := l.stalled(); out != nil {
		return out, nil
	}
	req := model.Request{Model: l.cfg.Model, System: l.cfg.System, Tools: ToolSpecs(), Messages: l.msgs}
	// A call made and paid for but not recorded is recorded and acted on
	// by the next call of its own kind (see call): this step is that kind,
	// whatever the estimate says now (a message Steered since may have
	// put it over or under the threshold), else the call was dropped and
	// the model asked again.
	if u := l.unrecorded; (u != nil && u.compaction) || (u == nil && l.needsCompaction(req)) {
		return l.compact(ctx, req)
	}
	resp, n, stop, err := l.call(ctx, req, false)
	if resp == nil {
		return stop, err
	}
	l.compactedLast = false
	l.noteTurn(resp.Content)
	return l.runTurn(ctx, &openTurn{n: n, content: resp.Content, stop: resp.StopReason})
}

// CompactPrompt asks the model for the summary that replaces the history.
const CompactPrompt = `The conversation is near the context window's end and will be replaced by your summary.
Write it now, for yourself: what the issue is, what you found (files, functions, causes), what you changed,
what the tests say, and what is left to do. Be complete and concrete; the history itself will be gone.`

func (l *Loop) needsCompaction(req model.Request) bool {
	window := l.cfg.ContextWindow
	if window <= 0 {
		window = 200_000
	}
	at := l.cfg.CompactAt
	if at <= 0 || at >= 1 {
		at = 0.8
	}
	// Not twice in a row: when the task's context and the summary alone
	// are over the threshold (a small window, a long issue), compacting
	// again would only make another summary, each a paid model call, for
	// as long as the budgets allow (without a max_steps budget, for good).
	// The model's turn goes ahead instead; a provider that finds it too
	// long refuses it, and the task fails with that model error.
	return !l.compactedLast && len(l.msgs) > 2 && float64(model.EstimateInputTokens(req)) > at*float64(window)
}

// compact replaces the history with the model's summary of it, in one
// model call (counted in the budgets like any), recorded as a model_call
// with "compaction": true. The first message (the task) stays, so the
// prompt's prefix, and its cache, stay too.
func (l *Loop) compact(ctx context.Context, req model.Request) (*Outcome, error) {
	// The prompt joins the trailing user turn (tool results) on a copy:
	// the history itself is replaced only once the summary is recorded.
	prompt := model.Block{Type: model.BlockText, Text: CompactPrompt}
	msgs := slices.Clone(l.msgs)
	if last := len(msgs) - 1; msgs[last].Role == model.RoleUser {
		msgs[last].Content = append(slices.Clone(msgs[last].Content), prompt)
	} else {
		msgs = append(msgs, model.Message{Role: model.RoleUser, Content: []model.Block{prompt}})
	}
	req.Messages = msgs
	resp, _, stop, err := l.call(ctx, req, true)
	if resp == nil {
		return stop, err
	}
	l.msgs = compacted(l.msgs[0], summaryOf(resp))
	l.compactedLast = true
	l.steerHeld() // messages that came while the summary waited to be recorded
	return nil, nil
}

// call makes one model call as the next step, within the budgets, and
// records it as a model_call before anything acts on it. It returns no
// response when a budget forbids the call (stop says which) or the call
// failed. A compaction's event keeps the summary as its content.
func (l *Loop) call(ctx context.Context, req model.Request, compaction bool) (resp *model.Response, n int64, stop *Outcome, err error) {
	// A call made and paid for whose model_call did not make it to the log
	// (or whose append's answer was lost) is recorded now, under its own
	// key, and acted on: the model is not asked again.
	if u := l.unrecorded; u != nil && u.compaction == compaction {
		if err := l.rec.Record(ctx, u.key, "model_call", u.ev); err != nil {
			return nil, u.n, nil, err
		}
		l.unrecorded = nil
		l.noteToolIDs(u.content)
		return u.resp, u.n, nil, nil
	}
	l.unrecorded = nil
	maxTok, reason := l.budget(req)
	if reason != "" {
		return nil, 0, &Outcome{Reason: reason, Spent: l.spent}, nil
	}
	req.MaxTokens = maxTok
	req.TakenToolIDs = l.toolIDs
	l.step++
	n = l.step
	req.Turn = int(n)
	// The wall-clock budget bounds the call too, retries and all: a
	// provider that never answers does not hold the task past it.
	cctx := ctx
	if left := l.timeLeft(); left > 0 {
		var cancel context.CancelFunc
		cctx, cancel = context.WithTimeout(ctx, left)
		defer cancel()
	}
	res, err := l.caller.Call(cctx, req)
	if err != nil {
		what := ""
		if compaction {
			what = " (compaction)"
		}
		err = fmt.Errorf("step %d%s: %w", n, what, err)
		// The gateway retried this call already; the task's actor retries
		// the step. A provider that keeps failing (down, a DNS or TLS
		// failure, the same request answered 500 every time) ends the
		// task after MaxFailedCalls in a row, budgets or not.
		if l.failedCalls++; l.failedCalls >= MaxFailedCalls && ctx.Err() == nil {
			return nil, n, &Outcome{Reason: fmt.Sprintf("model_error: %d calls in a row failed; the last: %v", l.failedCalls, err), Spent: l.spent}, nil
		}
		return nil, n, nil, err
	}
	l.failedCalls = 0
	resp = res.Response
	l.spent.Steps++
	l.spent.Usage = l.spent.Usage.Add(resp.Usage)
	l.spent.CostMicroUSD += res.CostMicroUSD
	content := resp.Content
	ev := map[string]any{
		"step": n, "model": resp.Model, "messages": len(req.Messages), "user_messages": l.given, "max_tokens": req.MaxTokens,
		"usage": resp.Usage, "cost_micro_usd": res.CostMicroUSD, "cache_hit_rate": resp.Usage.CacheHitRate(),
		"attempts": res.Attempts, "spent": l.spent,
	}
	if compaction {
		ev["compaction"] = true
		content = []model.Block{{Type: model.BlockText, Text: summaryOf(resp)}}
	}
	ev["response"] = map[string]any{"id": resp.ID, "content": content, "stop_reason": resp.StopReason}
	key := fmt.Sprintf("step-%d/model", n)
	if err := l.rec.Record(ctx, key, "model_call", ev); err != nil {
		l.unrecorded = &unrecordedCall{key: key, ev: ev, resp: resp, n: n, compaction: compaction, content: content}
		return nil, n, nil, err
	}
	l.noteToolIDs(content)
	return resp, n, nil, nil
}

// unrecordedCall is a model call whose model_call event the log did not
// confirm: the next call records it instead of asking the model again.
type unrecordedCall struct {
	key        string
	ev         map[string]any
	resp       *model.Response
	n          int64
	compaction bool
	content    []model.Block
}

// noteToolIDs adds the tool call ids of a model turn to those the task
// has used.
func (l *Loop) noteToolIDs(content []model.Block) {
	for _, b := range content {
		if b.Type == model.BlockToolUse {
			if l.toolIDs == nil {
				l.toolIDs = map[string]bool{}
			}
			l.toolIDs[b.ID] = true
		}
	}
}

// summaryOf is a compaction's summary.
func summaryOf(resp *model.Response) string {
	if s := resp.Text(); strings.TrimSpace(s) != "" {
		return s
	}
	return "(the summary was empty)"
}

// nudge is the user turn after a model turn without tool calls: it ran
// out of output or paused (go on), or it stopped (use the tools).
func nudge(stopReason string) model.Block {
	if stopReason == model.StopMaxTokens || stopReason == model.StopPauseTurn {
		return model.Block{Type: model.BlockText, Text: "Continue."}
	}
	return model.Block{Type: model.BlockText, Text: "Continue with the tools, and call finish when the tests pass."}
}

// compacted is the history after a compaction.
func compacted(first model.Message, summary string) []model.Message {
	return []model.Message{first,
		{Role: model.RoleAssistant, Content: []model.Block{{Type: model.BlockText, Text: "Summary of my work so far:\n" + summary}}},
		{Role: model.RoleUser, Content: []model.Block{{Type: model.BlockText, Text: "Continue from the summary."}}}}
}

// openTurn is a model turn whose tool calls have not all run and been
// recorded: replayed from a log that ends inside it, or live, when a step
// failed part-way through it (a record refused for a moment, a sandbox
// hiccup). The next Step (or FinishReplayedTurn) finishes it before any
// model call, so the model never sees a tool_use without its result and
// no call that ran is run again.
type openTurn struct {
	n       int64
	content []model.Block
	stop    string
	// results recorded on the log, by tool call id
	recorded map[string]model.Block
	// calls that ran in this process but whose result is not recorded
	// yet, and those whose checkpoint is
	ran   map[string]Result
	saved map[string]bool
	// calls that may change the workspace and began in this process
	// without a result: their step failed while they ran (see retried)
	begun map[string]bool
	// the finish call's, once its result is recorded
	finish *Finish
}

// runTurn adds the model's turn to the conversation and runs its tool
// calls. When it fails, the turn stays open (and out of the conversation)
// for the next Step to finish; user messages wait for its results.
func (l *Loop) runTurn(ctx context.Context, t *openTurn) (*Outcome, error) {
	l.open = nil
	out, err := l.afterResponse(ctx, t)
	if err != nil {
		l.msgs = l.msgs[:len(l.msgs)-1] // the turn's assistant message
		l.open = t
		return nil, err
	}
	switch {
	case out == nil:
		l.steerHeld()
	case out.Reason == "finished":
		// The finish turn's results stay out until its refusal, and the
		// messages follow them, as a replay of the log places them.
		l.deferredSteers = append(l.heldSteers, l.deferredSteers...)
		l.heldSteers = nil
	default:
		l.heldSteers = nil
	}
	// waiting_approval: the messages are on the log, and the replay after
	// the decision puts them after the turn's results.
	return out, nil
}

// canUndo reports whether the workspace can be put back as it was before
// the current call: every change before it is in the last checkpoint
// (the base when there is none), and that checkpoint's patch is whole.
//
// A call that may change the workspace and whose step failed while it
// ran (the sandbox's channel broke, or its guest answered after the
// host gave up) may have run in full, in part or not at all. The step is
// tried again in the same sandbox; running the call again on what the
// first try left would apply its changes twice (an append, a patch, a
// sed), so the workspace is first put back at the last checkpoint, as a
// resume on another node does. Where it cannot be, the model is told
// instead (notUndone), and the call is not run again.
func (l *Loop) canUndo() bool { return l.cfg.Checkpoints && !l.checkpointTooLarge }

// notUndone is the result of a call whose first try failed while it ran
// and whose workspace cannot be put back (see canUndo). It counts as a
// change, so a checkpoint records what the workspace now holds.
func (l *Loop) notUndone(tool string) Result {
	r := toolError("the sandbox failed while this %s call ran, and the workspace cannot be put back as it was before it: "+
		"the call may have run in full, in part or not at all. Check the workspace before you go on.", tool)
	r.Changed = true
	return r
}

// afterResponse adds the model's turn to the conversation and runs its
// tool calls, skipping those whose results are already recorded.
//
// A call that may change the workspace is followed by a checkpoint
// before its result is recorded: a task resumed elsewhere restores the
// last checkpoint and skips the calls with recorded results, so each of
// those calls' changes must be in it. (A call whose result did not make
// it is run again on the restored workspace.)
func (l *Loop) afterResponse(ctx context.Context, t *openTurn) (*Outcome, error) {
	if len(t.content) == 0 {
		t.content = []model.Block{{Type: model.BlockText, Text: "(no answer)"}}
	}
	if t.recorded == nil {
		t.recorded = map[string]model.Block{}
	}
	if t.ran == nil {
		t.ran, t.saved, t.begun = map[string]Result{}, map[string]bool{}, map[string]bool{}
	}
	n, content := t.n, t.content
	l.msgs = append(l.msgs, model.Message{Role: model.RoleAssistant, Content: content})
	var results []model.Block
	for i, tu := range content {
		if tu.Type != model.BlockToolUse {
			continue
		}
		if b, ok := t.recorded[tu.ID]; ok {
			results = append(results, b)
			continue
		}
		r, ran := t.ran[tu.ID]
		if !ran {
			if err := l.rec.Record(ctx, fmt.Sprintf("step-%d/call-%d", n, i), "tool_call", map[string]any{
				"tool_call_id": tu.ID, "tool": tu.Name, "input": tu.Input, "step": n}); err != nil {
				return nil, err
			}
			tier, rule := l.cfg.Policy.Decide(tu.Name, tu.Input, l.tools.Root)
			reason := ""
			if rule != nil {
				reason = rule.Reason
			}
			d, decided := l.decisions[tu.ID]
			switch {
			case invalidArguments(tu.Input) != "":
				r = toolError("the call's arguments are not JSON: %q; call %s again with a JSON object of its parameters",
					truncateText(invalidArguments(tu.Input), 200), tu.Name)
			case tier == Deny:
				r = toolError("denied by policy: %s", orDefault(reason, "a rule of the task's policy"))
			case decided && !d.approved:
				r = toolError("rejected by the reviewer: %s", orDefault(d.comment, "(no comment)"))
			case tier == Approve && !decided:
				if !l.asked[tu.ID] {
					if err := l.rec.Record(ctx, fmt.Sprintf("step-%d/approval-%d", n, i), "approval_requested", map[string]any{
						"tool_call_id": tu.ID, "tool": tu.Name, "input": tu.Input, "reason": reason, "step": n}); err != nil {
						return nil, err
					}
					if l.asked == nil {
						l.asked = map[string]bool{}
					}
					l.asked[tu.ID] = true // on the log: not asked again, whatever the key
				}
				// The call runs only after its approval: the loop ends here
				// and resumes from the log once the decision is on it.
				return &Outcome{Reason: "waiting_approval", Spent: l.spent,
					Approval: &Approval{ToolCallID: tu.ID, Tool: tu.Name, Input: tu.Input, Reason: reason}}, nil
			case t.begun[tu.ID] && !l.canUndo():
				r = l.notUndone(tu.Name)
			default:
				if t.begun[tu.ID] {
					if err := l.tools.Restore(ctx, l.checkpoint); err != nil {
						return nil, fmt.Errorf("step %d: %s: put the workspace back as it was before the call's first try: %w", n, tu.Name, err)
					}
				}
				if MutatesWorkspace(tu.Name) {
					t.begun[tu.ID] = true
				}
				var err error
				if r, err = l.tools.RunWithin(ctx, tu.Name, tu.Input, l.timeLeft()); err != nil {
					return nil, fmt.Errorf("step %d: %s: %w", n, tu.Name, err)
				}
			}
			t.ran[tu.ID] = r
		}
		if r.Changed && l.cfg.Checkpoints && !t.saved[tu.ID] {
			if err := l.saveCheckpoint(ctx, fmt.Sprintf("step-%d/checkpoint-%d", n, i), n, tu.ID); err != nil {
				return nil, err
			}
			t.saved[tu.ID] = true
		}
		payload, view, err := l.resultPayload(tu.ID, r)
		if err != nil {
			return nil, fmt.Errorf("step %d: %w", n, err)
		}
		if err := l.rec.Record(ctx, fmt.Sprintf("step-%d/result-%d", n, i), "tool_result", payload); err != nil {
			return nil, err
		}
		b := model.Block{Type: model.BlockToolResult, ToolUseID: tu.ID, Content: view, IsError: r.IsError}
		t.recorded[tu.ID] = b
		delete(t.ran, tu.ID)
		results = append(results, b)
		if r.Finish != nil {
			t.finish = r.Finish
		}
	}
	if t.finish != nil {
		l.finishResults = results
		for _, tu := range content {
			if tu.Type == model.BlockToolUse && tu.Name == ToolFinish {
				l.finishID = tu.ID
			}
		}
		return &Outcome{Reason: "finished", Finish: t.finish, Spent: l.spent}, nil
	}
	if len(results) > 0 {
		l.appendUser(results...)
		return nil, nil
	}
	// A turn without tool calls: the model stopped (end_turn), ran out of
	// output (max_tokens) or paused (pause_turn). Keep it going; but a
	// refusal (the provider's safety stop) would only be asked again and
	// again, at a model call's cost each time, until a budget ends it.
	if t.stop == model.StopRefusal || t.stop == model.StopContentFilter {
		return &Outcome{Reason: "model_refused: the model stopped with " + t.stop, Spent: l.spent}, nil
	}
	// Nor is a model that keeps answering without the tools nudged for
	// good: it ends after MaxTurnsWithoutTools such turns in a row.
	if out := l.stalled(); out != nil {
		return out, nil
	}
	l.appendUser(nudge(t.stop))
	return nil, nil
}

// noteTurn counts a model turn (not a compaction) toward the turns in a
// row without a tool call.
func (l *Loop) noteTurn(content []model.Block) {
	for _, b := range content {
		if b.Type == model.BlockToolUse {
			l.turnsWithoutTools = 0
			return
		}
	}
	l.turnsWithoutTools++
}

// stalled is the outcome of a task whose model has answered
// MaxTurnsWithoutTools turns in a row without a tool call, or nil.
func (l *Loop) stalled() *Outcome {
	if l.turnsWithoutTools < l.cfg.MaxTurnsWithoutTools {
		return nil
	}
	return &Outcome{Reason: fmt.Sprintf("model_stalled: %d turns in a row without a tool call", l.turnsWithoutTools), Spent: l.spent}
}

// invalidArguments is the text of a tool call's arguments that were not
// JSON (model.InvalidArgumentsKey), or "".
func invalidArguments(input json.RawMessage) string {
	var v map[string]string
	if json.Unmarshal(input, &v) != nil || len(v) != 1 {
		return ""
	}
	return v[model.InvalidArgumentsKey]
}

// truncateText cuts s to about n bytes on a character boundary.
func truncateText(s string, n int) string { return textcut.Ellipsis(s, n) }

func orDefault(s, d string) string {
	if s == "" {
		return d
	}
	return s
}

// replayedCheckpoint is a checkpoint event's workspace, as Replay reads it.
type replayedCheckpoint struct {
	patch    string
	tooLarge bool
}

// Event is a recorded event, as the loop replays it.
type Event struct {
	Kind    string
	Payload json.RawMessage
}

// Replay rebuilds the conversation from a task's recorded events, with the
// recorded model responses: no model call is repeated. It returns the tool
// calls of the last model turn that have no recorded result; Resume runs
// them (the caller restores the workspace first when one of them changes
// it) and goes on.
func (l *Loop) Replay(events []Event) ([]model.Block, error) {
	l.msgs, l.spent, l.step, l.replayFinish, l.open, l.heldSteers, l.unrecorded, l.given = nil, Spent{}, 0, nil, nil, nil, nil, 0
	l.checkpoint, l.hasCheckpoint, l.checkpointTooLarge = "", false, false
	l.asked, l.decisions, l.toolIDs = map[string]bool{}, map[string]decision{}, nil
	l.finishResults, l.finishID, l.rejections, l.deferredSteers = nil, "", 0, nil
	l.turnsWithoutTools = 0
	var pending []model.Block
	results := map[string]model.Block{}
	// checkpoints whose call has no result yet, by tool call id
	unconfirmed := map[string]replayedCheckpoint{}
	// The user's messages before the first model call: one may come
	// before the task's context (sent while the task waited for a node),
	// and the model saw each after the context (see Start); a second
	// context (a start that ran again before any model call) starts the
	// conversation over with all of them.
	var early []string
	called := false
	// The user's messages after the first model call, not yet given: a
	// model_call's user_messages says how many the live loop had been
	// given before it; the rest came during the call (or later), and the
	// model saw them after it. Logs from before the count give each
	// message before the next model call.
	var queued []string
	give := func(text string) {
		l.given++
		switch {
		case l.replayFinish != nil:
			// The finish turn's results stay out until its refusal:
			// the message follows them, as it did live.
			l.deferredSteers = append(l.deferredSteers, text)
		case len(pending) > 0:
			// Its turn's calls are still running: the model sees it
			// after their results.
			l.heldSteers = append(l.heldSteers, text)
		default:
			l.steer(text)
		}
	}
	// flush ends the previous turn: its results, then the messages that
	// came while it ran, in the order the loop gave them to the model.
	flush := func() {
		bs, still := splitRecorded(pending, results)
		if len(bs) > 0 {
			l.appendUser(bs...)
		}
		pending = still
		if len(pending) == 0 {
			l.steerHeld()
		}
	}
	for i, e := range events {
		switch e.Kind {
		case "message":
			var p struct {
				From, Role, Text string
				Initial          bool
			}
			if err := json.Unmarshal(e.Payload, &p); err != nil {
				return nil, fmt.Errorf("%w: event %d: %v", ErrReplay, i, err)
			}
			if p.From == "node" {
				p.From = "user" // a note the node gave the model as a user message
			}
			switch {
			case p.Initial:
				// The start Steers every message on the log: the count
				// starts over with them, as the live loop's did.
				l.msgs = []model.Message{{Role: model.RoleUser, Content: []model.Block{{Type: model.BlockText, Text: p.Text}}}}
				for _, text := range early {
					l.steer(text)
				}
				l.given, queued = int64(len(early)), nil
			case p.From == "user" && !called:
				early = append(early, p.Text)
				if len(l.msgs) > 0 { // after the context: given before the first call, or during it
					queued = append(queued, p.Text)
				}
			case p.From == "user":
				queued = append(queued, p.Text)
			}
		case "model_call":
			called = true
			flush()
			var p struct {
				Step         int64  `json:"step"`
				Compaction   bool   `json:"compaction"`
				UserMessages *int64 `json:"user_messages"`
				Response     struct {
					Content    []model.Block `json:"content"`
					StopReason string        `json:"stop_reason"`
				} `json:"response"`
				Spent Spent `json:"spent"`
			}
			if err := json.Unmarshal(e.Payload, &p); err != nil {
				return nil, fmt.Errorf("%w: event %d: %v", ErrReplay, i, err)
			}
			if len(l.msgs) == 0 {
				return nil, fmt.Errorf("%w: a model call before the task's context", ErrReplay)
			}
			n := len(queued)
			if p.UserMessages != nil {
				n = int(min(max(*p.UserMessages-l.given, 0), int64(n)))
			}
			for _, text := range queued[:n] {
				give(text)
			}
			queued = queued[n:]
			if p.Compaction {
				l.step, l.spent = p.Step, p.Spent
				text := ""
				for _, b := range p.Response.Content {
					text += b.Text
				}
				l.msgs = compacted(l.msgs[0], text)
				l.compactedLast = true
				continue
			}
			l.compactedLast = false
			if len(pending) > 0 {
				return nil, fmt.Errorf("%w: step %d has tool calls without results before the next model call", ErrReplay, p.Step)
			}
			l.step, l.spent = p.Step, p.Spent
			content := p.Response.Content
			if len(content) == 0 {
				content = []model.Block{{Type: model.BlockText, Text: "(no answer)"}}
			}
			l.msgs = append(l.msgs, model.Message{Role: model.RoleAssistant, Content: content})
			l.noteToolIDs(content)
			l.noteTurn(content)
			hasTools := false
			for _, b := range content {
				if b.Type == model.BlockToolUse {
					pending = append(pending, b)
					hasTools = true
				}
			}
			if !hasTools {
				l.appendUser(nudge(p.Response.StopReason))
			}
		case "checkpoint":
			var p struct {
				Patch       string `json:"patch"`
				PatchBase64 []byte `json:"patch_base64"` // a patch that is not UTF-8
				TooLarge    bool   `json:"too_large"`
				ID          string `json:"tool_call_id"`
			}
			if err := json.Unmarshal(e.Payload, &p); err != nil {
				return nil, fmt.Errorf("%w: event %d: %v", ErrReplay, i, err)
			}
			if p.PatchBase64 != nil {
				p.Patch = string(p.PatchBase64)
			}
			cp := replayedCheckpoint{patch: p.Patch, tooLarge: p.TooLarge}
			if p.ID == "" { // a log from before checkpoints named their call
				l.checkpoint, l.hasCheckpoint, l.checkpointTooLarge = cp.patch, !cp.tooLarge, cp.tooLarge
				continue
			}
			// The call's effect is in it: it counts once the call's result
			// is on the log. Without one, the call runs again, and must
			// not find its own effect there.
			unconfirmed[p.ID] = cp
		case "approval_requested", "approval_decided":
			var p struct {
				ID       string `json:"tool_call_id"`
				Approved bool   `json:"approved"`
				Comment  string `json:"comment"`
			}
			if err := json.Unmarshal(e.Payload, &p); err != nil || p.ID == "" {
				return nil, fmt.Errorf("%w: event %d: %s without a tool_call_id", ErrReplay, i, e.Kind)
			}
			if e.Kind == "approval_requested" {
				l.asked[p.ID] = true
			} else {
				l.decisions[p.ID] = decision{approved: p.Approved, comment: p.Comment}
			}
		case "finish_rejected":
			var p struct {
				ID     string `json:"tool_call_id"`
				Reason string `json:"reason"`
			}
			if err := json.Unmarshal(e.Payload, &p); err != nil || p.ID == "" {
				return nil, fmt.Errorf("%w: event %d: finish_rejected without a tool_call_id", ErrReplay, i)
			}
			results[p.ID] = model.Block{Type: model.BlockToolResult, ToolUseID: p.ID, Content: "finish was refused: " + p.Reason, IsError: true}
			l.replayFinish = nil
			l.rejections++
			flush()
			for _, text := range l.deferredSteers {
				l.steer(text)
			}
			l.deferredSteers = nil
		case "tool_result":
			var p struct {
				ID      string  `json:"tool_call_id"`
				Output  string  `json:"output"`
				IsError bool    `json:"is_error"`
				Finish  *Finish `json:"finish"`
			}
			if err := json.Unmarshal(e.Payload, &p); err != nil {
				return nil, fmt.Errorf("%w: event %d: %v", ErrReplay, i, err)
			}
			if p.Finish != nil {
				l.replayFinish = p.Finish
			}
			results[p.ID] = model.Block{Type: model.BlockToolResult, ToolUseID: p.ID, Content: p.Output, IsError: p.IsError}
			if cp, ok := unconfirmed[p.ID]; ok {
				l.checkpoint, l.hasCheckpoint, l.checkpointTooLarge = cp.patch, !cp.tooLarge, cp.tooLarge
				delete(unconfirmed, p.ID)
			}
		}
	}
	// The messages the log's last model call did not see come after it
	// (and after its turn's results, if the log has them all).
	for _, text := range queued {
		give(text)
	}
	// A checkpoint left unconfirmed (the node died between it and its
	// call's result) is not restored: the last confirmed one is, or the
	// base when there is none (an empty patch), so that the call, run
	// again, finds the workspace as it was before it.
	if len(unconfirmed) > 0 && !l.hasCheckpoint && !l.checkpointTooLarge {
		l.checkpoint, l.hasCheckpoint = "", true
	}
	// The last turn's calls: keep those with results, return the rest.
	recordedNow, missing := splitRecorded(pending, results)
	switch {
	case len(missing) == 0 && len(recordedNow) > 0 && l.replayFinish != nil:
		// The task had finished: its finish stays out of the
		// conversation unless RejectFinish takes it back, and the
		// messages that came with it follow it then.
		l.finishResults = recordedNow
		for _, tu := range pending {
			if tu.Name == ToolFinish {
				l.finishID = tu.ID
			}
		}
		l.deferredSteers = append(l.heldSteers, l.deferredSteers...)
		l.heldSteers = nil
	case len(missing) == 0 && len(recordedNow) > 0:
		flush()
	case len(missing) > 0:
		// The log ends inside a turn: it stays open, out of the
		// conversation, until FinishReplayedTurn (or a Step) runs the
		// rest of its calls.
		last := l.msgs[len(l.msgs)-1]
		l.msgs = l.msgs[:len(l.msgs)-1]
		l.open = &openTurn{n: l.step, content: last.Content, recorded: results}
		// A finish with calls after it in its turn (one waited for its
		// approval, or the node died): the turn ends as a finish once
		// they have run, not before.
		l.open.finish, l.replayFinish = l.replayFinish, nil
	}
	return missing, nil
}

// splitRecorded splits tool calls into the results recorded for them and
// the calls that have none.
func splitRecorded(calls []model.Block, results map[string]model.Block) (recorded, missing []model.Block) {
	for _, tu := range calls {
		if b, ok := results[tu.ID]; ok {
			recorded = append(recorded, b)
		} else {
			missing = append(missing, tu)
		}
	}
	return recorded, missing
}

// Resume finishes the last replayed turn (running its calls that have no
// result) and then runs the loop.
func (l *Loop) Resume(ctx context.Context) (*Outcome, error) {
	if out, err := l.FinishReplayedTurn(ctx); err != nil || out != nil {
		return out, err
	}
	return l.Run(ctx)
}

// FinishReplayedTurn runs the last replayed turn's calls that have no
// result (Resume without going on); the caller then Steps.
func (l *Loop) FinishReplayedTurn(ctx context.Context) (*Outcome, error) {
	if l.replayFinish != nil { // it had finished; only its end was not recorded
		return &Outcome{Reason: "finished", Finish: l.replayFinish, Spent: l.spent}, nil
	}
	if l.open != nil {
		return l.runTurn(ctx, l.open)
	}
	return nil, nil
}

// RejectFinish refuses the model's finish (its tests failed outside its
// control, or a reviewer rejected its diff): it records finish_rejected
// with the reason, which the model gets as the finish call's error, and
// the loop goes on with the next Step.
func (l *Loop) RejectFinish(ctx context.Context, reason string) error {
	if l.finishID == "" {
		return ErrNotFinished
	}
	if err := l.rec.Record(ctx, fmt.Sprintf("step-%d/finish-rejected", l.step), "finish_rejected", map[string]any{
		"tool_call_id": l.finishID, "step": l.step, "reason": reason}); err != nil {
		return err
	}
	l.appendUser(rejectedFinish(l.finishResults, l.finishID, reason)...)
	for _, text := range l.deferredSteers { // messages replayed while it had finished
		l.steer(text)
	}
	l.deferredSteers = nil
	l.rejections++
	l.finishResults, l.finishID, l.replayFinish = nil, "", nil
	return nil
}

// FinishRejections counts the finish_rejected events Replay saw (or
// RejectFinish recorded since).
func (l *Loop) FinishRejections() int { return l.rejections }

func rejectedFinish(results []model.Block, id, reason string) []model.Block {
	out := make([]model.Block, 0, len(results))
	for _, b := range results {
		if b.ToolUseID == id {
			b = model.Block{Type: model.BlockToolResult, ToolUseID: id, Content: "finish was refused: " + reason, IsError: true}
		}
		out = append(out, b)
	}
	return out
}

// Tools returns the loop's tools.
func (l *Loop) Tools() *Tools { return l.tools }

// timeLeft is what the wall-clock budget leaves a command (at least a
// second, so it still reports how it ended), or 0 without that budget.
func (l *Loop) timeLeft() time.Duration {
	if l.cfg.Budgets.MaxWallClock <= 0 {
		return 0
	}
	return max(l.cfg.Budgets.MaxWallClock-l.clock.Now().Sub(l.started), time.Second)
}

// saveCheckpoint records the workspace's patch against the base. A patch
// that is not UTF-8 (a Latin-1 source file's lines) goes in as base64: a
// JSON string would turn its bytes into U+FFFD, and it would no longer
// apply.
//
// A patch too large for the event is recorded as too_large with its size
// (a resumed task would start from the base, so the task cannot park); it
// is not even read from the sandbox when its size alone says so.
func (l *Loop) saveCheckpoint(ctx context.Context, key string, n int64, toolCallID string) error {
	// The patch's JSON is at least as long as the patch.
	patch, size, err := l.tools.patch(ctx, MaxCheckpointBytes)
	if err != nil && !errors.Is(err, ErrPatchTooLarge) {
		return fmt.Errorf("step %d: %w", n, err)
	}
	// The call it follows: a replay takes the checkpoint only once that
	// call's result is on the log too (see Replay).
	payload := map[string]any{"step": n, "bytes": size, "tool_call_id": toolCallID}
	switch {
	case err != nil:
	case utf8.ValidString(patch):
		payload["patch"] = patch
	default:
		payload["patch_base64"] = base64.StdEncoding.EncodeToString([]byte(patch))
	}
	if b, jerr := json.Marshal(payload); err != nil || jerr != nil || len(b) > MaxCheckpointBytes {
		delete(payload, "patch")
		delete(payload, "patch_base64")
		payload["too_large"] = true // a resumed task starts from the base
		payload["limit"] = MaxCheckpointBytes
		patch = ""
	}
	tooLarge := payload["too_large"] == true
	l.checkpoint, l.hasCheckpoint, l.checkpointTooLarge = patch, !tooLarge, tooLarge
	return l.rec.Record(ctx, key, "checkpoint", payload)
}

// MaxResultJSON bounds a tool_result event's payload, JSON-encoded: the
// log takes events of at most 64 KiB, and a view's JSON can take six
// bytes for one of its own (control bytes, bytes that are not UTF-8).
const MaxResultJSON = 60 << 10

// resultPayload is a call's tool_result event, and the view the model
// sees: cut further when the event would not fit, so that a replay gives
// the model what it saw live.
func (l *Loop) resultPayload(id string, r Result) (map[string]any, string, error) {
	payload := map[string]any{
		"tool_call_id": id, "output": "", "is_error": r.IsError,
		"full_bytes": len(r.Full), "changed": r.Changed, "finish": r.Finish}
	rest, _ := json.Marshal(payload)
	v := fitJSON(r.View, MaxResultJSON-len(rest)-64) // room for truncated and blob
	payload["output"], payload["truncated"] = v, len(r.Full) > len(v)
	if len(r.Full) > len(v) && l.cfg.Blobs != nil {
		ref, err := l.cfg.Blobs.Put(r.Full)
		if err != nil {
			return nil, "", err
		}
		payload["blob"] = ref
	}
	return payload, v, nil
}

// jsonLen is the length of s as a JSON string, quotes included.
func jsonLen(s string) int {
	b, _ := json.Marshal(s)
	return len(b)
}

// fitJSON returns s, or its head and tail with how much was left out
// between them, so that its JSON takes at most limit bytes.
func fitJSON(s string, limit int) string {
	if jsonLen(s) <= limit {
		return s
	}
	cut := func(keep int) string {
		head := keep / 4
		return strings.ToValidUTF8(s[:head], "\uFFFD") + fmt.Sprintf("\n[... %d bytes left out ...]\n", len(s)-keep) +
			strings.ToValidUTF8(s[len(s)-(keep-head):], "\uFFFD")
	}
	lo, hi := 0, len(s) // cut(lo) fits (or nothing does), cut(hi) does not
	if jsonLen(cut(0)) > limit {
		return ""
	}
	for hi-lo > 1 {
		mid := (lo + hi) / 2
		if jsonLen(cut(mid)) <= limit {
			lo = mid
		} else {
			hi = mid
		}
	}
	return cut(lo)
}
