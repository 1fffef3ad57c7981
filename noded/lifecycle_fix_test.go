package noded_test

import (
	"context"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
	"github.com/warrenhq/warren/noded"
	"github.com/warrenhq/warren/noded/driver"
	"github.com/warrenhq/warren/noded/driver/container"
	"github.com/warrenhq/warren/noded/driver/sim"
)

// Tests of a task's lifecycle on its node: its sandbox's claim and
// lifetime, a cancel during the claim, a decision while the node is down,
// a message sent before the task started.

// logSoFar lists a task's events without waiting for it to end.
func logSoFar(t *testing.T, c *cluster, id string) []*warrenv1.Event {
	t.Helper()
	resp, err := c.cl.Tasks().ListEvents(context.Background(), connect.NewRequest(&warrenv1.ListEventsRequest{TaskId: id, Limit: 1000}))
	if err != nil {
		t.Fatal(err)
	}
	return resp.Msg.GetEvents()
}

// missingTemplateDriver is the sim driver whose claims are refused for
// good, as the container and microvm drivers refuse a template they do
// not have (driver.ErrNotFound).
type missingTemplateDriver struct {
	*sim.Driver
	mu     sync.Mutex
	claims int
}

func (d *missingTemplateDriver) Claim(_ context.Context, req driver.ClaimRequest) (driver.Sandbox, error) {
	d.mu.Lock()
	d.claims++
	d.mu.Unlock()
	return nil, driver.Errorf(driver.ErrNotFound, "template %q: not in the node's templates (have: [])", req.Template)
}

// A task whose sandbox can never be claimed (its template is not on the
// node) fails, saying why. (The actor retried the claim every 500 ms for
// good, the task placed on the node with nothing on its log.)
func TestClaimOfMissingTemplateFailsTheTask(t *testing.T) {
	c := startCluster(t, 1, 0)
	drv := &missingTemplateDriver{Driver: sim.New(sim.Config{})}
	a := c.startNodeWith("a", drv)
	ids := c.submit(1, &warrenv1.Script{Steps: 1, StepMillis: 10})
	waitFor(t, "the task to fail", 15*time.Second, func() bool {
		return c.task(ids[0]).GetState() == warrenv1.TaskState_TASK_STATE_FAILED
	})
	evs := c.events(ids[0])
	last := string(evs[len(evs)-1].GetPayload())
	if !strings.Contains(last, "claim sandbox: ") || !strings.Contains(last, "not in the node's templates") {
		t.Fatalf("the task's last event does not say why: %s", last)
	}
	waitFor(t, "the node to let go", 10*time.Second, func() bool { return a.Running() == 0 })
	drv.mu.Lock()
	defer drv.mu.Unlock()
	if drv.claims > 5 {
		t.Errorf("%d claims of a missing template before the task failed", drv.claims)
	}
}

// expiringDriver is the sim driver whose sandboxes go away under their
// task, as one does when its TTL ends: the first `expire` sandboxes fail
// every Exec after their first `after` with driver.ErrNotFound, as the
// container and microvm drivers' destroyed sandboxes do. It records the
// TTL of each claim.
type expiringDriver struct {
	*sim.Driver
	after, expire int

	mu     sync.Mutex
	claims int
	ttls   []time.Duration
}

func (d *expiringDriver) Claim(ctx context.Context, req driver.ClaimRequest) (driver.Sandbox, error) {
	sb, err := d.Driver.Claim(ctx, req)
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.claims++
	d.ttls = append(d.ttls, req.TTL)
	return &expiringSandbox{Sandbox: sb, left: d.after, expires: d.claims <= d.expire}, nil
}

func (d *expiringDriver) stats() (int, []time.Duration) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.claims, append([]time.Duration(nil), d.ttls...)
}

type expiringSandbox struct {
	driver.Sandbox
	mu      sync.Mutex
	left    int
	expires bool
}

