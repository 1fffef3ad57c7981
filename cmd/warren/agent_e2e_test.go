package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
	"github.com/warrenhq/warren/client"
	"github.com/warrenhq/warren/internal/freeaddr"
	"github.com/warrenhq/warren/noded/agenttest"
	"github.com/warrenhq/warren/noded/driver/container"
)

// killTurns is the trajectory every task of TestAgentNodeKill plays: read,
// edit, a slow command that changes the workspace, a CI edit that needs
// approval, finish.
var killTurns = []string{
	`[{"type":"tool_use","id":"toolu_1","name":"read_file","input":{"path":"calc/calc.go"}}]`,
	`[{"type":"tool_use","id":"toolu_2","name":"edit_file","input":{"path":"calc/calc.go","old_string":"return a - b","new_string":"return a + b"}}]`,
	`[{"type":"tool_use","id":"toolu_3","name":"run_command","input":{"command":"echo run >> notes.txt; sleep 8; go test ./... 2>&1","timeout_seconds":600}}]`,
	`[{"type":"tool_use","id":"toolu_4","name":"write_file","input":{"path":".github/workflows/test.yml","content":"on: push\njobs:\n  t:\n    steps:\n      - run: go test ./...\n"}}]`,
	`[{"type":"tool_use","id":"toolu_5","name":"finish","input":{"summary":"Add adds; CI runs the tests."}}]`,
}

// fakeModel is a FAKE Anthropic Messages API on loopback, not a model. It
// plays killTurns for every task: it tells tasks apart by a marker (their
// issue title) in the request and finds the turn from the number of
// assistant messages already in it. It counts requests per task and turn;
// hold, if set, runs before an answer and may block it.
type fakeModel struct {
	srv    *httptest.Server
	mu     sync.Mutex
	counts map[string][]int
	hold   func(marker string, turn, n int)
}

func newFakeModel(t *testing.T, markers []string) *fakeModel {
	f := &fakeModel{counts: map[string][]int{}}
	for _, m := range markers {
		f.counts[m] = make([]int, len(killTurns))
	}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		var req struct {
			Messages []struct{ Role string } `json:"messages"`
		}
		if err := json.Unmarshal(b, &req); err != nil {
			http.Error(w, `{"type":"error","error":{"type":"invalid_request_error","message":"bad json"}}`, 400)
			return
		}
		turn := 0
		for _, m := range req.Messages {
			if m.Role == "assistant" {
				turn++
			}
		}
		marker := ""
		for _, m := range markers {
			if strings.Contains(string(b), m) {
				marker = m
			}
		}
		if marker == "" || turn >= len(killTurns) {
			http.Error(w, `{"type":"error","error":{"type":"invalid_request_error","message":"no such turn"}}`, 400)
			return
		}
		f.mu.Lock()
		f.counts[marker][turn]++
		n := f.counts[marker][turn]
		hold := f.hold
		f.mu.Unlock()
		if hold != nil {
			hold(marker, turn, n)
		}
		w.Header().Set("content-type", "application/json")
		fmt.Fprintf(w, `{"id":"msg_%s_%d","type":"message","role":"assistant","model":"claude-test","content":%s,"stop_reason":"tool_use","usage":{"input_tokens":100,"output_tokens":20}}`,
			marker, turn, killTurns[turn])
	}))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeModel) countsOf(marker string) []int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]int(nil), f.counts[marker]...)
}

