package forge

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// fakePRs is a FAKE forge API (GitHub, Gitea or GitLab request shapes) on
// loopback: it keeps pull requests in memory and counts creations.
type fakePRs struct {
	mu      sync.Mutex
	prs     []map[string]any // "fork": true is a pull request from mallory/calc; "body": the last request's JSON
	creates int
	edits   int
	auth    []string
	pageCap int // gitea: the server's MAX_RESPONSE_ITEMS (0: 50)
}

func (f *fakePRs) serve(t *testing.T, kind string) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.auth = append(f.auth, r.Header.Get("Authorization")+r.Header.Get("PRIVATE-TOKEN"))
		w.Header().Set("content-type", "application/json")
		var list, create string
		switch kind {
		case "github":
			list, create = "/repos/acme/calc/pulls", "/repos/acme/calc/pulls"
		case "gitea":
			list, create = "/api/v1/repos/acme/calc/pulls", "/api/v1/repos/acme/calc/pulls"
		case "gitlab":
			list, create = "/api/v4/projects/acme/calc/merge_requests", "/api/v4/projects/acme/calc/merge_requests"
		}
		switch {
		case (r.Method == "PATCH" || r.Method == "PUT") && strings.HasPrefix(r.URL.Path, list+"/"):
			n, _ := strconv.Atoi(strings.TrimPrefix(r.URL.Path, list+"/"))
			var edit map[string]any
			if err := json.NewDecoder(r.Body).Decode(&edit); err != nil {
				http.Error(w, `{"message":"bad json"}`, 400)
				return
			}
			for _, pr := range f.prs {
				if pr["n"] == n && (kind == "gitlab") == (r.Method == "PUT") {
					f.edits++
					body, _ := pr["body"].(map[string]any)
					if body == nil {
						body = map[string]any{}
						pr["body"] = body
					}
					for k, v := range edit {
						body[k] = v
					}
					w.Write([]byte("{}"))
					return
				}
			}
			http.Error(w, `{"message":"Not Found"}`, 404)
		case r.Method == "GET" && r.URL.Path == list:
			q := r.URL.Query()
			out := []map[string]any{}
			for _, pr := range f.prs {
				head := pr["head"].(string)
				stored, _ := pr["body"].(map[string]any)
				title, text := stored["title"], cmp.Or(stored["body"], stored["description"])
				owner, project := "acme", 1
				if pr["fork"] == true {
					owner, project = "mallory", 2
				}
				switch kind {
				case "github":
					if q.Get("head") != owner+":"+head || q.Get("state") != "open" {
						continue
					}
					out = append(out, map[string]any{"number": pr["n"], "html_url": pr["url"], "head": map[string]any{"ref": head}, "title": title, "body": text})
				case "gitea":
					out = append(out, map[string]any{"number": pr["n"], "html_url": pr["url"], "title": title, "body": text,
						"head": map[string]any{"ref": head, "repo": map[string]any{"full_name": owner + "/calc"}},
						"base": map[string]any{"ref": "main", "repo": map[string]any{"full_name": "acme/calc"}}})
				case "gitlab":
					if q.Get("source_branch") == head && q.Get("state") == "opened" {
						out = append(out, map[string]any{"iid": pr["n"], "web_url": pr["url"], "source_project_id": project, "target_project_id": 1, "title": title, "description": text})
					}
				}
			}
			if kind == "gitea" { // newest first, a page at a time
				for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
					out[i], out[j] = out[j], out[i]
				}
				limit, _ := strconv.Atoi(q.Get("limit"))
				if c := cmp.Or(f.pageCap, 50); limit <= 0 || limit > c {
					limit = c
				}
				page, _ := strconv.Atoi(q.Get("page"))
				lo, hi := min((max(page, 1)-1)*limit, len(out)), min(max(page, 1)*limit, len(out))
				out = out[lo:hi]
			}
			json.NewEncoder(w).Encode(out)
		case r.Method == "POST" && r.URL.Path == create:
			var body map[string]any
			if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
				http.Error(w, `{"message":"bad json"}`, 400)
				return
			}
			head, base, title := body["head"], body["base"], body["title"]
			if kind == "gitlab" {
				head, base = body["source_branch"], body["target_branch"]
			}
			if head == nil || base == nil || title == nil {
				http.Error(w, `{"message":"Validation Failed"}`, 422)
				return
			}
			f.creates++
			n := len(f.prs) + 1
			url := fmt.Sprintf("https://forge.test/acme/calc/pull/%d", n)
			f.prs = append(f.prs, map[string]any{"n": n, "url": url, "head": head, "body": body})
			w.WriteHeader(201)
			if kind == "gitlab" {
				json.NewEncoder(w).Encode(map[string]any{"iid": n, "web_url": url})
			} else {
				json.NewEncoder(w).Encode(map[string]any{"number": n, "html_url": url})
			}
		default:
			http.Error(w, `{"message":"Not Found"}`, 404)
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

