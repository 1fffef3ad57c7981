package noded_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/cgi"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/warrenhq/warren/agent"
	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
	"github.com/warrenhq/warren/forge"
	"github.com/warrenhq/warren/noded"
)

// A cancel that lands while the finish step pushes and opens the pull
// request still leaves the pull request on the log: it exists on the
// forge either way. Before, the step saw the cancel first and ended the
// task cancelled with no pull_request event.
func TestACancelDuringPublishKeepsThePullRequestRecord(t *testing.T) {
	imageDir := needContainers(t)
	repo := buggyRepo(t)
	script := strings.Join([]string{
		`{"content":[{"type":"tool_use","name":"edit_file","input":{"path":"calc/calc.go","old_string":"return a - b","new_string":"return a + b"}}]}`,
		`{"content":[{"type":"tool_use","name":"finish","input":{"summary":"Add adds now."}}]}`,
	}, "\n")
	published := make(chan struct{})
	c, _ := startAgentNodeWith(t, imageDir, nil, nil, func(cfg *noded.Config) {
		cfg.AfterPublish = func(ctx context.Context) {
			// The cancel arrives now, and the step sees it before it
			// records what it published.
			close(published)
			select {
			case <-ctx.Done():
			case <-time.After(time.Minute):
			}
		}
	})
	id := createScripted(t, c, "cancel-publish", repo, "", script)
	select {
	case <-published:
	case <-time.After(4 * time.Minute):
		t.Fatal("the task did not publish within 4 minutes")
	}
	if _, err := c.cl.Tasks().CancelTask(context.Background(), connect.NewRequest(&warrenv1.CancelTaskRequest{TaskId: id, Reason: "test cancel"})); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the task to end", time.Minute, func() bool {
		st := c.task(id).GetState()
		return st == warrenv1.TaskState_TASK_STATE_CANCELLED || st == warrenv1.TaskState_TASK_STATE_SUCCEEDED || st == warrenv1.TaskState_TASK_STATE_FAILED
	})
	var kinds []string
	pr := false
	for _, e := range c.events(id) {
		kinds = append(kinds, e.GetKind())
		pr = pr || e.GetKind() == "pull_request"
	}
	if st := c.task(id).GetState(); st != warrenv1.TaskState_TASK_STATE_CANCELLED {
		t.Fatalf("task ended %v, want cancelled: %v", st, kinds)
	}
	if !pr {
		t.Fatalf("the task was cancelled after its push with no pull_request event: %v", kinds)
	}
}

// blockingForge is a FAKE forge whose EnsurePR opens the pull request (it
// is on the forge from then on), says so on opened, and answers only when
// release is closed, or with its context's error when that ends first: a
// forge slow to answer, and a call cut off after the forge acted.
type blockingForge struct {
	opened  chan struct{}
	release chan struct{}
	once    sync.Once
	mu      sync.Mutex
	prs     int
}

func (f *blockingForge) Name() string { return "fake" }

func (f *blockingForge) EnsurePR(ctx context.Context, req forge.PRRequest) (*forge.PullRequest, error) {
	f.mu.Lock()
	f.prs++
	f.mu.Unlock()
	f.once.Do(func() { close(f.opened) })
	select {
	case <-f.release:
		return &forge.PullRequest{Number: 1, URL: "http://forge.test/" + req.Repo.Path + "/pull/1", Created: true}, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// serveRepo serves the git repository in dir (its .git) over smart HTTP
// on loopback, pushes allowed without credentials, as
// <url>/acme/calc.git, and returns that URL.
func serveRepo(t *testing.T, dir string) string {
	t.Helper()
	const backend = "/usr/lib/git-core/git-http-backend"
	if _, err := os.Stat(backend); err != nil {
		t.Skipf("needs %s (Debian package git)", backend)
	}
	if out, err := exec.Command("git", "-C", dir, "config", "http.receivepack", "true").CombinedOutput(); err != nil {
		t.Fatalf("git config: %v %s", err, out)
	}
	h := &cgi.Handler{Path: backend, Env: []string{"GIT_PROJECT_ROOT=" + dir, "GIT_HTTP_EXPORT_ALL=1"}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.URL.Path = "/.git" + strings.TrimPrefix(r.URL.Path, "/acme/calc.git")
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL + "/acme/calc.git"
}

// A cancel that lands while the pull request is being opened does not
// cut the call off: it runs to its end, the pull_request event is
// recorded, and then the task ends cancelled. Before, the call ran under
// the step's context, which the cancel ended: the forge had opened the
// pull request, the call returned "context canceled", and the task ended
// cancelled with no pull_request event (docs/forge.md says the log
// records it). The forge here answers only after the cancel reached the
// log.
func TestACancelWhileThePullRequestIsOpenedKeepsItsRecord(t *testing.T) {
	imageDir := needContainers(t)
	repo := serveRepo(t, buggyRepo(t))
	u, err := url.Parse(repo)
	if err != nil {
		t.Fatal(err)
	}
	script := strings.Join([]string{
		`{"content":[{"type":"tool_use","name":"edit_file","input":{"path":"calc/calc.go","old_string":"return a - b","new_string":"return a + b"}}]}`,
		`{"content":[{"type":"tool_use","name":"finish","input":{"summary":"Add adds now."}}]}`,
	}, "\n")
	fake := &blockingForge{opened: make(chan struct{}), release: make(chan struct{})}
	c, _ := startAgentNodeWith(t, imageDir, nil, nil, func(cfg *noded.Config) {
		g := agent.NewGitService(filepath.Join(cfg.DataDir, "git"), fake, nil, agent.CheckConfig{}, false)
		g.Hosts = []string{u.Host}
		cfg.Git = g
		cfg.AfterPublish = func(ctx context.Context) {
			// The step goes on once it has seen the cancel too, so the
			// task's end does not depend on which came first.
			select {
			case <-ctx.Done():
			case <-time.After(time.Minute):
			}
		}
	})
	id := createScripted(t, c, "cancel-pr-call", repo, "", script)
	select {
	case <-fake.opened:
	case <-time.After(4 * time.Minute):
		t.Fatal("the task did not call the forge within 4 minutes")
	}
	if _, err := c.cl.Tasks().CancelTask(context.Background(), connect.NewRequest(&warrenv1.CancelTaskRequest{TaskId: id, Reason: "test cancel"})); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the cancel request on the log", 30*time.Second, func() bool { return c.task(id).GetCancelRequested() })
	close(fake.release)
	waitFor(t, "the task to end", time.Minute, func() bool {
		return isTerminalState(c.task(id).GetState())
	})
	var kinds []string
	var pr map[string]any
	for _, e := range c.events(id) {
		kinds = append(kinds, e.GetKind())
		if e.GetKind() == "pull_request" {
			_ = json.Unmarshal(e.GetPayload(), &pr)
		}
	}
	if st := c.task(id).GetState(); st != warrenv1.TaskState_TASK_STATE_CANCELLED {
		t.Fatalf("task ended %v, want cancelled: %v", st, kinds)
	}
	if pr == nil {
		t.Fatalf("the forge opened a pull request, and the task was cancelled with no pull_request event: %v", kinds)
	}
	if got, _ := pr["pull_request"].(map[string]any)["number"].(float64); got != 1 || pr["forge"] != "fake" {
		t.Errorf("the pull_request event: %v", pr)
	}
}

func isTerminalState(s warrenv1.TaskState) bool {
	return s == warrenv1.TaskState_TASK_STATE_CANCELLED || s == warrenv1.TaskState_TASK_STATE_SUCCEEDED || s == warrenv1.TaskState_TASK_STATE_FAILED
}