// TestAgentNodeKill is the agent loop issue's third acceptance test. Agent
// tasks run on `warren node --driver container` processes (real
// containers), with a FAKE Anthropic server on loopback as the model. Each
// task's node is SIGKILLed at one kind of step:
//   - during a model call (the server holds the answer);
//   - between a model call and its tool call (the node kills itself right
//     after the model_call lands: WARREN_TEST_CRASH_AFTER);
//   - during a workspace-changing command (it appends to a file, then
//     sleeps);
//   - while the task waits for approval.
//
// Each task completes on the surviving node with the same final diff as a
// task that ran without a kill, and the fake server was never asked again
// for a response that was recorded.
func TestAgentNodeKill(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process run with containers; skipped with -short")
	}
	imageDir := agenttest.NeedContainers(t)
	repo := agenttest.BuggyRepo(t)
	const (
		base    = "no-kill-baseline"
		inCall  = "kill-during-model-call"
		afterMC = "kill-after-model-call"
		inCmd   = "kill-during-command"
		inWait  = "kill-while-waiting"
	)
	markers := []string{base, inCall, afterMC, inCmd, inWait}
	fake := newFakeModel(t, markers)
	held, release := make(chan struct{}), make(chan struct{})
	var holdOnce sync.Once
	fake.hold = func(marker string, turn, n int) {
		if marker == inCall && turn == 2 && n == 1 {
			holdOnce.Do(func() { close(held) })
			select {
			case <-release:
			case <-time.After(2 * time.Minute):
			}
		}
	}

	af := newAgentFleet(t, imageDir, "ANTHROPIC_API_KEY=test-key", "ANTHROPIC_BASE_URL="+fake.srv.URL)
	cl, ctx, nodeOf, ready := af.cl, context.Background(), af.nodeOf, af.ready
	startNode := func(id, labels string, env ...string) *proc { return af.startNode(id, labels, nil, env...) }
	// The survivor serves every kill scenario's selector; it is cordoned
	// until each task is placed on its own victim.
	survivor := startNode("survivor", "k1=y,k2=y,k3=y,k4=y")
	ready("survivor")
	if _, err := cl.Cluster().CordonNode(ctx, connect.NewRequest(&warrenv1.NodeRequest{Id: "survivor"})); err != nil {
		t.Fatal(err)
	}
	victims := map[string]*proc{
		base:    startNode("v0", "k0=y"),
		inCall:  startNode("v1", "k1=y"),
		afterMC: startNode("v2", "k2=y", "WARREN_TEST_CRASH_AFTER=agent/step-3/model"),
		inCmd:   startNode("v3", "k3=y"),
		inWait:  startNode("v4", "k4=y"),
	}
	ready("v0", "v1", "v2", "v3", "v4")
	ids := map[string]string{}
	for i, m := range markers {
		resp, err := cl.Tasks().CreateTask(ctx, connect.NewRequest(&warrenv1.CreateTaskRequest{RequestId: m, Spec: &warrenv1.TaskSpec{
			Repo: repo, Base: "HEAD", IssueTitle: m, IssueBody: "Add is wrong.", Driver: "container", Model: "claude-test",
			NodeSelector: map[string]string{fmt.Sprintf("k%d", i): "y"}}}))
		if err != nil {
			t.Fatal(err)
		}
		ids[m] = resp.Msg.GetTask().GetId()
	}
	get := func(m string) *warrenv1.Task { return af.task(ids[m]) }
	waitUntil(t, "every task placed on its victim", 2*time.Minute, func() bool {
		for _, m := range markers {
			if get(m).GetLease().GetNode() != victims[m].id {
				return false
			}
		}
		return true
	})
	if _, err := cl.Cluster().UncordonNode(ctx, connect.NewRequest(&warrenv1.NodeRequest{Id: "survivor"})); err != nil {
		t.Fatal(err)
	}
	listEvents := func(m string) []*warrenv1.Event { return af.events(ids[m]) }
	has := func(m, kind, callID string) bool {
		for _, e := range listEvents(m) {
			if e.GetKind() == kind && strings.Contains(string(e.GetPayload()), `"tool_call_id":"`+callID+`"`) {
				return true
			}
		}
		return false
	}
	kill := func(m string) {
		v := victims[m]
		v.kill()
		t.Logf("%s: killed %s", m, v.id)
	}

	// The kills, each at its point; then every task is approved when it
	// asks, and runs to its end.
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	run := func(what string, f func() error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f(); err != nil {
				errs <- fmt.Errorf("%s: %w", what, err)
			}
		}()
	}
	until := func(what string, d time.Duration, cond func() bool) error {
		deadline := time.Now().Add(d)
		for !cond() {
			if time.Now().After(deadline) {
				return fmt.Errorf("timed out after %v waiting for %s", d, what)
			}
			time.Sleep(100 * time.Millisecond)
		}
		return nil
	}
	parked := make(chan struct{})
	run(inCall, func() error {
		select {
		case <-held:
		case <-time.After(4 * time.Minute):
			return fmt.Errorf("the third model call never came")
		}
		kill(inCall)
		close(release)
		return nil
	})
	run(afterMC, func() error {
		// The node kills itself; reap the process once it is gone.
		if err := until("the victim to die", 4*time.Minute, func() bool {
			return nodeOf("v2").GetStatus() == warrenv1.NodeStatus_NODE_STATUS_DOWN
		}); err != nil {
			return err
		}
		kill(afterMC)
		return nil
	})
	run(inCmd, func() error {
		if err := until("the slow command to start", 4*time.Minute, func() bool { return has(inCmd, "tool_call", "toolu_3") }); err != nil {
			return err
		}
		time.Sleep(2 * time.Second) // well inside its sleep
		if has(inCmd, "tool_result", "toolu_3") {
			return fmt.Errorf("the command ended before the kill")
		}
		kill(inCmd)
		return nil
	})
	run(inWait, func() error {
		if err := until("the approval request", 4*time.Minute, func() bool {
			return get(inWait).GetState() == warrenv1.TaskState_TASK_STATE_WAITING_APPROVAL
		}); err != nil {
			return err
		}
		kill(inWait)
		defer close(parked)
		return until("the task to park", time.Minute, func() bool { return get(inWait).GetParked() })
	})
	for _, m := range markers {
		run(m+" approval", func() error {
			return until("the task to end", 8*time.Minute, func() bool {
				tk := get(m)
				if m == inWait {
					select {
					case <-parked: // approved only once its node is dead and it parked
					default:
						return false
					}
				}
				if tk.GetState() == warrenv1.TaskState_TASK_STATE_WAITING_APPROVAL && len(tk.GetPendingApprovals()) > 0 {
					_, _ = cl.Tasks().Approve(ctx, connect.NewRequest(&warrenv1.DecideRequest{TaskId: ids[m], ToolCallId: tk.GetPendingApprovals()[0]}))
				}
				s := tk.GetState()
				return s == warrenv1.TaskState_TASK_STATE_SUCCEEDED || s == warrenv1.TaskState_TASK_STATE_FAILED || s == warrenv1.TaskState_TASK_STATE_CANCELLED
			})
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if t.Failed() {
		t.FailNow()
	}

	// Every task succeeded with the baseline's diff, the killed ones on
	// the survivor; no recorded response was asked for twice.
	final := map[string]string{}
	for _, m := range markers {
		var kinds []string
		var patch, ranOn string
		modelCalls := 0
		for _, e := range listEvents(m) {
			kinds = append(kinds, e.GetKind())
			var p map[string]any
			_ = json.Unmarshal(e.GetPayload(), &p)
			switch e.GetKind() {
			case "checkpoint":
				patch, _ = p["patch"].(string)
			case "state_changed":
				if p["to"] == "running" && p["node"] != nil {
					ranOn, _ = p["node"].(string)
				}
			case "model_call":
				modelCalls++
			}
		}
		t.Logf("%s: %s", m, strings.Join(kinds, ","))
		if s := get(m).GetState(); s != warrenv1.TaskState_TASK_STATE_SUCCEEDED {
			t.Errorf("%s ended %v", m, s)
		}
		want := victims[m].id
		if m != base {
			want = survivor.id
		}
		if ranOn != want {
			t.Errorf("%s last ran on %q, want %s", m, ranOn, want)
		}
		if modelCalls != len(killTurns) {
			t.Errorf("%s recorded %d model calls for %d turns", m, modelCalls, len(killTurns))
		}
		final[m] = patch
		counts := fake.countsOf(m)
		for turn, n := range counts {
			want := 1
			if m == inCall && turn == 2 {
				want = 2 // its first answer was never recorded: the node died waiting for it
			}
			if n != want {
				t.Errorf("%s: the model was asked for turn %d %d times, want %d (all: %v)", m, turn, n, want, counts)
			}
		}
	}
	if p := final[base]; strings.Count(p, "+run") != 1 || !strings.Contains(p, "return a + b") || !strings.Contains(p, "test.yml") {
		t.Fatalf("the baseline's final diff:\n%s", p)
	}
	for _, m := range markers[1:] {
		if final[m] != final[base] {
			t.Errorf("%s's final diff differs from the baseline's:\n%s", m, final[m])
		}
	}
	// Where each kill hit: the crash after the model call left that call
	// recorded by the victim and its tool call to the survivor; the
	// command killed midway ran again, from the restored checkpoint.
	epochOf := func(m, kind, match string) (out []uint64) {
		for _, e := range listEvents(m) {
			if e.GetKind() == kind && strings.Contains(string(e.GetPayload()), match) {
				out = append(out, e.GetEpoch())
			}
		}
		return out
	}
	if mc, tc := epochOf(afterMC, "model_call", `"step":3,`), epochOf(afterMC, "tool_call", `"toolu_3"`); len(mc) != 1 || len(tc) != 1 || tc[0] <= mc[0] {
		t.Errorf("%s: the third model call under epochs %v, its tool call under %v", afterMC, mc, tc)
	}
	if tc, tr := epochOf(inCmd, "tool_call", `"toolu_3"`), epochOf(inCmd, "tool_result", `"toolu_3"`); len(tc) != 2 || len(tr) != 1 || tr[0] != tc[1] {
		t.Errorf("%s: the command's calls under epochs %v, its result under %v", inCmd, tc, tr)
	}
}

func fileExistsTest(p string) bool { _, err := os.Stat(p); return err == nil }

// agentFleet is three server processes and `warren node --driver
// container` processes started on demand, on loopback.
type agentFleet struct {
	t        *testing.T
	dir      string
	imageDir string
	env      []string
	urls     []string
	gossip   []string
	servers  []*proc
	nodes    []*proc
	cl       *client.Client
}

func newAgentFleet(t *testing.T, imageDir string, env ...string) *agentFleet {
	t.Helper()
	if guestBin := filepath.Join(filepath.Dir(warrenBin), "warren-guest"); !fileExistsTest(guestBin) {
		agenttest.BuildGuest(t, guestBin) // the container driver finds it next to warren
	}
	f := &agentFleet{t: t, dir: t.TempDir(), imageDir: imageDir, env: env, gossip: []string{freeaddr.Loopback(t), freeaddr.Loopback(t), freeaddr.Loopback(t)}}
	f.servers = startClusterWith(t, f.dir, func(i int) []string {
		return []string{"--gossip", f.gossip[i], "--join-gossip", strings.Join(f.gossip, ",")}
	})
	for _, s := range f.servers {
		f.urls = append(f.urls, s.url())
	}
	cl, err := client.New(strings.Join(f.urls, ","))
	if err != nil {
		t.Fatal(err)
	}
	f.cl = cl
	// The killed nodes' containers outlive them: a driver on the same
	// state directory destroys what it left (after every process is gone).
	t.Cleanup(func() {
		for _, p := range f.nodes {
			d, err := container.New(container.Config{ImageDir: imageDir, StateDir: filepath.Join(p.dataDir, "container")})
			if err == nil {
				d.Close()
			}
		}
	})
	t.Cleanup(func() {
		if t.Failed() {
			for _, p := range append(append([]*proc{}, f.servers...), f.nodes...) {
				t.Logf("--- %s log tail:\n%s", p.id, p.logTail())
			}
		}
	})
	return f
}

// startNode starts a node with labels, extra flags and environment.
func (f *agentFleet) startNode(id, labels string, flags []string, env ...string) *proc {
	p := newProc(f.t, f.dir, id)
	p.argv = append([]string{"node", "--id", id, "--data", filepath.Join(f.dir, id), "--servers", strings.Join(f.urls, ","),
		"--gossip", freeaddr.Loopback(f.t), "--join-gossip", strings.Join(f.gossip, ","), "--driver", "container", "--image-dir", f.imageDir,
		"--egress", "off", "--capacity", "cpu=64,mem=64GiB", "--labels", labels, "--approval-grace", "10m", "--log-level", "info", "--allow-local-repos"}, flags...)
	p.env = append(append([]string(nil), f.env...), env...)
	p.start()
	f.nodes = append(f.nodes, p)
	return p
}

func (f *agentFleet) nodeOf(id string) *warrenv1.Node {
	resp, err := f.cl.Cluster().ListNodes(context.Background(), connect.NewRequest(&warrenv1.ListNodesRequest{}))
	if err != nil {
		return nil
	}
	for _, n := range resp.Msg.GetNodes() {
		if n.GetId() == id {
			return n
		}
	}
	return nil
}

func (f *agentFleet) ready(ids ...string) {
	waitUntil(f.t, "nodes ready", time.Minute, func() bool {
		for _, id := range ids {
			if f.nodeOf(id).GetStatus() != warrenv1.NodeStatus_NODE_STATUS_READY {
				return false
			}
		}
		return true
	})
}

func (f *agentFleet) task(id string) *warrenv1.Task {
	resp, err := f.cl.Tasks().GetTask(context.Background(), connect.NewRequest(&warrenv1.GetTaskRequest{Id: id}))
	if err != nil {
		return nil
	}
	return resp.Msg.GetTask()
}

func (f *agentFleet) events(id string) []*warrenv1.Event {
	var out []*warrenv1.Event
	var after uint64
	for {
		resp, err := f.cl.Tasks().ListEvents(context.Background(), connect.NewRequest(&warrenv1.ListEventsRequest{TaskId: id, AfterSeq: after, Limit: 1000}))
		if err != nil {
			return out
		}
		out = append(out, resp.Msg.GetEvents()...)
		if len(resp.Msg.GetEvents()) < 1000 {
			return out
		}
		after = out[len(out)-1].GetSeq()
	}
}
