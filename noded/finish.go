package noded

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/warrenhq/warren/actor"
	"github.com/warrenhq/warren/agent"
	"github.com/warrenhq/warren/agent/model"
	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
	"github.com/warrenhq/warren/api/textcut"
	"github.com/warrenhq/warren/guest"
)

const (
	// maxFindingsShown and maxBodyShown keep the finish step's events
	// under the log's 64 KiB: the PR's body on the forge has everything.
	maxFindingsShown = 50
	maxBodyShown     = 16 << 10
	// maxFinishShown bounds each of the summary, cause and fix of the
	// finish the task's last event carries (finishShown): at six bytes a
	// byte once escaped (<, >, &, control characters), the three and a
	// failed task's reason take under 44 KiB.
	maxFinishShown = 2 << 10
	// testTimeout bounds the finish step's run of the repository's tests.
	testTimeout = 20 * time.Minute
	// maxFinishRejections is how many refused finishes a task gets before
	// it ends failed.
	maxFinishRejections = 5
	// maxPublishTries is how many times one finish round tries a failed
	// push or pull request before the task ends failed: over about three
	// minutes (publishBackoff), longer when the forge asks for a wait.
	maxPublishTries = 8
	// publishTimeout bounds one try of the push and the pull request,
	// which a cancel does not cut off: the push's own 10 minutes and the
	// forge's calls of a minute each.
	publishTimeout = 15 * time.Minute
)

