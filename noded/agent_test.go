package noded_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
	"github.com/warrenhq/warren/noded"
	"github.com/warrenhq/warren/noded/agenttest"
	"github.com/warrenhq/warren/noded/driver/container"
)

// A task runs the agent loop on the scripted provider (no model is
// called) in a real container sandbox, on a small Go repository with a
// failing test: it reads, searches, edits, runs the tests and finishes
// with them passing, and its log shows every step (issue 7, acceptance 1).
func TestAgentTaskFixesARepository(t *testing.T) {
	imageDir := needContainers(t)
	repo := buggyRepo(t)
	script := strings.Join([]string{
		`{"content":[{"type":"text","text":"Reading the code."},{"type":"tool_use","name":"read_file","input":{"path":"calc/calc.go"}}],"usage":{"input_tokens":900,"output_tokens":30}}`,
		`{"content":[{"type":"tool_use","name":"search","input":{"pattern":"Add\\(","glob":"*.go"}}],"usage":{"input_tokens":80,"cache_read_tokens":900,"output_tokens":20}}`,
		`{"content":[{"type":"tool_use","name":"edit_file","input":{"path":"calc/calc.go","old_string":"return a - b","new_string":"return a + b"}}],"usage":{"input_tokens":60,"cache_read_tokens":1000,"output_tokens":40}}`,
		`{"content":[{"type":"tool_use","name":"run_command","input":{"command":"go test ./... 2>&1","timeout_seconds":600}}],"usage":{"input_tokens":40,"cache_read_tokens":1100,"output_tokens":20}}`,
		`{"content":[{"type":"tool_use","name":"finish","input":{"summary":"Add subtracted; it adds now.","cause":"a - b","fix":"a + b"}}],"usage":{"input_tokens":70,"cache_read_tokens":1200,"output_tokens":30}}`,
	}, "\n")
	c := startAgentNode(t, imageDir, nil, nil)
	id := createScripted(t, c, "agent-1", repo, "Add(2, 2) is 0.", script)
	checkFixed(t, c, id, 5)
}

// createScripted creates a task on repo with the scripted provider, in a
// container, whose test command is go test ./..., and returns its id.
func createScripted(t *testing.T, c *cluster, requestID, repo, body, script string) string {
	t.Helper()
	resp, err := c.cl.Tasks().CreateTask(context.Background(), connect.NewRequest(&warrenv1.CreateTaskRequest{
		RequestId: requestID, Spec: &warrenv1.TaskSpec{Repo: repo, Base: "HEAD", IssueTitle: "Add is wrong", IssueBody: body,
			TestCommand: "go test ./...", Driver: "container", Model: "scripted", ModelScript: script}}))
	if err != nil {
		t.Fatal(err)
	}
	return resp.Msg.GetTask().GetId()
}

func needContainers(t *testing.T) string { return agenttest.NeedContainers(t) }

// buildGuest builds warren-guest from this tree.
func buildGuest(t *testing.T) string {
	bin := filepath.Join(t.TempDir(), "warren-guest")
	agenttest.BuildGuest(t, bin)
	return bin
}

// fakeCall is one request the FAKE Anthropic server got.
type fakeCall struct {
	N    int // from 0
	Body []byte
	Key  string // x-api-key
}

// fakeAnthropic is a FAKE Anthropic Messages API on loopback, not a model:
// its n-th request gets turns[n] (a content array of tool_use blocks), and
// a request past the last turn is refused. seen, if set, gets each request
// before the answer and may hold it back.
func fakeAnthropic(t *testing.T, turns []string, seen func(fakeCall)) *httptest.Server {
	t.Helper()
	var mu sync.Mutex
	n := 0
	fake := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		call := fakeCall{N: n, Body: b, Key: r.Header.Get("x-api-key")}
		n++
		mu.Unlock()
		if seen != nil {
			seen(call)
		}
		if call.N >= len(turns) {
			http.Error(w, `{"type":"error","error":{"type":"invalid_request_error","message":"no more turns"}}`, 400)
			return
		}
		w.Header().Set("content-type", "application/json")
		fmt.Fprintf(w, `{"id":"msg_%d","type":"message","role":"assistant","model":"claude-test","content":%s,"stop_reason":"tool_use","usage":{"input_tokens":100,"output_tokens":20}}`, call.N, turns[call.N])
	}))
	t.Cleanup(fake.Close)
	return fake
}

func buggyRepo(t *testing.T) string { return agenttest.BuggyRepo(t) }

