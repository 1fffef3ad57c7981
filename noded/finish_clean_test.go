package noded_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
	"github.com/warrenhq/warren/noded"
	"github.com/warrenhq/warren/noded/driver"
	"github.com/warrenhq/warren/noded/driver/container"
)

// claimLog is the container driver with the ids of the claims made of it
// noted; failVerify verification claims (ids with -verify-) fail first.
type claimLog struct {
	*container.Driver
	mu         sync.Mutex
	ids        []string
	failVerify int
}

func (d *claimLog) Claim(ctx context.Context, req driver.ClaimRequest) (driver.Sandbox, error) {
	d.mu.Lock()
	d.ids = append(d.ids, req.ID)
	fail := strings.Contains(req.ID, "-verify-") && d.failVerify > 0
	if fail {
		d.failVerify--
	}
	d.mu.Unlock()
	if fail {
		return nil, errors.New("claimLog: a verification claim failed on purpose")
	}
	return d.Driver.Claim(ctx, req)
}

// verifyClaims returns the ids of the verification claims made so far.
func (d *claimLog) verifyClaims() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []string
	for _, id := range d.ids {
		if strings.Contains(id, "-verify-") {
			out = append(out, id)
		}
	}
	return out
}

// startClaimLogNode is startAgentNode with the driver noting its claims.
func startClaimLogNode(t *testing.T, imageDir string, failVerify int) (*cluster, *claimLog) {
	t.Helper()
	c, drv, _ := startClaimLogDaemon(t, imageDir, failVerify)
	return c, drv
}

// startClaimLogDaemon is startClaimLogNode returning the daemon too.
func startClaimLogDaemon(t *testing.T, imageDir string, failVerify int) (*cluster, *claimLog, *noded.Daemon) {
	t.Helper()
	var drv *claimLog
	c, d := startAgentNodeWith(t, imageDir, nil, nil, func(cfg *noded.Config) {
		drv = &claimLog{Driver: cfg.Driver.(*container.Driver), failVerify: failVerify}
		cfg.Driver = drv
	})
	return c, drv, d
}

// waitNoSandboxes waits until the node's driver holds no sandbox: the
// task's own went with its actor, and no verification sandbox is left.
func waitNoSandboxes(t *testing.T, drv *claimLog) {
	t.Helper()
	waitFor(t, "the node's sandboxes to be destroyed", 30*time.Second, func() bool { return len(drv.Sandboxes()) == 0 })
}

// testRuns returns the payloads of a task's test_run events.
func testRuns(t *testing.T, c *cluster, id string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, e := range c.events(id) {
		if e.GetKind() == "test_run" {
			var p map[string]any
			if err := json.Unmarshal(e.GetPayload(), &p); err != nil {
				t.Fatal(err)
			}
			out = append(out, p)
		}
	}
	return out
}