// finishTask is what follows the model's finish, outside its control:
//  1. the sandbox's diff is put on the node's workspace at the pinned
//     commit (a diff that does not apply ends the task) and checked;
//  2. the repository's test command runs in a verification sandbox: a
//     fresh one holding the repository at the pinned commit with only
//     the diff applied, never the model's own (runTestsClean); a failure
//     goes back to the model as the finish call's error, and the loop
//     goes on;
//  3. the checks are recorded; a blocking finding (then the tests do not
//     run) or an empty diff ends the task, an approval is asked for the
//     diff's SHA-256 (a rejection goes back to the model);
//  4. the branch agent/<task-id> is pushed and the pull request opened
//     (or found: a retry opens no second one), and its record is the
//     pull_request event.
//
// Each part reads what it needs from the log, so it can run again: after
// an approval, or on another node after a crash.
func (a *taskActor) finishTask(c *actor.Context) {
	if a.cancel { // a cancel read before (it is past the watch's mark): no tests, push or pull request
		_ = c.Self().Send(stepMsg{})
		return
	}
	ctx := a.ctx
	out := a.finished
	sctx, end := a.stepContext()
	defer end()
	round := a.loop.FinishRejections()
	fail := func(reason string, extra map[string]any) {
		// Cut like any failed task's: it may quote the tests' output or
		// git's and the forge's errors.
		reason = failedReason(reason)
		p := map[string]any{"to": "failed", "reason": reason, "finish": finishShown(out.Finish), "spent": a.loop.Spent()}
		for k, v := range extra {
			p[k] = v
		}
		a.end(c, endMsg{key: "agent/stopped", payload: p, why: reason})
	}
	reject := func(reason string) {
		if round+1 >= maxFinishRejections {
			fail(fmt.Sprintf("finish refused %d times; the last: %s", round+1, reason), nil)
			return
		}
		if err := a.loop.RejectFinish(ctx, reason); err != nil {
			if errors.Is(err, agent.ErrNotFinished) {
				fail("refuse the finish: "+err.Error(), nil)
				return
			}
			a.failed(c, "refuse the finish", err, finishMsg{})
			return
		}
		a.finished = nil
		_ = c.Self().Send(stepMsg{})
	}

	// What this round has done already, when it runs again (a failed
	// append, a push retried, after the push's approval): the sandbox has
	// not changed since the finish, so neither its diff nor its tests' run
	// (nor their verification sandbox) is made again.
	if a.fin == nil || a.fin.round != round {
		a.fin = &finishRound{round: round}
	}
	fin := a.fin

	// The model's diff: all that goes on from its sandbox.
	if !fin.havePatch {
		patch, err := a.loop.Tools().Checkpoint(sctx)
		if a.cancelled(c, sctx) {
			return
		}
		if errors.Is(err, agent.ErrPatchTooLarge) { // never cut: the model may make it smaller
			reject(err.Error() + "; leave large or generated files out of the change")
			return
		}
		if err != nil {
			a.failed(c, "take the diff", err, finishMsg{})
			return
		}
		fin.patch, fin.havePatch = patch, true
	}
	patch := fin.patch

	// 1. The diff, put on the node's workspace at the pinned commit, and
	// its checks (recorded after the tests' run, as they always were).
	issue := a.spec.GetIssueTitle() + "\n" + a.spec.GetIssueBody()
	_, rep, err := a.d.git.Review(sctx, a.ws, patch, agent.TestsRequested(issue))
	if a.cancelled(c, sctx) {
		return
	}
	if errors.Is(err, agent.ErrDiffTooLarge) { // the model's to make smaller, as a patch over its cap
		reject(err.Error() + "; leave large or generated files out of the change")
		return
	}
	if err != nil {
		if fin.tries++; fin.tries >= maxPublishTries || strings.Contains(err.Error(), "apply") {
			fail("the diff: "+err.Error(), nil) // the sandbox's patch is bad, or git keeps failing
			return
		}
		c.Logger().Warn("checking the diff failed; retrying", "task", a.id, "err", err)
		c.After(publishBackoff(fin.tries, err), finishMsg{})
		return
	}

	// 1b. The model's own words go into the commit message and the pull
	// request, which no diff check sees: a credential or a control
	// character there is the model's to take out.
	if f := out.Finish; f != nil {
		found, err := f.Secrets()
		if err != nil {
			a.failed(c, "scan the finish's text", err, finishMsg{})
			return
		}
		if len(found) > 0 {
			reject(fmt.Sprintf("your finish's summary, cause or fix holds what looks like a credential (%s); they go into the commit message and the pull request: "+
				"call finish again without it", found[0].Message))
			return
		}
		// git commit refuses a NUL on every try: the model's to take out.
		if err := f.ControlChar(); err != nil {
			reject(fmt.Sprintf("your finish's %v; the summary, cause and fix go into the commit message and the pull request, "+
				"which take no control characters but newlines and tabs: call finish again without it", err))
			return
		}
	}

	// 2. The tests, in a clean sandbox with only the diff (runTestsClean),
	// not in the model's; not for a diff the checks block anyway.
	var testOut string
	if cmd := a.spec.GetTestCommand(); cmd != "" && !rep.Blocked {
		if fin.test == nil {
			// Recorded under this lease by the actor before this one (it
			// restarted after a panic, or the node within its TTL): what
			// the log says is what the finish goes by, not a second run.
			run, err := a.recordedTestRun(ctx, round)
			if err != nil {
				a.failed(c, "read the log", err, finishMsg{})
				return
			}
			fin.test = run
		}
		if fin.test == nil {
			run, err := a.runTestsClean(sctx, c.Self(), round, patch, cmd)
			if a.cancelled(c, sctx) {
				return
			}
			if err != nil {
				a.failed(c, "run the test command in a clean sandbox", err, finishMsg{})
				return
			}
			fin.test = run
		}
		if err := a.recordEgress(); err != nil { // the verification sandbox's attempts (egressSink) before its test_run
			a.failed(c, "record the test run's egress", err, finishMsg{})
			return
		}
		res := fin.test.res
		testOut = fin.test.out
		passed := res.ExitCode == 0 && !res.TimedOut
		if _, err := a.append(ctx, fmt.Sprintf("finish/test-%d", round), ev("test_run", map[string]any{"command": cmd, "exit_code": res.ExitCode,
			"timed_out": res.TimedOut, "passed": passed, "output": tail(testOut, 4<<10), "duration_ms": fin.test.took.Milliseconds(),
			"clean_sandbox": true, "sandbox": fin.test.sandbox, "round": round, "epoch": a.epoch})); err != nil {
			a.failed(c, "record the test run", err, finishMsg{})
			return
		}
		if f := a.d.cfg.AfterRecord; f != nil {
			f(fmt.Sprintf("finish/test-%d", round))
		}
		if !passed {
			why := fmt.Sprintf("exit %d", res.ExitCode)
			if res.TimedOut {
				why = "timed out after " + cmp.Or(fin.test.timeout, testTimeout).String()
			}
			reject(fmt.Sprintf("the repository's test command `%s` failed (%s). It ran in a fresh sandbox with only your diff applied to the base commit: "+
				"nothing else you did in yours (files outside the repository, what you installed or configured) is there. Its output ends:\n%s", cmd, why, tail(testOut, 3000)))
			return
		}
	}

	// 3. The checks' verdict.
	shown, omitted := rep.Capped(maxFindingsShown)
	checked := map[string]any{"diff_sha256": rep.SHA256, "files": rep.Files, "added": rep.Added, "deleted": rep.Deleted,
		"findings": shown.Findings, "blocked": rep.Blocked, "needs_approval": rep.NeedsApproval}
	if omitted > 0 {
		checked["findings_omitted"] = omitted
	}
	if _, err := a.append(ctx, fmt.Sprintf("finish/diff-%d", round), ev("diff_checked", checked)); err != nil {
		a.failed(c, "record the checks", err, finishMsg{})
		return
	}
	switch {
	case rep.Files == 0:
		fail("the model finished without changing anything", nil)
		return
	case rep.Blocked:
		var msgs []string
		for _, f := range rep.Findings {
			if f.Action == "block" {
				msgs = append(msgs, f.Message)
			}
		}
		if len(msgs) > 5 {
			msgs = append(msgs[:5], fmt.Sprintf("and %d more", len(msgs)-5))
		}
		fail("the diff checks block the push: "+strings.Join(msgs, "; "), map[string]any{"findings": shown.Findings})
		return
	}
	approved := ""
	if rep.NeedsApproval {
		id := model.ReservedToolIDPrefix + rep.SHA256[:16]
		asked, decided, ok, comment, err := a.decision(ctx, id, rep.SHA256)
		if err != nil {
			a.failed(c, "read the log", err, finishMsg{})
			return
		}
		switch {
		case decided && ok:
			approved = rep.SHA256
		case decided:
			reject("a reviewer rejected the diff: " + orText(comment, "(no comment)"))
			return
		default:
			if !asked {
				var why []string
				for _, f := range rep.Findings {
					if f.Action == "approve" {
						why = append(why, f.Path+": "+f.Message)
					}
				}
				if _, err := a.append(ctx, "finish/approval-"+id, ev("approval_requested", map[string]any{"tool_call_id": id, "tool": "push",
					"input":       map[string]any{"diff_sha256": rep.SHA256, "files": rep.Files, "added": rep.Added, "deleted": rep.Deleted},
					"diff_sha256": rep.SHA256, "findings": shown.Findings, "reason": tail(strings.Join(why, "; "), 2000)})); err != nil {
					a.failed(c, "ask approval of the diff", err, finishMsg{})
					return
				}
			}
			a.awaitDecision(c, "finish/waiting-", approvalPollMsg{toolCallID: id, finish: true}, finishMsg{})
			return
		}
	}

	// 4. Push and pull request. A cancel that came before they start
	// stops the finish here; once they have started they run to their
	// end (publishTimeout, or the node stopping the actor: a.ctx), not
	// cut off by a cancel: a push killed after the forge took the branch,
	// or a pull request call given up after the forge opened it, would
	// leave both there with nothing on the log. Their outcome is
	// recorded, and only then is the cancel honoured.
	if a.cancelled(c, sctx) {
		return
	}
	pctx, pend := context.WithTimeout(ctx, publishTimeout)
	defer pend()
	when := time.Now()
	if t := a.created; !t.IsZero() {
		when = t // the same commit from every node and retry
	}
	content := agent.PRContent{TaskID: a.id, IssueTitle: a.spec.GetIssueTitle(), IssueBody: a.spec.GetIssueBody(), Finish: out.Finish,
		TestCommand: a.spec.GetTestCommand(), TestOutput: testOut, Report: rep}
	repo := a.spec.GetRepo()
	pub, err := a.d.git.Publish(pctx, a.ws, content, repo, a.d.git.BaseBranch(pctx, repo, a.spec.GetBase()), approved, when)
	if f := a.d.cfg.AfterPublish; f != nil && err == nil {
		f(sctx)
	}
	if err == nil {
		// Recorded even when the task was cancelled meanwhile: the branch
		// and the pull request are on the forge, and the log says so.
		rec := *pub
		flags, _ := (&agent.Report{Findings: pub.Flags}).Capped(maxFindingsShown)
		rec.Flags = flags.Findings
		if len(rec.Body) > maxBodyShown {
			rec.Body = textcut.Head(rec.Body, maxBodyShown) + "\n…(cut here; the forge has all of it)"
		}
		if _, err := a.append(ctx, "finish/pull-request", ev("pull_request", rec)); err != nil {
			a.failed(c, "record the pull request", err, finishMsg{})
			return
		}
		if f := a.d.cfg.AfterRecord; f != nil {
			f("finish/pull-request")
		}
	}
	if a.cancelled(c, sctx) {
		return
	}
	if err != nil {
		fin.tries++
		if fin.tries >= maxPublishTries {
			fail(fmt.Sprintf("publish: %v (after %d tries)", err, fin.tries), nil)
			return
		}
		wait := publishBackoff(fin.tries, err)
		c.Logger().Warn("publish failed; retrying", "task", a.id, "err", err, "in", wait)
		c.After(wait, finishMsg{})
		return
	}
	pr := map[string]any{"forge": pub.Forge, "head": pub.Branch, "base": pub.Base, "commit": pub.Commit}
	if pub.PR != nil {
		pr["url"], pr["number"] = pub.PR.URL, pub.PR.Number
	}
	a.end(c, endMsg{key: "agent/done", why: "finished",
		payload: map[string]any{"to": "succeeded", "finish": finishShown(out.Finish), "spent": a.loop.Spent(), "pull_request": pr}})
}