// Each adapter opens a pull request once: a retry finds it.
func TestEnsurePROpensOnce(t *testing.T) {
	for _, kind := range []string{"github", "gitea", "gitlab"} {
		t.Run(kind, func(t *testing.T) {
			fake := &fakePRs{}
			srv := fake.serve(t, kind)
			f, err := New(kind, srv.URL, "tok-123")
			if err != nil {
				t.Fatal(err)
			}
			req := PRRequest{Repo: RepoRef{Owner: "acme", Name: "calc"}, Head: "agent/t1", Base: "main", Title: "Fix Add", Body: "body", Draft: true}
			first, err := f.EnsurePR(context.Background(), req)
			if err != nil {
				t.Fatal(err)
			}
			again, err := f.EnsurePR(context.Background(), req)
			if err != nil {
				t.Fatal(err)
			}
			if !first.Created || again.Created || again.Number != first.Number || fake.creates != 1 {
				t.Fatalf("first %+v, retry %+v, %d creations", first, again, fake.creates)
			}
			body := fake.prs[0]["body"].(map[string]any)
			switch kind {
			case "github":
				if body["draft"] != true || body["title"] != "Fix Add" || body["body"] != "body" {
					t.Errorf("request body %v", body)
				}
			case "gitea":
				if !strings.HasPrefix(body["title"].(string), "WIP: ") {
					t.Errorf("request body %v", body)
				}
			case "gitlab":
				if body["title"] != "Draft: Fix Add" || body["description"] != "body" {
					t.Errorf("request body %v", body)
				}
			}
			for _, a := range fake.auth {
				if !strings.Contains(a, "tok-123") {
					t.Errorf("a request without the token: %q", a)
				}
			}
		})
	}
}

// A fork's open pull request from a branch of the same name is not the
// task's: the adapter opens the task's own.
func TestEnsurePRIgnoresAForkWithTheSameBranch(t *testing.T) {
	for _, kind := range []string{"github", "gitea", "gitlab"} {
		t.Run(kind, func(t *testing.T) {
			fake := &fakePRs{prs: []map[string]any{{"n": 1, "url": "https://forge.test/acme/calc/pull/1", "head": "agent/t1", "fork": true}}}
			srv := fake.serve(t, kind)
			f, err := New(kind, srv.URL, "tok")
			if err != nil {
				t.Fatal(err)
			}
			req := PRRequest{Repo: RepoRef{Owner: "acme", Name: "calc"}, Head: "agent/t1", Base: "main", Title: "t"}
			pr, err := f.EnsurePR(context.Background(), req)
			if err != nil {
				t.Fatal(err)
			}
			if pr.Number == 1 || !pr.Created || fake.creates != 1 {
				t.Fatalf("EnsurePR = %+v after %d creations: the fork's pull request was taken for the task's", pr, fake.creates)
			}
		})
	}
}

// A Gitea server may cap a page below the limit asked for: a short page
// is not the last, and a retry still finds the task's pull request on a
// later one.
func TestGiteaFindsPRBeyondAServerCappedPage(t *testing.T) {
	fake := &fakePRs{pageCap: 20}
	for i := 1; i <= 29; i++ {
		fake.prs = append(fake.prs, map[string]any{"n": i, "url": fmt.Sprintf("https://forge.test/acme/calc/pull/%d", i), "head": fmt.Sprintf("feature-%d", i)})
	}
	srv := fake.serve(t, "gitea")
	f, err := New("gitea", srv.URL, "tok")
	if err != nil {
		t.Fatal(err)
	}
	// The task's pull request is the oldest open one: on page 2.
	fake.prs = append([]map[string]any{{"n": 30, "url": "https://forge.test/acme/calc/pull/30", "head": "agent/t1"}}, fake.prs...)
	pr, err := f.EnsurePR(context.Background(), PRRequest{Repo: RepoRef{Owner: "acme", Name: "calc"}, Head: "agent/t1", Base: "main", Title: "t"})
	if err != nil || pr.Number != 30 || pr.Created || fake.creates != 0 {
		t.Fatalf("EnsurePR = %+v, %v after %d creations; want the open #30 found", pr, err, fake.creates)
	}
}

