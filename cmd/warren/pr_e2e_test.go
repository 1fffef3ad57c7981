package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/cgi"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
	"github.com/warrenhq/warren/internal/testenv"
	"github.com/warrenhq/warren/noded/agenttest"
)

// gitServer is a real git server on loopback: git http-backend behind Go's
// CGI handler, serving the bare repositories under root. Pushes need the
// token (as HTTP basic auth, any user); each one is counted.
type gitServer struct {
	srv    *httptest.Server
	mu     sync.Mutex
	pushes int
	denied int
}

func newGitServer(t *testing.T, root, token string) *gitServer {
	const backend = "/usr/lib/git-core/git-http-backend"
	if _, err := os.Stat(backend); err != nil {
		testenv.Missing(t, "needs %s (Debian package git)", backend)
	}
	g := &gitServer{}
	h := &cgi.Handler{Path: backend, Root: "/git", Env: []string{"GIT_PROJECT_ROOT=" + root, "GIT_HTTP_EXPORT_ALL=1"}}
	g.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.Contains(r.URL.Path, "git-receive-pack") || r.URL.Query().Get("service") == "git-receive-pack" {
			if _, pw, ok := r.BasicAuth(); !ok || pw != token {
				g.mu.Lock()
				g.denied++
				g.mu.Unlock()
				w.Header().Set("WWW-Authenticate", `Basic realm="git"`)
				http.Error(w, "push needs the token", http.StatusUnauthorized)
				return
			}
			if r.Method == "POST" {
				g.mu.Lock()
				g.pushes++
				g.mu.Unlock()
			}
			// http-backend lets an authenticated user push.
			r.Header.Set("X-Remote-User", "agent")
			h2 := *h
			h2.Env = append(append([]string(nil), h.Env...), "REMOTE_USER=agent")
			h2.ServeHTTP(w, r)
			return
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(g.srv.Close)
	return g
}

// fakeGitHub is a FAKE GitHub REST API on loopback, answering the pull
// request calls with go-github's request and response shapes.
type fakeGitHub struct {
	srv     *httptest.Server
	mu      sync.Mutex
	prs     []map[string]any
	creates int
	tokens  []string
}

func newFakeGitHub(t *testing.T, owner, repo string) *fakeGitHub {
	f := &fakeGitHub{}
	path := fmt.Sprintf("/repos/%s/%s/pulls", owner, repo)
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.tokens = append(f.tokens, r.Header.Get("Authorization"))
		w.Header().Set("content-type", "application/json")
		if n, err := strconv.Atoi(strings.TrimPrefix(r.URL.Path, path+"/")); err == nil && r.Method == "PATCH" && n >= 1 && n <= len(f.prs) {
			// The retry updates a found pull request whose body differs
			// (the tests ran again, on another node).
			var edit map[string]any
			if err := json.NewDecoder(r.Body).Decode(&edit); err != nil {
				http.Error(w, `{"message":"Problems parsing JSON"}`, 400)
				return
			}
			for _, k := range []string{"title", "body"} {
				if v, ok := edit[k]; ok {
					f.prs[n-1][k] = v
				}
			}
			json.NewEncoder(w).Encode(f.prs[n-1])
			return
		}
		if r.URL.Path != path {
			http.Error(w, `{"message":"Not Found"}`, 404)
			return
		}
		switch r.Method {
		case "GET":
			out := []map[string]any{}
			for _, pr := range f.prs {
				if r.URL.Query().Get("state") == "open" && r.URL.Query().Get("head") == owner+":"+pr["head"].(map[string]any)["ref"].(string) {
					out = append(out, pr)
				}
			}
			json.NewEncoder(w).Encode(out)
		case "POST":
			var req struct {
				Title, Head, Base, Body string
				Draft                   bool
			}
			if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Title == "" || req.Head == "" || req.Base == "" {
				w.WriteHeader(422)
				fmt.Fprint(w, `{"message":"Validation Failed"}`)
				return
			}
			f.creates++
			n := len(f.prs) + 1
			pr := map[string]any{"number": n, "state": "open", "title": req.Title, "body": req.Body, "draft": req.Draft,
				"html_url": fmt.Sprintf("https://github.test/%s/%s/pull/%d", owner, repo, n),
				"head":     map[string]any{"ref": req.Head}, "base": map[string]any{"ref": req.Base}}
			f.prs = append(f.prs, pr)
			w.WriteHeader(201)
			json.NewEncoder(w).Encode(pr)
		default:
			http.Error(w, `{"message":"Not Found"}`, 404)
		}
	}))
	t.Cleanup(f.srv.Close)
	return f
}