// The finish step's tests run in a fresh sandbox holding the repository
// at the base commit with only the model's diff, never in the model's
// own: a model that replaces the toolchain in its sandbox (a go that
// always exits 0) and finishes without fixing the bug gets the real
// failure back, and its PR comes only once the fix is in. Each
// verification sandbox is destroyed; a verification claim that fails is
// retried like any other infrastructure error. (Scripted provider.)
func TestFinishTestsRunInACleanSandbox(t *testing.T) {
	imageDir := needContainers(t)
	repo := buggyRepo(t)
	script := strings.Join([]string{
		`{"content":[{"type":"tool_use","name":"run_command","input":{"command":"cp /bin/true \"$(command -v go)\" && go test ./... && echo forged"}}]}`,
		`{"content":[{"type":"tool_use","name":"edit_file","input":{"path":"calc/calc.go","old_string":"// Add returns a plus b.","new_string":"// Add returns the sum of a and b."}}]}`,
		`{"content":[{"type":"tool_use","name":"finish","input":{"summary":"Add's comment is clearer; the tests pass."}}]}`,
		`{"content":[{"type":"tool_use","name":"edit_file","input":{"path":"calc/calc.go","old_string":"return a - b","new_string":"return a + b"}}]}`,
		`{"content":[{"type":"tool_use","name":"finish","input":{"summary":"Add adds now."}}]}`,
	}, "\n")
	c, drv := startClaimLogNode(t, imageDir, 1)
	id := createScripted(t, c, "agent-forge", repo, "", script)
	waitEnded(t, c, id)
	var kinds []string
	var forged, rejected, body string
	for _, e := range c.events(id) {
		kinds = append(kinds, e.GetKind())
		var p map[string]any
		_ = json.Unmarshal(e.GetPayload(), &p)
		switch e.GetKind() {
		case "tool_result":
			if out, _ := p["output"].(string); strings.Contains(out, "forged") {
				forged = out
			}
		case "finish_rejected":
			rejected = string(e.GetPayload())
		case "pull_request":
			body, _ = p["body"].(string)
		}
	}
	t.Logf("events: %s", strings.Join(kinds, ","))
	if forged == "" {
		t.Fatal("the model's sandbox was not forged: the test proves nothing")
	}
	runs := testRuns(t, c, id)
	if len(runs) != 2 {
		t.Fatalf("%d test runs, want 2: %v", len(runs), runs)
	}
	first, last := runs[0], runs[1]
	if first["passed"] != false || !strings.Contains(first["output"].(string), "FAIL") {
		t.Errorf("the first finish's tests passed: they ran in the model's forged sandbox: %v", first)
	}
	if last["passed"] != true {
		t.Errorf("the tests of the fix: %v", last)
	}
	for i, r := range runs {
		sb, _ := r["sandbox"].(string)
		if r["clean_sandbox"] != true || !strings.HasPrefix(sb, id+"-e") || !strings.HasSuffix(sb, fmt.Sprintf("-verify-%d", i)) {
			t.Errorf("test run %d does not name its clean sandbox: %v", i, r)
		}
	}
	if !strings.Contains(rejected, "FAIL") || !strings.Contains(rejected, "fresh sandbox") {
		t.Errorf("the refusal: %s", rejected)
	}
	if s := c.task(id).GetState(); s != warrenv1.TaskState_TASK_STATE_SUCCEEDED {
		t.Fatalf("the task ended %v", s)
	}
	if !strings.Contains(body, "passed in a clean sandbox") {
		t.Errorf("the pull request's body:\n%s", body)
	}
	// Round 0's first claim failed (on purpose) and was retried.
	if got := drv.verifyClaims(); len(got) != 3 || got[0] != got[1] || got[1] == got[2] {
		t.Errorf("verification claims: %v", got)
	}
	waitNoSandboxes(t, drv)
}

// A cancel while the tests run in the verification sandbox ends the task
// cancelled, and the verification sandbox does not outlive it. While the
// tests run, the node reports the task as holding a verification sandbox
// (its heartbeats' verifying, which placement counts), and no longer once
// the sandbox is gone.
func TestFinishCancelDuringTheTestsDestroysTheVerificationSandbox(t *testing.T) {
	imageDir := needContainers(t)
	repo := buggyRepo(t)
	script := strings.Join([]string{
		`{"content":[{"type":"tool_use","name":"edit_file","input":{"path":"calc/calc.go","old_string":"return a - b","new_string":"return a + b"}}]}`,
		`{"content":[{"type":"tool_use","name":"finish","input":{"summary":"Add adds now."}}]}`,
	}, "\n")
	c, drv, d := startClaimLogDaemon(t, imageDir, 0)
	ctx := context.Background()
	resp, err := c.cl.Tasks().CreateTask(ctx, connect.NewRequest(&warrenv1.CreateTaskRequest{
		RequestId: "agent-cancel-tests", Spec: &warrenv1.TaskSpec{Repo: repo, Base: "HEAD", IssueTitle: "Add is wrong",
			TestCommand: "touch /tmp/tests-started; sleep 600", Driver: "container", Model: "scripted", ModelScript: script}}))
	if err != nil {
		t.Fatal(err)
	}
	id := resp.Msg.GetTask().GetId()
	waitFor(t, "the tests to run in the verification sandbox", 3*time.Minute, func() bool {
		ids := drv.verifyClaims()
		if len(ids) == 0 {
			return false
		}
		sb, ok := drv.Get(ids[0])
		if !ok {
			return false
		}
		ia := sb.(driver.Interactive)
		var b strings.Builder
		_, err := ia.ReadFile(ctx, "/tmp/tests-started", 10, &b)
		return err == nil
	})
	if v := d.Verifying(); len(v) != 1 || v[0] != id {
		t.Errorf("while the tests run, the node reports %v verifying, want [%s]", v, id)
	}
	if _, err := c.cl.Tasks().CancelTask(ctx, connect.NewRequest(&warrenv1.CancelTaskRequest{TaskId: id, Reason: "test"})); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the task to be cancelled", time.Minute, func() bool {
		return c.task(id).GetState() == warrenv1.TaskState_TASK_STATE_CANCELLED
	})
	if runs := testRuns(t, c, id); len(runs) != 0 {
		t.Errorf("a cancelled test run was recorded: %v", runs)
	}
	waitNoSandboxes(t, drv)
	waitFor(t, "the node to stop reporting the task verifying", 10*time.Second, func() bool { return len(d.Verifying()) == 0 })
}