func TestRepoFromURL(t *testing.T) {
	for in, want := range map[string]string{
		"https://github.com/acme/calc.git":   "acme/calc",
		"http://127.0.0.1:8080/git/a/b":      "a/b",
		"git@github.com:acme/calc.git":       "acme/calc",
		"/srv/git/acme/calc.git":             "acme/calc",
		"https://gitlab.com/g/sub/proj.git/": "sub/proj",
	} {
		got, err := RepoFromURL(in)
		if err != nil || got.String() != want {
			t.Errorf("%s: %v %v", in, got, err)
		}
	}
	if r, _ := RepoFromURL("https://gitlab.com/g/sub/proj.git"); r.fullPath() != "g/sub/proj" {
		t.Errorf("GitLab's full path: %q", r.fullPath())
	}
	if _, err := RepoFromURL("calc"); err == nil {
		t.Error("a bare name was accepted")
	}
	if _, err := New("bitbucket", "", ""); err == nil {
		t.Error("an unknown forge was accepted")
	}
}

// A resumed task may force-push a different diff to its branch: the pull
// request it finds must then describe that diff, not the first one. The
// adapter updates a found pull request's title and body when they differ
// from what is asked, keeps its draft marker as it is (a person may have
// marked it ready), and leaves it alone when they are the same.
func TestEnsurePRUpdatesAFoundPRsTitleAndBody(t *testing.T) {
	for _, kind := range []string{"github", "gitea", "gitlab"} {
		t.Run(kind, func(t *testing.T) {
			fake := &fakePRs{}
			srv := fake.serve(t, kind)
			f, err := New(kind, srv.URL, "tok")
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			req := PRRequest{Repo: RepoRef{Owner: "acme", Name: "calc", Path: "acme/calc"}, Head: "agent/t1", Base: "main", Title: "Fix Add", Body: "diff A", Draft: true}
			stored := func(key string) any {
				fake.mu.Lock()
				defer fake.mu.Unlock()
				b := fake.prs[0]["body"].(map[string]any)
				if key == "body" && kind == "gitlab" {
					key = "description"
				}
				return b[key]
			}
			if _, err := f.EnsurePR(ctx, req); err != nil {
				t.Fatal(err)
			}
			created := stored("title")
			req.Body = "diff B"
			pr, err := f.EnsurePR(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			if got := stored("body"); got != "diff B" || pr.Created || !updated(pr) || fake.creates != 1 {
				t.Fatalf("after a retry with another body: stored body %q, %+v, %d creations; want \"diff B\"", got, pr, fake.creates)
			}
			if stored("title") != created {
				t.Errorf("the title changed from %q to %q with only the body", created, stored("title"))
			}
			req.Title = "Fix Add and Sub"
			if _, err := f.EnsurePR(ctx, req); err != nil {
				t.Fatal(err)
			}
			want := map[string]string{"github": "Fix Add and Sub", "gitea": "WIP: Fix Add and Sub", "gitlab": "Draft: Fix Add and Sub"}[kind]
			if got := stored("title"); got != want {
				t.Errorf("after a retry with another title: %q, want %q", got, want)
			}
			edits := fake.edits
			if pr, err := f.EnsurePR(ctx, req); err != nil || updated(pr) || fake.edits != edits {
				t.Errorf("a retry with the same title and body: %+v, %v, %d edits; want none", pr, err, fake.edits-edits)
			}
			// Marked ready by a person: a retry does not make it a draft again.
			fake.mu.Lock()
			fake.prs[0]["body"].(map[string]any)["title"] = "Fix Add and Sub"
			fake.mu.Unlock()
			if _, err := f.EnsurePR(ctx, req); err != nil || stored("title") != "Fix Add and Sub" {
				t.Errorf("a retry on a pull request marked ready: title %q, %v", stored("title"), err)
			}
		})
	}
}

// updated reports whether pr says, as the pull_request event records it,
// that EnsurePR updated it.
func updated(pr *PullRequest) bool {
	b, _ := json.Marshal(pr)
	return strings.Contains(string(b), `"updated":true`)
}
