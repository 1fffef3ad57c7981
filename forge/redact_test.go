package forge

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"
)

// testToken is the forge token of the adapters' error tests.
const testToken = "sk-zzreview-SECRET-0123456789abcdefghij"

// ensurePRErrors makes every adapter, with token, ask the forge at url for
// the same pull request, and returns each one's error by kind.
func ensurePRErrors(t *testing.T, url, token string) map[string]error {
	t.Helper()
	out := map[string]error{}
	for _, kind := range []string{"github", "gitea", "gitlab"} {
		f, err := New(kind, url, token)
		if err != nil {
			t.Fatal(err)
		}
		_, out[kind] = f.EnsurePR(context.Background(), PRRequest{Repo: RepoRef{Owner: "acme", Name: "calc", Path: "acme/calc"}, Head: "agent/t1", Base: "main", Title: "x"})
	}
	return out
}

// A forge (or the proxy in front of it) that echoes the credential it was
// given in an error body: the adapters' errors quote up to 300 bytes of
// that body (doJSON; go-github's ErrorResponse its message), and
// the finish step puts the error in a log line ("publish failed;
// retrying") and, after the last try, in the task's state_changed event.
// Every adapter's errors have the token redacted.
func TestAdapterErrorsDoNotEchoTheToken(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("content-type", "application/json")
		w.WriteHeader(http.StatusUnauthorized)
		got := r.Header.Get("Authorization") + r.Header.Get("PRIVATE-TOKEN")
		// Padded so that the adapters' 300-byte cut falls in the token.
		_, _ = w.Write([]byte(`{"message":"` + strings.Repeat("x", 250) + ` bad credentials: ` + got + `"}`))
	}))
	defer srv.Close()
	for kind, err := range ensurePRErrors(t, srv.URL, testToken) {
		if err == nil {
			t.Fatalf("%s: no error", kind)
		}
		if strings.Contains(err.Error(), testToken) || strings.Contains(err.Error(), testToken[:8]) {
			t.Errorf("%s: the forge's error repeats the token: %v", kind, err)
		}
	}
}

// A proxy may quote the credential inside a URL (a login link, a query)
// or a JSON string that escapes "/": so escaped, a token with '+', '/' or
// '=' reads otherwise, and is redacted in those forms too.
func TestAdapterErrorsDoNotEchoTheEscapedToken(t *testing.T) {
	const token = "glpat-a+b/c=d-0123456789abcdefghij"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got := r.Header.Get("Authorization") + r.Header.Get("PRIVATE-TOKEN")
		got = got[strings.LastIndexByte(got, ' ')+1:]
		w.Header().Set("content-type", "application/json")
		w.WriteHeader(http.StatusForbidden)
		_, _ = w.Write([]byte(`{"message":"log in again: https://proxy.invalid/login?t=` + url.QueryEscape(got) + ` or /login/` + url.PathEscape(got) + ` (` + strings.ReplaceAll(got, "/", `\/`) + `)"}`))
	}))
	defer srv.Close()
	for kind, err := range ensurePRErrors(t, srv.URL, token) {
		if err == nil {
			t.Fatalf("%s: no error", kind)
		}
		for _, form := range []string{token, url.QueryEscape(token), url.PathEscape(token), strings.ReplaceAll(token, "/", `\/`), "0123456789abcdefghij"} {
			if strings.Contains(err.Error(), form) {
				t.Errorf("%s: the error repeats the token as %q: %v", kind, form, err)
			}
		}
	}
}

// An API call follows a redirect only on the same host and scheme.
func TestAPIRedirectsStayOnHostAndScheme(t *testing.T) {
	req := func(u string) *http.Request {
		r, err := http.NewRequest("GET", u, nil)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	from := []*http.Request{req("https://forge.example/api/v1/x")}
	for u, ok := range map[string]bool{
		"https://forge.example/api/v1/y": true,
		"http://forge.example/api/v1/y":  false,
		"https://other.example/api/v1/y": false,
	} {
		if err := checkRedirect(req(u), from); (err == nil) != ok {
			t.Errorf("redirect to %s: err %v, want allowed %v", u, err, ok)
		}
	}
}

// A forge's rate limit says how long to wait, and the adapters' errors
// keep it (the redacting wrapper too, when the body echoes the token):
// GitHub's secondary limit (403 and its documentation URL) and a 429
// with Retry-After on Gitea and GitLab.
func TestAdapterErrorsKeepTheForgesRetryAfter(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("content-type", "application/json")
		w.Header().Set("Retry-After", "45")
		got := r.Header.Get("Authorization") + r.Header.Get("PRIVATE-TOKEN")
		if !strings.HasPrefix(r.URL.Path, "/api/") { // GitHub's paths; Gitea's and GitLab's are /api/v1 and /api/v4
			w.WriteHeader(http.StatusForbidden)
			_, _ = w.Write([]byte(`{"message":"You have exceeded a secondary rate limit (` + got + `)","documentation_url":"https://docs.github.com/rest/overview/rate-limits-for-the-rest-api#about-secondary-rate-limits"}`))
			return
		}
		w.WriteHeader(http.StatusTooManyRequests)
		_, _ = w.Write([]byte(`{"message":"slow down: ` + got + `"}`))
	}))
	defer srv.Close()
	for kind, err := range ensurePRErrors(t, srv.URL, testToken) {
		d, ok := RetryAfter(err)
		if !ok || d < 40*time.Second || d > 45*time.Second {
			t.Errorf("%s: RetryAfter(%v) = %v %v; want about 45 s", kind, err, d, ok)
		}
		if err != nil && strings.Contains(err.Error(), testToken[:8]) {
			t.Errorf("%s: the error repeats the token: %v", kind, err)
		}
	}
	if _, ok := RetryAfter(errors.New("connection refused")); ok {
		t.Error("RetryAfter of an error that says nothing")
	}
}