// The verification sandbox has the task's egress policy (no more network
// than the model had) and its attempts reach the task's log as egress
// events naming it, before the test_run. The sandboxes are real
// containers on the node's egress policy (netpolicytest).
func TestFinishTestsEgressIsAudited(t *testing.T) {
	c, _ := startEgressNode(t, "warren-test-verify-egress", nil)
	repo := buggyRepo(t)
	script := strings.Join([]string{
		`{"content":[{"type":"tool_use","name":"edit_file","input":{"path":"calc/calc.go","old_string":"return a - b","new_string":"return a + b"}}]}`,
		`{"content":[{"type":"tool_use","name":"finish","input":{"summary":"Add adds now."}}]}`,
	}, "\n")
	probe := `python3 -c '
import socket
for target in (("allowed.test", 80), ("198.51.100.20", 80)):
    try:
        socket.create_connection(target, timeout=3).close(); print(target[0], "ok")
    except Exception as e:
        print(target[0], type(e).__name__)
' && go test ./...`
	resp, err := c.cl.Tasks().CreateTask(context.Background(), connect.NewRequest(&warrenv1.CreateTaskRequest{
		RequestId: "agent-verify-egress", Spec: &warrenv1.TaskSpec{Repo: repo, Base: "HEAD", IssueTitle: "Add is wrong",
			TestCommand: probe, Driver: "container", Model: "scripted", ModelScript: script}}))
	if err != nil {
		t.Fatal(err)
	}
	id := resp.Msg.GetTask().GetId()
	waitEnded(t, c, id)
	var verifySB string
	var allowed, denied, beforeRun bool
	for _, e := range c.events(id) {
		switch e.GetKind() {
		case "test_run":
			var p struct {
				Sandbox string
				Output  string
			}
			_ = json.Unmarshal(e.GetPayload(), &p)
			t.Logf("test run in %s: %s", p.Sandbox, p.Output)
			verifySB = p.Sandbox
			beforeRun = allowed && denied
		case "egress":
			if sb, a, d := webAttempts(t, e); strings.Contains(sb, "-verify-") {
				allowed, denied = allowed || a, denied || d
			}
		}
	}
	if s := c.task(id).GetState(); s != warrenv1.TaskState_TASK_STATE_SUCCEEDED {
		t.Fatalf("the task ended %v", s)
	}
	if !strings.HasSuffix(verifySB, "-verify-0") {
		t.Fatalf("the test run's sandbox: %q", verifySB)
	}
	if !beforeRun {
		t.Fatalf("the verification sandbox's egress events before its test_run: allowed %v, denied %v; want both", allowed, denied)
	}
}