func (s *expiringSandbox) Exec(ctx context.Context, req driver.ExecRequest) (driver.ExecResult, error) {
	s.mu.Lock()
	gone := s.expires && s.left <= 0
	s.left--
	s.mu.Unlock()
	if gone {
		return driver.ExecResult{}, driver.Errorf(driver.ErrNotFound, "sandbox %s is destroyed", s.ID())
	}
	return s.Sandbox.Exec(ctx, req)
}

// A task's sandbox is claimed for the task's whole run: with a TTL (the
// drivers' maximum, for a task without a wall-clock budget), not the
// driver's default of an hour.
func TestTaskSandboxIsClaimedWithATTL(t *testing.T) {
	c := startCluster(t, 1, 0)
	drv := &expiringDriver{Driver: sim.New(sim.Config{})}
	c.startNodeWith("a", drv)
	ids := c.submit(1, &warrenv1.Script{Steps: 2, StepMillis: 10})
	waitFor(t, "task to succeed", 30*time.Second, c.allEnded(ids))
	checkLog(t, ids[0], c.events(ids[0]), 2)
	if _, ttls := drv.stats(); len(ttls) != 1 || ttls[0] != 24*time.Hour {
		t.Fatalf("claims' TTLs %v, want one of 24h", ttls)
	}
}

// A sandbox that goes away under its task (its TTL ended) is replaced:
// the task resumes in a new one from its log, and succeeds. (Every Exec
// failed on the dead sandbox, and the actor retried for good.)
func TestSandboxGoneUnderItsTaskIsReplaced(t *testing.T) {
	c := startCluster(t, 1, 0)
	drv := &expiringDriver{Driver: sim.New(sim.Config{}), after: 2, expire: 1}
	c.startNodeWith("a", drv)
	ids := c.submit(1, &warrenv1.Script{Steps: 4, StepMillis: 10})
	waitFor(t, "task to end", 30*time.Second, func() bool { return isEnded(c.task(ids[0]).GetState()) })
	evs := c.events(ids[0])
	if s := c.task(ids[0]).GetState(); s != warrenv1.TaskState_TASK_STATE_SUCCEEDED {
		t.Fatalf("the task ended %s: %s", s, evs[len(evs)-1].GetPayload())
	}
	checkLog(t, ids[0], evs, 4)
	if claims, _ := drv.stats(); claims != 2 {
		t.Fatalf("%d claims, want 2: the first sandbox and its replacement", claims)
	}
}

// A task whose sandboxes keep going away fails, saying so, instead of
// claiming new ones for good.
func TestSandboxThatKeepsGoingFailsTheTask(t *testing.T) {
	c := startCluster(t, 1, 0)
	drv := &expiringDriver{Driver: sim.New(sim.Config{}), after: 0, expire: 1 << 30}
	a := c.startNodeWith("a", drv)
	ids := c.submit(1, &warrenv1.Script{Steps: 2, StepMillis: 10})
	waitFor(t, "task to end", 30*time.Second, func() bool { return isEnded(c.task(ids[0]).GetState()) })
	if s := c.task(ids[0]).GetState(); s != warrenv1.TaskState_TASK_STATE_FAILED {
		t.Fatalf("the task ended %s", s)
	}
	evs := c.events(ids[0])
	if last := string(evs[len(evs)-1].GetPayload()); !strings.Contains(last, "sandbox gone: ") {
		t.Fatalf("the task's last event does not say why: %s", last)
	}
	waitFor(t, "the node to let go", 10*time.Second, func() bool { return a.Running() == 0 && drv.Live() == 0 })
	if claims, _ := drv.stats(); claims != 4 {
		t.Errorf("%d claims, want 4: the first sandbox and three replacements", claims)
	}
}