// A forge, or a proxy in front of it, that refuses git's request with a
// text/plain 403 echoing the Authorization header: git prints the body on
// its stderr ("remote: denied: Basic …"), and the node's error, its logs
// and the task's events quote that. git sends the token as the base64 of
// user:token, so redacting the raw token alone leaves it readable. (A 401
// would stop git at a credential prompt first.)
func TestGitErrorsDoNotEchoTheEncodedToken(t *testing.T) {
	needGit(t)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusForbidden)
		_, _ = w.Write([]byte("denied: " + r.Header.Get("Authorization") + "\n"))
	}))
	defer srv.Close()
	auth := &Auth{Token: testToken}
	basic := base64.StdEncoding.EncodeToString([]byte("x-access-token:" + testToken))
	leaks := func(what string, err error) {
		t.Helper()
		if err == nil {
			t.Fatalf("%s: no error", what)
		}
		msg := err.Error()
		if !strings.Contains(msg, "denied") {
			t.Fatalf("%s: the error does not quote the forge's answer, so the test proves nothing: %v", what, err)
		}
		if strings.Contains(msg, testToken) || strings.Contains(msg, strings.TrimRight(basic, "=")) || strings.Contains(msg, basic[:12]) {
			t.Errorf("%s: the error repeats the token: %v", what, err)
		}
	}
	ctx := context.Background()
	c := &Cache{Dir: t.TempDir(), Auth: func(string) *Auth { return auth }}
	_, err := c.Mirror(ctx, srv.URL+"/o/r", "")
	leaks("mirror", err)

	repo, _ := newRepo(t)
	ws := newWorkspace(t, repo)
	leaks("push", ws.Push(ctx, srv.URL+"/o/r", auth, "agent/t1", ws.Commit))
}

// A forge's refusal can be as long as it likes: go-github read the whole
// body and its ErrorResponse quoted the whole message, and the finish step
// logs the error at every retry and records it in the task's last event.
// Every answer is read up to maxAnswerBytes (4 MiB), and the error text is cut.
func TestAdapterErrorsAreBoundedWhateverTheForgeSends(t *testing.T) {
	huge := strings.Repeat("x", 32<<20)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("content-type", "application/json")
		w.WriteHeader(http.StatusForbidden)
		_, _ = w.Write([]byte(`{"message":"` + huge + `"}`))
	}))
	defer srv.Close()
	for kind, err := range ensurePRErrors(t, srv.URL, testToken) {
		if err == nil {
			t.Fatalf("%s: no error", kind)
		}
		if n := len(err.Error()); n > 4<<10 {
			t.Errorf("%s: an error of %d bytes: %.200s…", kind, n, err)
		}
		if !strings.Contains(err.Error(), "403") {
			t.Errorf("%s: the error lost the forge's status: %.300s", kind, err)
		}
	}
	// Just under the read limit, so read whole and parsed: the message is
	// still cut.
	mid := strings.Repeat("y", 4<<20-100)
	srv2 := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("content-type", "application/json")
		w.WriteHeader(http.StatusForbidden)
		_, _ = w.Write([]byte(`{"message":"` + mid + `"}`))
	}))
	defer srv2.Close()
	for kind, err := range ensurePRErrors(t, srv2.URL, "") {
		if err == nil || len(err.Error()) > 4<<10 {
			t.Errorf("%s (no token): an error of %d bytes", kind, len(fmt.Sprint(err)))
		}
	}
}

// A forge's pull request URL is recorded in the task's events: an absurd
// one (over maxPRURL) is refused, not recorded.
func TestAdapterRefusesAnAbsurdPRURL(t *testing.T) {
	long := "https://forge.test/acme/calc/pull/1?" + strings.Repeat("z", 1<<20)
	for _, kind := range []string{"github", "gitea", "gitlab"} {
		t.Run(kind, func(t *testing.T) {
			fake := &fakePRs{prs: []map[string]any{{"n": 1, "url": long, "head": "agent/t1"}}}
			srv := fake.serve(t, kind)
			f, err := New(kind, srv.URL, "tok")
			if err != nil {
				t.Fatal(err)
			}
			pr, err := f.EnsurePR(context.Background(), PRRequest{Repo: RepoRef{Owner: "acme", Name: "calc"}, Head: "agent/t1", Base: "main", Title: "t"})
			if err == nil || !strings.Contains(err.Error(), "URL") || len(err.Error()) > 4<<10 {
				t.Fatalf("EnsurePR = %+v, %.300v; want an error naming the URL", pr, err)
			}
		})
	}
}