// An actor that restarts under the same lease after its round's test_run
// landed (here a panic right after it; a node restarted within its TTL
// is the same) goes by the run on the log: it does not run the tests a
// second time, whose result (a flaky test) could differ from the one the
// log shows.
func TestFinishTestsRunOnceAcrossAnActorRestart(t *testing.T) {
	imageDir := needContainers(t)
	repo := buggyRepo(t)
	script := strings.Join([]string{
		`{"content":[{"type":"tool_use","name":"edit_file","input":{"path":"calc/calc.go","old_string":"return a - b","new_string":"return a + b"}}]}`,
		`{"content":[{"type":"tool_use","name":"finish","input":{"summary":"Add adds now."}}]}`,
	}, "\n")
	var drv *claimLog
	var panicked atomic.Bool
	c, _ := startAgentNodeWith(t, imageDir, nil, nil, func(cfg *noded.Config) {
		drv = &claimLog{Driver: cfg.Driver.(*container.Driver)}
		cfg.Driver = drv
		cfg.AfterRecord = func(key string) {
			if key == "finish/test-0" && panicked.CompareAndSwap(false, true) {
				panic("test: the task's actor restarts after its test_run landed")
			}
		}
	})
	id := createScripted(t, c, "agent-tests-restart", repo, "", script)
	waitEnded(t, c, id)
	if !panicked.Load() {
		t.Fatal("the actor never reached its test_run: the test proves nothing")
	}
	if s := c.task(id).GetState(); s != warrenv1.TaskState_TASK_STATE_SUCCEEDED {
		t.Fatalf("the task ended %v", s)
	}
	if runs := testRuns(t, c, id); len(runs) != 1 || runs[0]["passed"] != true {
		t.Errorf("test runs: %v", runs)
	}
	if got := drv.verifyClaims(); len(got) != 1 {
		t.Errorf("verification claims (the tests ran again after the restart?): %v", got)
	}
	waitNoSandboxes(t, drv)
}

// A finish whose summary holds a credential is refused before anything
// is pushed (the summary goes into the commit message and the pull
// request, which no diff check sees), and the model's next finish,
// without it, opens the pull request. (Scripted provider.)
func TestFinishWithACredentialInItsSummaryIsRefused(t *testing.T) {
	imageDir := needContainers(t)
	repo := buggyRepo(t)
	const key = "AKIAQYLPMN5HHHFPZAM2"
	script := strings.Join([]string{
		`{"content":[{"type":"tool_use","name":"edit_file","input":{"path":"calc/calc.go","old_string":"return a - b","new_string":"return a + b"}}]}`,
		`{"content":[{"type":"tool_use","name":"finish","input":{"summary":"Add adds now. Deployed with key ` + key + ` to staging."}}]}`,
		`{"content":[{"type":"tool_use","name":"finish","input":{"summary":"Add adds now."}}]}`,
	}, "\n")
	c, _ := startClaimLogNode(t, imageDir, 0)
	id := createScripted(t, c, "agent-finish-secret", repo, "", script)
	waitEnded(t, c, id)
	var rejected, body string
	for _, e := range c.events(id) {
		var p map[string]any
		_ = json.Unmarshal(e.GetPayload(), &p)
		switch e.GetKind() {
		case "finish_rejected":
			rejected = string(e.GetPayload())
		case "pull_request":
			body, _ = p["body"].(string)
		}
	}
	if !strings.Contains(rejected, "credential") || strings.Contains(rejected, key) {
		t.Errorf("the refusal: %s; want one saying a credential, without it", rejected)
	}
	if s := c.task(id).GetState(); s != warrenv1.TaskState_TASK_STATE_SUCCEEDED {
		t.Fatalf("the task ended %v", s)
	}
	if strings.Contains(body, key) || !strings.Contains(body, "Add adds now.") {
		t.Errorf("the pull request's body:\n%s", body)
	}
	if runs := testRuns(t, c, id); len(runs) != 1 {
		t.Errorf("%d test runs, want 1 (none for the refused finish)", len(runs))
	}
}