// TestAgentPullRequest is the pull requests issue's first acceptance test.
// An agent task (scripted model) on a `warren node --driver container`
// process checks out a repository served by git http-backend on loopback,
// fixes it, passes its tests (run by the node, outside the model), passes
// the diff checks, pushes agent/<task-id> with the node's token, and opens
// a pull request on a FAKE GitHub API. The node then dies right after
// recording the pull request (WARREN_TEST_CRASH_AFTER), so the finish step
// runs again on another node: it pushes the same commit and finds the pull
// request instead of opening a second one.
func TestAgentPullRequest(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process run with containers; skipped with -short")
	}
	imageDir := agenttest.NeedContainers(t)
	const token = "forge-token-5b1e"
	// The repository, served bare over HTTP.
	root := t.TempDir()
	work := agenttest.BuggyRepo(t)
	bare := filepath.Join(root, "acme", "calc.git")
	for _, args := range [][]string{{"clone", "-q", "--bare", work, bare}, {"-C", bare, "config", "http.receivepack", "true"}} {
		if out, err := exec.Command("git", args...).CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v %s", args, err, out)
		}
	}
	out, err := exec.Command("git", "-C", bare, "symbolic-ref", "--short", "HEAD").Output()
	if err != nil {
		t.Fatal(err)
	}
	mainBranch := strings.TrimSpace(string(out))
	gs := newGitServer(t, root, token)
	repoURL := gs.srv.URL + "/git/acme/calc.git"
	gh := newFakeGitHub(t, "acme", "calc")

	script := strings.Join([]string{
		`{"content":[{"type":"tool_use","name":"read_file","input":{"path":"calc/calc.go"}}]}`,
		`{"content":[{"type":"tool_use","name":"edit_file","input":{"path":"calc/calc.go","old_string":"return a - b","new_string":"return a + b"}}]}`,
		`{"content":[{"type":"tool_use","name":"run_command","input":{"command":"go test ./... 2>&1","timeout_seconds":600}}]}`,
		`{"content":[{"type":"tool_use","name":"finish","input":{"summary":"Add subtracted; it adds now.","cause":"Add returned a - b.","fix":"Return a + b."}}]}`,
	}, "\n")
	af := newAgentFleet(t, imageDir, "WARREN_FORGE_TOKEN="+token)
	forgeFlags := []string{"--forge", "github", "--forge-url", gh.srv.URL, "--forge-git-hosts", strings.TrimPrefix(gs.srv.URL, "http://")}
	survivor := af.startNode("survivor", "pr=y", forgeFlags)
	af.ready("survivor")
	ctx := context.Background()
	if _, err := af.cl.Cluster().CordonNode(ctx, connect.NewRequest(&warrenv1.NodeRequest{Id: "survivor"})); err != nil {
		t.Fatal(err)
	}
	victim := af.startNode("victim", "pr=y", forgeFlags, "WARREN_TEST_CRASH_AFTER=finish/pull-request")
	af.ready("victim")
	resp, err := af.cl.Tasks().CreateTask(ctx, connect.NewRequest(&warrenv1.CreateTaskRequest{RequestId: "pr-1", Spec: &warrenv1.TaskSpec{
		Repo: repoURL, Base: mainBranch, IssueTitle: "Add is wrong", IssueBody: "Add(2, 2) is 0.", TestCommand: "go test ./...",
		Driver: "container", ModelScript: script, Model: "scripted", NodeSelector: map[string]string{"pr": "y"}}}))
	if err != nil {
		t.Fatal(err)
	}
	id := resp.Msg.GetTask().GetId()
	waitUntil(t, "the task placed on the victim", time.Minute, func() bool { return af.task(id).GetLease().GetNode() == "victim" })
	if _, err := af.cl.Cluster().UncordonNode(ctx, connect.NewRequest(&warrenv1.NodeRequest{Id: "survivor"})); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the victim to die after the pull request", 4*time.Minute, func() bool {
		return af.nodeOf("victim").GetStatus() == warrenv1.NodeStatus_NODE_STATUS_DOWN
	})
	victim.kill() // reap it
	waitUntil(t, "the task to end", 4*time.Minute, func() bool {
		s := af.task(id).GetState()
		return s == warrenv1.TaskState_TASK_STATE_SUCCEEDED || s == warrenv1.TaskState_TASK_STATE_FAILED
	})
	var kinds []string
	var prs []map[string]any
	var checked map[string]any
	var end map[string]any
	for _, e := range af.events(id) {
		kinds = append(kinds, e.GetKind())
		var p map[string]any
		json.Unmarshal(e.GetPayload(), &p)
		switch e.GetKind() {
		case "pull_request":
			prs = append(prs, p)
		case "diff_checked":
			checked = p
		case "state_changed":
			end = p
		}
		if strings.Contains(string(e.GetPayload()), token) {
			t.Errorf("event %d (%s) holds the forge token", e.GetSeq(), e.GetKind())
		}
	}
	t.Logf("events: %s", strings.Join(kinds, ","))
	if end["to"] != "succeeded" {
		t.Fatalf("the task ended %v", end)
	}
	log := strings.Join(kinds, ",")
	for _, want := range []string{"checkout", "test_run,diff_checked,pull_request"} {
		if !strings.Contains(log, want) {
			t.Errorf("the log lacks %s", want)
		}
	}
	if f, _ := checked["findings"].([]any); len(f) != 0 || checked["blocked"] != false {
		t.Errorf("the diff checks: %v", checked)
	}
	// Two pull_request records (the victim's and the survivor's retry),
	// one pull request on the forge.
	gh.mu.Lock()
	creates, ghPRs := gh.creates, gh.prs
	for _, tok := range gh.tokens {
		if tok != "Bearer "+token {
			t.Errorf("a forge call with Authorization %q", tok)
		}
	}
	gh.mu.Unlock()
	if len(prs) != 2 || creates != 1 || len(ghPRs) != 1 {
		t.Fatalf("%d pull_request events, %d pull requests opened on the forge", len(prs), creates)
	}
	first, retry := prs[0]["pull_request"].(map[string]any), prs[1]["pull_request"].(map[string]any)
	if first["created"] != true || retry["created"] != false || first["number"] != retry["number"] || prs[0]["commit"] != prs[1]["commit"] {
		t.Errorf("the records: %v / %v", prs[0], prs[1])
	}
	body, _ := ghPRs[0]["body"].(string)
	for _, want := range []string{"Add subtracted; it adds now.", "Add returned a - b.", "Return a + b.", "go test ./...", "ok", "No findings."} {
		if !strings.Contains(body, want) {
			t.Errorf("the pull request's body lacks %q:\n%s", want, body)
		}
	}
	if h := ghPRs[0]["head"].(map[string]any)["ref"]; h != "agent/"+id {
		t.Errorf("the pull request's head is %v", h)
	}
	if b := ghPRs[0]["base"].(map[string]any)["ref"]; b != mainBranch {
		t.Errorf("the pull request's base is %v", b)
	}
	// The branch on the git server holds the fix, and only the fix.
	branch := "agent/" + id
	show, err := exec.Command("git", "-C", bare, "show", branch+":calc/calc.go").CombinedOutput()
	if err != nil || !strings.Contains(string(show), "return a + b") {
		t.Fatalf("the pushed branch: %v %s", err, show)
	}
	if got, _ := exec.Command("git", "-C", bare, "rev-parse", branch).Output(); strings.TrimSpace(string(got)) != prs[0]["commit"] {
		t.Errorf("the branch is at %s, the record says %v", got, prs[0]["commit"])
	}
	refs, _ := exec.Command("git", "-C", bare, "for-each-ref", "--format=%(refname)").Output()
	if strings.TrimSpace(string(refs)) != "refs/heads/"+branch+"\nrefs/heads/"+mainBranch {
		t.Errorf("the server's refs: %s", refs)
	}
	gs.mu.Lock()
	defer gs.mu.Unlock()
	if gs.pushes < 1 {
		t.Errorf("%d authenticated pushes", gs.pushes)
	}
	if n := af.nodeOf(survivor.id); n.GetStatus() != warrenv1.NodeStatus_NODE_STATUS_READY {
		t.Errorf("the survivor is %v", n.GetStatus())
	}
}