// finishShown is the finish the task's last event carries: its summary,
// cause and fix, each cut to maxFinishShown bytes (textcut.Ellipsis).
// Whole, they could pass the log's 64 KiB, which would refuse the end
// and fail a task whose pull request is open; the finish call's
// tool_result holds them whole.
func finishShown(f *agent.Finish) *agent.Finish {
	if f == nil {
		return nil
	}
	return &agent.Finish{Summary: textcut.Ellipsis(f.Summary, maxFinishShown), Cause: textcut.Ellipsis(f.Cause, maxFinishShown),
		Fix: textcut.Ellipsis(f.Fix, maxFinishShown)}
}

// recordedTestRun returns the test run of the finish's round recorded
// under this actor's lease epoch, or nil if there is none. A run recorded
// under another epoch (the task resumed on another node) is not taken:
// that node's tests ran in its own verification sandbox, and the round
// runs them again, as it always did.
func (a *taskActor) recordedTestRun(ctx context.Context, round int) (*testRun, error) {
	var found *testRun
	err := a.scanLog(ctx, func(e *warrenv1.Event) {
		if e.GetKind() != "test_run" {
			return
		}
		var p struct {
			Round      *int   `json:"round"`
			Epoch      uint64 `json:"epoch"`
			ExitCode   int    `json:"exit_code"`
			TimedOut   bool   `json:"timed_out"`
			Output     string `json:"output"`
			DurationMS int64  `json:"duration_ms"`
			Sandbox    string `json:"sandbox"`
		}
		if json.Unmarshal(e.GetPayload(), &p) != nil || p.Round == nil || *p.Round != round || p.Epoch != a.epoch {
			return
		}
		found = &testRun{res: guest.ExecResult{ExitCode: p.ExitCode, TimedOut: p.TimedOut}, out: p.Output,
			took: time.Duration(p.DurationMS) * time.Millisecond, sandbox: p.Sandbox}
	})
	return found, err
}