// A task that runs longer than the driver's default TTL (here 3 s; its
// six steps take about 6 s) keeps its sandbox: it is claimed with the
// task's own TTL. (The container driver destroyed it at 3 s, and the
// actor retried the failing Exec for good.)
func TestTaskOutlivesTheDriversDefaultTTL(t *testing.T) {
	imageDir := needContainers(t)
	drv, err := container.New(container.Config{ImageDir: imageDir, StateDir: t.TempDir(), Namespace: "warren-lifecycle",
		Agent: buildGuest(t), DefaultTTL: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	c := startCluster(t, 1, 0)
	d, err := noded.Start(noded.Config{ID: "n1", DataDir: filepath.Join(c.dir, "node-n1"), Servers: c.urls(), Driver: drv,
		Capacity: &warrenv1.Resources{MilliCpu: 100 * 1000, MemoryBytes: 1 << 40}})
	if err != nil {
		drv.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	waitFor(t, "node ready", 10*time.Second, func() bool {
		n, err := c.node("n1")
		return err == nil && n.GetStatus() == warrenv1.NodeStatus_NODE_STATUS_READY
	})
	resp, err := c.cl.Tasks().CreateTask(context.Background(), connect.NewRequest(&warrenv1.CreateTaskRequest{
		RequestId: "long", Spec: &warrenv1.TaskSpec{Repo: "https://example.com/r.git", Base: "main", IssueTitle: "long task",
			Driver: "container", Script: &warrenv1.Script{Steps: 6, Command: "sleep 1"}}}))
	if err != nil {
		t.Fatal(err)
	}
	id := resp.Msg.GetTask().GetId()
	waitFor(t, "the task to end", 45*time.Second, func() bool { return isEnded(c.task(id).GetState()) })
	if s := c.task(id).GetState(); s != warrenv1.TaskState_TASK_STATE_SUCCEEDED {
		evs := logSoFar(t, c, id)
		t.Fatalf("the task ended %s: %s", s, evs[len(evs)-1].GetPayload())
	}
}

func isEnded(s warrenv1.TaskState) bool {
	return s == warrenv1.TaskState_TASK_STATE_SUCCEEDED || s == warrenv1.TaskState_TASK_STATE_FAILED ||
		s == warrenv1.TaskState_TASK_STATE_CANCELLED
}

// A message sent with SendMessage before the task's actor starts (the
// task pending: its only node is cordoned) reaches the model with the
// task's context, in its first request. (A fresh start set the steering
// mark past it: it was on the log, and the model never saw it.)
func TestMessageSentBeforeStartReachesTheModel(t *testing.T) {
	imageDir := needContainers(t)
	repo := buggyRepo(t)
	turns := []string{
		`[{"type":"tool_use","id":"toolu_1","name":"finish","input":{"summary":"nothing to do"}}]`,
	}
	var mu sync.Mutex
	var bodies []string
	fake := fakeAnthropic(t, turns, func(fc fakeCall) {
		mu.Lock()
		bodies = append(bodies, string(fc.Body))
		mu.Unlock()
	})
	c := startAgentNode(t, imageDir, &noded.Models{AnthropicKey: "k", AnthropicURL: fake.URL}, nil)
	ctx := context.Background()
	if _, err := c.cl.Cluster().CordonNode(ctx, connect.NewRequest(&warrenv1.NodeRequest{Id: "n1"})); err != nil {
		t.Fatal(err)
	}
	resp, err := c.cl.Tasks().CreateTask(ctx, connect.NewRequest(&warrenv1.CreateTaskRequest{
		RequestId: "steer-early", Spec: &warrenv1.TaskSpec{Repo: repo, Base: "HEAD", IssueTitle: "Add is wrong", Driver: "container", Model: "claude-test"}}))
	if err != nil {
		t.Fatal(err)
	}
	id := resp.Msg.GetTask().GetId()
	const msg = "the bug is in calc/calc.go, line 4"
	if _, err := c.cl.Tasks().SendMessage(ctx, connect.NewRequest(&warrenv1.SendMessageRequest{TaskId: id, Text: msg})); err != nil {
		t.Fatal(err)
	}
	if _, err := c.cl.Cluster().UncordonNode(ctx, connect.NewRequest(&warrenv1.NodeRequest{Id: "n1"})); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the first model call", 2*time.Minute, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(bodies) > 0
	})
	mu.Lock()
	first := bodies[0]
	mu.Unlock()
	if !strings.Contains(first, msg) {
		t.Fatalf("the user's message sent before the task started is not in the model's first request")
	}
}

// heldClaim holds each claim until release is closed, then claims from
// the real driver.
type heldClaim struct {
	driver.Driver
	claiming chan struct{}
	release  chan struct{}
	once     sync.Once
}

func (b *heldClaim) Claim(ctx context.Context, req driver.ClaimRequest) (driver.Sandbox, error) {
	b.once.Do(func() { close(b.claiming) })
	select {
	case <-b.release:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return b.Driver.Claim(ctx, req)
}

// A task cancelled while its sandbox is claimed ends cancelled. Here its
// repository cannot be cloned: the actor learnt of the cancel from its
// "running" append but went on to check the repository out, and recorded
// the checkout's failure as the task's end.
func TestCancelDuringClaimEndsCancelled(t *testing.T) {
	imageDir := needContainers(t)
	inner, err := container.New(container.Config{ImageDir: imageDir, StateDir: t.TempDir(), Namespace: "warren-lifecycle", Agent: buildGuest(t)})
	if err != nil {
		t.Fatal(err)
	}
	drv := &heldClaim{Driver: inner, claiming: make(chan struct{}), release: make(chan struct{})}
	c := startCluster(t, 1, 0)
	d, err := noded.Start(noded.Config{ID: "n1", DataDir: filepath.Join(c.dir, "node-n1"), Servers: c.urls(), Driver: drv,
		Capacity: &warrenv1.Resources{MilliCpu: 100 * 1000, MemoryBytes: 1 << 40}, Models: &noded.Models{AnthropicKey: "k", AnthropicURL: "http://127.0.0.1:1"}})
	if err != nil {
		inner.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	waitFor(t, "node ready", 10*time.Second, func() bool {
		n, err := c.node("n1")
		return err == nil && n.GetStatus() == warrenv1.NodeStatus_NODE_STATUS_READY
	})
	ctx := context.Background()
	resp, err := c.cl.Tasks().CreateTask(ctx, connect.NewRequest(&warrenv1.CreateTaskRequest{
		RequestId: "cancel-claim", Spec: &warrenv1.TaskSpec{Repo: filepath.Join(t.TempDir(), "no-such-repo"), Base: "HEAD",
			IssueTitle: "x", Driver: "container", Model: "claude-test"}}))
	if err != nil {
		t.Fatal(err)
	}
	id := resp.Msg.GetTask().GetId()
	select {
	case <-drv.claiming:
	case <-time.After(30 * time.Second):
		t.Fatal("no claim")
	}
	if _, err := c.cl.Tasks().CancelTask(ctx, connect.NewRequest(&warrenv1.CancelTaskRequest{TaskId: id, Reason: "test"})); err != nil {
		t.Fatal(err)
	}
	close(drv.release)
	waitFor(t, "the task to end", time.Minute, func() bool { return isEnded(c.task(id).GetState()) })
	if s := c.task(id).GetState(); s != warrenv1.TaskState_TASK_STATE_CANCELLED {
		evs := c.events(id)
		t.Fatalf("cancelled during its claim, the task ended %s: %s", s, evs[len(evs)-1].GetPayload())
	}
}

// restartableNode returns a function that starts node n1 of c with models
// on a new container driver (namespace ns, guest agent guestBin), closed
// at the test's end. Each call starts it over the same data directory, so
// a call after closing the last one restarts the node.
func restartableNode(t *testing.T, c *cluster, imageDir, guestBin, ns string, models *noded.Models) func() *noded.Daemon {
	return func() *noded.Daemon {
		drv, err := container.New(container.Config{ImageDir: imageDir, StateDir: t.TempDir(), Namespace: ns, Agent: guestBin})
		if err != nil {
			t.Fatal(err)
		}
		d, err := noded.Start(noded.Config{ID: "n1", DataDir: filepath.Join(c.dir, "node-n1"), Servers: c.urls(), Driver: drv,
			Capacity: &warrenv1.Resources{MilliCpu: 100 * 1000, MemoryBytes: 1 << 40}, Models: models})
		if err != nil {
			drv.Close()
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Close() })
		return d
	}
}

// An agent task waits for an approval; its node restarts within its TTL
// (the lease stays, same epoch) and the call is approved while it is
// down. The restarted actor records that the task runs again, runs the
// approved call and goes on: the next wait (the push's approval: the diff
// edits CI) is recorded, and once approved the task succeeds. (The task
// stayed waiting_approval, the next wait was refused, waiting_approval ->
// waiting_approval, and the actor stopped with nothing running the task.)
func TestApprovalDecidedWhileTheNodeRestartsResumes(t *testing.T) {
	imageDir := needContainers(t)
	repo := buggyRepo(t)
	turns := []string{
		`[{"type":"tool_use","id":"toolu_1","name":"write_file","input":{"path":".github/workflows/test.yml","content":"on: push\njobs:\n  t:\n    steps:\n      - run: go test ./...\n"}}]`,
		`[{"type":"tool_use","id":"toolu_2","name":"finish","input":{"summary":"CI runs the tests."}}]`,
	}
	fake := fakeAnthropic(t, turns, nil)
	guestBin := buildGuest(t)
	c := startCluster(t, 1, 30*time.Second) // the restart stays well within the node's TTL
	start := restartableNode(t, c, imageDir, guestBin, "warren-lifecycle", &noded.Models{AnthropicKey: "k", AnthropicURL: fake.URL})
	d1 := start()
	waitFor(t, "node ready", 10*time.Second, func() bool {
		n, err := c.node("n1")
		return err == nil && n.GetStatus() == warrenv1.NodeStatus_NODE_STATUS_READY
	})
	ctx := context.Background()
	resp, err := c.cl.Tasks().CreateTask(ctx, connect.NewRequest(&warrenv1.CreateTaskRequest{
		RequestId: "approval-restart", Spec: &warrenv1.TaskSpec{Repo: repo, Base: "HEAD", IssueTitle: "Add a CI workflow",
			Driver: "container", Model: "claude-test"}}))
	if err != nil {
		t.Fatal(err)
	}
	id := resp.Msg.GetTask().GetId()
	pending := func(prefix string) func() bool {
		return func() bool {
			tk := c.task(id)
			p := tk.GetPendingApprovals()
			return tk.GetState() == warrenv1.TaskState_TASK_STATE_WAITING_APPROVAL && len(p) == 1 && strings.HasPrefix(p[0], prefix)
		}
	}
	waitFor(t, "the approval request", 2*time.Minute, pending("toolu_1"))
	d1.Close()
	if _, err := c.cl.Tasks().Approve(ctx, connect.NewRequest(&warrenv1.DecideRequest{TaskId: id, ToolCallId: "toolu_1"})); err != nil {
		t.Fatal(err)
	}
	start()
	var pushID string
	waitFor(t, "the push's approval request", 2*time.Minute, func() bool {
		if pending("push-")() {
			pushID = c.task(id).GetPendingApprovals()[0]
			return true
		}
		return isEnded(c.task(id).GetState())
	})
	if pushID == "" {
		evs := logSoFar(t, c, id)
		t.Fatalf("the task ended %s before its push's approval: %s", c.task(id).GetState(), evs[len(evs)-1].GetPayload())
	}
	if _, err := c.cl.Tasks().Approve(ctx, connect.NewRequest(&warrenv1.DecideRequest{TaskId: id, ToolCallId: pushID})); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the task to end", time.Minute, func() bool { return isEnded(c.task(id).GetState()) })
	if s := c.task(id).GetState(); s != warrenv1.TaskState_TASK_STATE_SUCCEEDED {
		evs := logSoFar(t, c, id)
		t.Fatalf("the task ended %s: %s", s, evs[len(evs)-1].GetPayload())
	}
	var resumed bool
	for _, e := range logSoFar(t, c, id) {
		resumed = resumed || (e.GetKind() == "state_changed" && strings.Contains(string(e.GetPayload()), `"resumed":true`))
	}
	if !resumed {
		t.Errorf("no state_changed to running with resumed:true on the log")
	}
}