// startAgentNode runs one server and one node with the container driver;
// models and logw may be nil.
func startAgentNode(t *testing.T, imageDir string, models *noded.Models, logw io.Writer) *cluster {
	t.Helper()
	c, _ := startAgentNodeWith(t, imageDir, models, logw, nil)
	return c
}

// startAgentNodeWith is startAgentNode with the node's config edited by
// edit (if not nil); it returns the node too.
func startAgentNodeWith(t *testing.T, imageDir string, models *noded.Models, logw io.Writer, edit func(*noded.Config)) (*cluster, *noded.Daemon) {
	t.Helper()
	drv, err := container.New(container.Config{ImageDir: imageDir, StateDir: t.TempDir(), Namespace: "warren-test-agent", Agent: buildGuest(t)})
	if err != nil {
		t.Fatal(err)
	}
	c := startCluster(t, 1, 0)
	var log *slog.Logger
	if logw != nil {
		log = slog.New(slog.NewTextHandler(logw, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	cfg := noded.Config{ID: "n1", DataDir: filepath.Join(c.dir, "node-n1"), Servers: c.urls(), Driver: drv,
		Capacity: &warrenv1.Resources{MilliCpu: 100 * 1000, MemoryBytes: 1 << 40}, Models: models, Logger: log}
	if edit != nil {
		edit(&cfg)
	}
	d, err := noded.Start(cfg)
	if err != nil {
		drv.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	waitFor(t, "node ready", 10*time.Second, func() bool {
		n, err := c.node("n1")
		return err == nil && n.GetStatus() == warrenv1.NodeStatus_NODE_STATUS_READY
	})
	return c, d
}

// checkFixed waits for the task and checks it fixed the repository in its
// sandbox, with every step on its log.
func checkFixed(t *testing.T, c *cluster, id string, steps int) {
	t.Helper()
	waitFor(t, "the task to end", 4*time.Minute, func() bool {
		tk := c.task(id)
		return tk != nil && (tk.GetState() == warrenv1.TaskState_TASK_STATE_SUCCEEDED || tk.GetState() == warrenv1.TaskState_TASK_STATE_FAILED)
	})
	var kinds []string
	var testOut string
	var end map[string]any
	for _, e := range c.events(id) {
		kinds = append(kinds, e.GetKind())
		var p map[string]any
		json.Unmarshal(e.GetPayload(), &p)
		if e.GetKind() == "tool_result" && strings.Contains(p["output"].(string), "exit code") {
			testOut = p["output"].(string)
		}
		if e.GetKind() == "state_changed" {
			end = p
		}
	}
	t.Logf("events: %s", strings.Join(kinds, ","))
	if end["to"] != "succeeded" {
		t.Fatalf("the task ended %v", end)
	}
	if !strings.HasPrefix(testOut, "exit code 0") || !strings.Contains(testOut, "ok") {
		t.Fatalf("the tests in the sandbox: %q", testOut)
	}
	log := strings.Join(kinds, ",")
	for _, want := range []string{"message,model_call,tool_call,tool_result", "tool_call,checkpoint,tool_result"} {
		if !strings.Contains(log, want) {
			t.Errorf("the log lacks %s", want)
		}
	}
	if n := strings.Count(log, "model_call"); n != steps {
		t.Errorf("%d model calls, want %d", n, steps)
	}
}

// The model credential a node holds reaches the model server and nothing
// else: no event, no node log line, nothing inside the sandbox (issue 7,
// acceptance 6). The model is a FAKE Anthropic server on loopback that
// plays a fixed trajectory.
func TestAgentCredentialsStayOnTheNode(t *testing.T) {
	imageDir := needContainers(t)
	repo := buggyRepo(t)
	const secret = "sk-ant-canary-7f3e9a"
	turns := []string{
		`[{"type":"tool_use","id":"toolu_1","name":"read_file","input":{"path":"calc/calc.go"}}]`,
		`[{"type":"tool_use","id":"toolu_2","name":"edit_file","input":{"path":"calc/calc.go","old_string":"return a - b","new_string":"return a + b"}}]`,
		`[{"type":"tool_use","id":"toolu_3","name":"run_command","input":{"command":"go test ./... 2>&1; env; p=sk-ant-canary; grep -rsl \"$p-7f3e9a\" /work /etc /root /tmp /run /proc/self/environ; echo found=$?"}}]`,
		`[{"type":"tool_use","id":"toolu_4","name":"finish","input":{"summary":"fixed"}}]`,
	}
	var mu sync.Mutex
	var keys []string
	fake := fakeAnthropic(t, turns, func(c fakeCall) {
		mu.Lock()
		keys = append(keys, c.Key)
		mu.Unlock()
	})
	var logs bytes.Buffer
	var logMu sync.Mutex
	c := startAgentNode(t, imageDir, &noded.Models{AnthropicKey: secret, AnthropicURL: fake.URL}, lockedWriter{&logMu, &logs})
	resp, err := c.cl.Tasks().CreateTask(context.Background(), connect.NewRequest(&warrenv1.CreateTaskRequest{
		RequestId: "agent-cred", Spec: &warrenv1.TaskSpec{Repo: repo, Base: "HEAD", IssueTitle: "Add is wrong",
			Driver: "container", Model: "claude-test"}}))
	if err != nil {
		t.Fatal(err)
	}
	id := resp.Msg.GetTask().GetId()
	checkFixed(t, c, id, 4)
	mu.Lock()
	if len(keys) != 4 || keys[0] != secret {
		t.Errorf("the model server got %d calls, first key %q", len(keys), keys[0])
	}
	mu.Unlock()
	var sawGrep bool
	for _, e := range c.events(id) {
		if strings.Contains(string(e.GetPayload()), secret) {
			t.Errorf("event %d (%s) holds the credential", e.GetSeq(), e.GetKind())
		}
		if strings.Contains(string(e.GetPayload()), "found=1") {
			sawGrep = true // grep looked in the sandbox and found nothing
		}
	}
	if !sawGrep {
		t.Error("the in-sandbox search did not run or found the credential")
	}
	logMu.Lock()
	defer logMu.Unlock()
	if logs.Len() == 0 {
		t.Error("the node logged nothing: the check would not mean anything")
	}
	if strings.Contains(logs.String(), secret) {
		t.Error("the node's log holds the credential")
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// A message sent to a running agent task reaches the model at its next
// step (FAKE Anthropic server on loopback).
func TestAgentSteering(t *testing.T) {
	imageDir := needContainers(t)
	repo := buggyRepo(t)
	turns := []string{
		`[{"type":"tool_use","id":"toolu_1","name":"read_file","input":{"path":"calc/calc.go"}}]`,
		`[{"type":"tool_use","id":"toolu_2","name":"finish","input":{"summary":"stopped as asked"}}]`,
	}
	got0, release := make(chan struct{}), make(chan struct{})
	var mu sync.Mutex
	var bodies []string
	fake := fakeAnthropic(t, turns, func(c fakeCall) {
		mu.Lock()
		bodies = append(bodies, string(c.Body))
		mu.Unlock()
		if c.N == 0 { // hold the first answer until the message is sent
			close(got0)
			select {
			case <-release:
			case <-time.After(30 * time.Second):
			}
		}
	})
	c := startAgentNode(t, imageDir, &noded.Models{AnthropicKey: "k", AnthropicURL: fake.URL}, nil)
	resp, err := c.cl.Tasks().CreateTask(context.Background(), connect.NewRequest(&warrenv1.CreateTaskRequest{
		RequestId: "agent-steer", Spec: &warrenv1.TaskSpec{Repo: repo, Base: "HEAD", IssueTitle: "Add is wrong", Driver: "container", Model: "claude-test"}}))
	if err != nil {
		t.Fatal(err)
	}
	id := resp.Msg.GetTask().GetId()
	select {
	case <-got0:
	case <-time.After(2 * time.Minute):
		t.Fatal("the task never called the model")
	}
	if _, err := c.cl.Tasks().SendMessage(context.Background(), connect.NewRequest(&warrenv1.SendMessageRequest{TaskId: id, Text: "stop after reading; do not edit"})); err != nil {
		t.Fatal(err)
	}
	close(release)
	// Told not to edit, it finishes with no change: no pull request, and
	// the task says why.
	waitFor(t, "the task to end", 2*time.Minute, func() bool {
		tk := c.task(id)
		return tk != nil && tk.GetState() == warrenv1.TaskState_TASK_STATE_FAILED
	})
	evs := c.events(id)
	if last := string(evs[len(evs)-1].GetPayload()); !strings.Contains(last, "finished without changing anything") {
		t.Errorf("the end: %s", last)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(bodies) != 2 || strings.Contains(bodies[0], "do not edit") || !strings.Contains(bodies[1], "Message from the user: stop after reading; do not edit") {
		t.Fatalf("the model's requests: %d; the second lacks the message", len(bodies))
	}
}