// decision looks on the task's log for the approval of the push of the
// diff whose SHA-256 is sha, asked for under id (pushApproval).
func (a *taskActor) decision(ctx context.Context, id, sha string) (asked, decided, approved bool, comment string, err error) {
	p := pushApproval{id: id, sha: sha}
	if err := a.scanLog(ctx, p.see); err != nil {
		return false, false, false, "", err
	}
	return p.asked, p.decided, p.approved, p.comment, nil
}

// pushApproval folds a task's log into the state of one push approval:
// asked once an approval_requested for the push of exactly this diff (tool
// "push", the full hash) is on it, decided by an approval_decided of its
// id after that request. An approval of some other call that had the same
// id (a model's tool call from before its ids were kept out of the push's
// namespace, see model.ReservedToolIDPrefix) does not count.
type pushApproval struct {
	id, sha                  string
	asked, decided, approved bool
	comment                  string
}

func (p *pushApproval) see(e *warrenv1.Event) {
	var v struct {
		ID       string `json:"tool_call_id"`
		Tool     string `json:"tool"`
		SHA      string `json:"diff_sha256"`
		Approved bool   `json:"approved"`
		Comment  string `json:"comment"`
	}
	if json.Unmarshal(e.GetPayload(), &v) != nil || v.ID != p.id {
		return
	}
	switch e.GetKind() {
	case "approval_requested":
		if v.Tool == "push" && v.SHA == p.sha {
			p.asked, p.decided, p.approved, p.comment = true, false, false, ""
		}
	case "approval_decided":
		if p.asked {
			p.decided, p.approved, p.comment = true, v.Approved, v.Comment
		}
	}
}

// scanLog hands each event of the task's log, as the server that answers
// has it, to f in order, with ListEvents pages.
func (a *taskActor) scanLog(ctx context.Context, f func(*warrenv1.Event)) error {
	var after uint64
	for {
		evs, err := a.d.listEvents(ctx, a.id, after, 1000)
		if err != nil {
			return err
		}
		if len(evs) == 0 { // the log's end (a page may be short before it)
			return nil
		}
		for _, e := range evs {
			after = e.GetSeq()
			f(e)
		}
	}
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}

func orText(s, d string) string {
	if strings.TrimSpace(s) == "" {
		return d
	}
	return s
}

// finishRound is what one round of the finish phase (one finish of the
// model) has done, kept while the actor retries it.
type finishRound struct {
	round     int
	patch     string
	havePatch bool
	test      *testRun // nil: the tests have not run
	tries     int      // failed checks or publishes of this round
}

// publishBackoff is the wait before a round's next try after its tries-th
// failure: 2 s doubling to a minute, or what the forge asked for (a rate
// limit's reset; GitHub's secondary limit asks for about a minute), if
// longer.
func publishBackoff(tries int, err error) time.Duration {
	d := min(2*time.Second<<min(tries-1, 5), time.Minute)
	if ra, ok := agent.RetryAfter(err); ok && ra > d {
		d = ra
	}
	return d
}

// testRun is a round's run of the test command in its verification
// sandbox (gone by now; its egress audit went to the actor's, egressSink).
type testRun struct {
	res     guest.ExecResult
	out     string
	took    time.Duration
	sandbox string // the verification sandbox's id
	// timeout is the run's: testTimeout, or less when the sandbox's TTL
	// left less (0 for a run read back from the log)
	timeout time.Duration
}
