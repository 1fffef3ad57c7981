package forge

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/google/go-github/v75/github"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/api/textcut"
)

// PRRequest is a pull request to open.
type PRRequest struct {
	Repo  RepoRef
	Head  string // the agent's branch
	Base  string // the branch it merges into
	Title string
	Body  string
	Draft bool
}

// RepoRef names a repository on a forge: Owner and Name are the last two
// elements of its path (GitHub, Gitea); Path is all of it (GitLab's
// groups and subgroups).
type RepoRef struct {
	Owner, Name string
	Path        string
}

func (r RepoRef) fullPath() string {
	if r.Path != "" {
		return r.Path
	}
	return r.Owner + "/" + r.Name
}

func (r RepoRef) String() string { return r.Owner + "/" + r.Name }

// RepoFromURL takes owner and name from a repository URL's last two path
// elements (https://host/owner/name.git, git@host:owner/name.git).
func RepoFromURL(repo string) (RepoRef, error) {
	p := repo
	if u, err := url.Parse(repo); err == nil && u.Scheme != "" {
		p = u.Path
	} else if _, after, ok := strings.Cut(repo, ":"); ok && !strings.HasPrefix(repo, "/") {
		p = after
	}
	parts := strings.Split(strings.Trim(strings.TrimSuffix(strings.TrimSuffix(p, "/"), ".git"), "/"), "/")
	if len(parts) < 2 || parts[len(parts)-1] == "" || parts[len(parts)-2] == "" {
		return RepoRef{}, fmt.Errorf("%q: cannot tell the forge's owner/name from it", repo)
	}
	return RepoRef{Owner: parts[len(parts)-2], Name: parts[len(parts)-1], Path: strings.Join(parts, "/")}, nil
}

// PullRequest is an opened (or found) pull request.
type PullRequest struct {
	Number  int    `json:"number"`
	URL     string `json:"url"`
	Created bool   `json:"created"`           // false: it existed (a retry)
	Updated bool   `json:"updated,omitempty"` // it existed with another title or body, now the ones asked
}

// Forge opens pull requests. Its adapters can do nothing else: no merge,
// no repository, fork or visibility change, no other branch.
type Forge interface {
	Name() string
	// EnsurePR returns the open pull request from req.Head, opening it if
	// there is none, so a retry never opens a second one. A found one
	// whose title or body differ from req's gets req's (its draft state
	// kept), since the branch may now hold another diff.
	EnsurePR(ctx context.Context, req PRRequest) (*PullRequest, error)
}

// What the node takes from a forge's API, which may be hostile or broken:
// each answer is read up to maxAnswerBytes (far more than a page of pull
// requests, far less than a node's memory), an adapter's error text is cut
// to maxErrorText (the finish step logs it at every retry and records the
// last in the task's events), and a pull request's URL, recorded in the
// task's events, is refused over maxPRURL (real ones are under 200 bytes).
const (
	maxAnswerBytes = 4 << 20
	maxErrorText   = 1000
	maxPRURL       = 2 << 10
)

// New makes the adapter of a kind: github (REST, go-github; apiURL "" is
// api.github.com), gitea (Gitea and Forgejo) or gitlab.
func New(kind, apiURL, token string) (Forge, error) {
	hc := &http.Client{Timeout: time.Minute, CheckRedirect: checkRedirect, Transport: limitedTransport{http.DefaultTransport}}
	f, err := newAdapter(kind, apiURL, token, hc)
	if err != nil {
		return nil, err
	}
	return guarded{f, token}, nil
}

// errAnswerTooLarge is a forge answer over maxAnswerBytes.
var errAnswerTooLarge = fmt.Errorf("the forge's answer is over %d bytes", maxAnswerBytes)

// limitedTransport reads every answer's body up to maxAnswerBytes: a read
// past that fails with errAnswerTooLarge. go-github reads a refusal's body
// whole (CheckResponse), and doJSON a success's.
type limitedTransport struct{ base http.RoundTripper }

func (t limitedTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := t.base.RoundTrip(r)
	if err == nil && resp.Body != nil {
		resp.Body = &limitedBody{rc: resp.Body, left: maxAnswerBytes}
	}
	return resp, err
}

// limitedBody is a body of which at most left bytes more are read.
type limitedBody struct {
	rc   io.ReadCloser
	left int64 // -1: over
}

func (b *limitedBody) Read(p []byte) (int, error) {
	if b.left < 0 {
		return 0, errAnswerTooLarge
	}
	if int64(len(p)) > b.left+1 {
		p = p[:b.left+1] // one byte more tells a body of exactly the limit from a longer one
	}
	n, err := b.rc.Read(p)
	if int64(n) > b.left {
		// Closed now: go-github replaces a refusal's body with what it
		// read, and closes only that, which would leave the connection to
		// the forge open, still sending, until the client's timeout.
		_ = b.rc.Close()
		n, b.left = int(b.left), -1
		return n, errAnswerTooLarge
	}
	b.left -= int64(n)
	return n, err
}

func (b *limitedBody) Close() error { return b.rc.Close() }

// checkRedirect lets a forge API call follow a redirect only on the same
// host and scheme: a token header must not go to another host (Go drops
// only Authorization there, not GitLab's PRIVATE-TOKEN), nor from https
// to http, in clear.
func checkRedirect(r *http.Request, via []*http.Request) error {
	if len(via) > 0 && r.URL.Host != via[0].URL.Host {
		return fmt.Errorf("refusing a redirect from %s to another host, %s", via[0].URL.Host, r.URL.Host)
	}
	if len(via) > 0 && r.URL.Scheme != via[0].URL.Scheme {
		return fmt.Errorf("refusing a redirect from %s to %s", via[0].URL.Scheme, r.URL.Scheme)
	}
	if len(via) >= 5 {
		return errors.New("too many redirects")
	}
	return nil
}

// guarded is an adapter whose errors never hold its token and are at
// most maxErrorText bytes (and "…"), and whose pull request URL is at most
// maxPRURL: a forge, or a proxy in front of it, may echo the credential it
// was given in an error body, which the adapters quote, or send a message
// or a URL of any length; the finish step logs the error and records it,
// or the URL, in the task's events.
type guarded struct {
	Forge
	token string
}

func (g guarded) EnsurePR(ctx context.Context, req PRRequest) (*PullRequest, error) {
	pr, err := g.Forge.EnsurePR(ctx, req)
	if err != nil {
		// Redacted before the cut: a cut through the token would leave a
		// prefix no later redaction finds.
		text := err.Error()
		if msg := textcut.Ellipsis(redact(text, tokenForms(g.token)), maxErrorText); msg != text {
			d, _ := RetryAfter(err) // kept: the error is made anew
			err = &statusError{msg: msg, retryAfter: d}
		}
		return nil, err
	}
	if pr != nil && len(pr.URL) > maxPRURL {
		return nil, fmt.Errorf("%s: the forge gave pull request #%d a URL of %d bytes, over the %d allowed: refused, not recorded",
			g.Name(), pr.Number, len(pr.URL), maxPRURL)
	}
	return pr, nil
}

// statusError is a forge's refusal that may say when to try again.
type statusError struct {
	msg        string
	retryAfter time.Duration // 0: not said
}

func (e *statusError) Error() string { return e.msg }

// maxRetryAfter bounds the wait a forge's answer can ask for.
const maxRetryAfter = 10 * time.Minute

// RetryAfter is how long the forge asked the caller to wait before the
// next try (a rate limit: GitHub's primary or secondary one, or a
// Retry-After header on a 429 or 503), at most 10 minutes, if it did.
func RetryAfter(err error) (time.Duration, bool) {
	var d time.Duration
	var se *statusError
	var rl *github.RateLimitError
	var ab *github.AbuseRateLimitError
	var er *github.ErrorResponse
	switch {
	case errors.As(err, &se) && se.retryAfter > 0:
		d = se.retryAfter
	case errors.As(err, &rl):
		d = time.Until(rl.Rate.Reset.Time)
	case errors.As(err, &ab) && ab.RetryAfter != nil:
		d = *ab.RetryAfter
	case errors.As(err, &er) && er.Response != nil && er.Response.Header.Get("Retry-After") != "":
		d = api.RetryAfter(er.Response.Header, time.Now())
	default:
		return 0, false
	}
	return min(max(d, time.Second), maxRetryAfter), true
}

func newAdapter(kind, apiURL, token string, hc *http.Client) (Forge, error) {
	switch kind {
	case "github":
		c := github.NewClient(hc)
		if token != "" {
			c = c.WithAuthToken(token)
		}
		if apiURL != "" {
			u := strings.TrimSuffix(apiURL, "/") + "/"
			var err error
			if c, err = c.WithEnterpriseURLs(u, u); err != nil {
				return nil, fmt.Errorf("forge-url: %w", err)
			}
			c.BaseURL, _ = url.Parse(u) // as given: no /api/v3/ added
		}
		return &GitHub{c: c}, nil
	case "gitea", "forgejo":
		if apiURL == "" {
			return nil, fmt.Errorf("forge-url: required for %s", kind)
		}
		return &Gitea{base: strings.TrimSuffix(apiURL, "/"), token: token, hc: hc}, nil
	case "gitlab":
		if apiURL == "" {
			apiURL = "https://gitlab.com"
		}
		return &GitLab{base: strings.TrimSuffix(apiURL, "/"), token: token, hc: hc}, nil
	}
	return nil, fmt.Errorf("forge: %q is not github, gitea, forgejo or gitlab", kind)
}

// GitHub is the GitHub REST adapter.
type GitHub struct{ c *github.Client }

func (*GitHub) Name() string { return "github" }

func (g *GitHub) EnsurePR(ctx context.Context, req PRRequest) (*PullRequest, error) {
	open, _, err := g.c.PullRequests.List(ctx, req.Repo.Owner, req.Repo.Name, &github.PullRequestListOptions{
		State: "open", Head: req.Repo.Owner + ":" + req.Head, ListOptions: github.ListOptions{PerPage: 10}})
	if err != nil {
		return nil, fmt.Errorf("github: list pull requests: %w", err)
	}
	for _, pr := range open {
		if pr.GetHead().GetRef() == req.Head {
			found := &PullRequest{Number: pr.GetNumber(), URL: pr.GetHTMLURL()}
			if pr.GetTitle() != req.Title || pr.GetBody() != req.Body { // GitHub's draft state is no part of the title
				if _, _, err := g.c.PullRequests.Edit(ctx, req.Repo.Owner, req.Repo.Name, pr.GetNumber(), &github.PullRequest{Title: &req.Title, Body: &req.Body}); err != nil {
					return nil, fmt.Errorf("github: update pull request #%d: %w", pr.GetNumber(), err)
				}
				found.Updated = true
			}
			return found, nil
		}
	}
	pr, _, err := g.c.PullRequests.Create(ctx, req.Repo.Owner, req.Repo.Name, &github.NewPullRequest{
		Title: &req.Title, Head: &req.Head, Base: &req.Base, Body: &req.Body, Draft: &req.Draft,
		MaintainerCanModify: github.Ptr(true)})
	if err != nil {
		return nil, fmt.Errorf("github: open pull request: %w", err)
	}
	return &PullRequest{Number: pr.GetNumber(), URL: pr.GetHTMLURL(), Created: true}, nil
}

// Gitea is the Gitea and Forgejo adapter (their /api/v1).
type Gitea struct {
	base, token string
	hc          *http.Client
}

func (*Gitea) Name() string { return "gitea" }

func (g *Gitea) EnsurePR(ctx context.Context, req PRRequest) (*PullRequest, error) {
	path := fmt.Sprintf("/api/v1/repos/%s/%s/pulls", url.PathEscape(req.Repo.Owner), url.PathEscape(req.Repo.Name))
	type branch struct {
		Ref  string `json:"ref"`
		Repo struct {
			FullName string `json:"full_name"`
		} `json:"repo"`
	}
	type pull struct {
		Number int    `json:"number"`
		URL    string `json:"html_url"`
		Title  string `json:"title"`
		Body   string `json:"body"`
		Head   branch `json:"head"`
		Base   branch `json:"base"`
	}
	// The list holds pull requests from forks too, whose branch may have
	// the same name: the task's is the one from the repository itself. A
	// page may hold fewer than the limit asked for (the server's
	// MAX_RESPONSE_ITEMS caps it), so only an empty page is the last.
	for page := 1; page <= 20; page++ {
		var batch []pull
		if err := doJSON(ctx, g.hc, "GET", g.base+path+fmt.Sprintf("?state=open&limit=50&page=%d", page), g.auth(), nil, &batch); err != nil {
			return nil, fmt.Errorf("gitea: list pull requests: %w", err)
		}
		if len(batch) == 0 {
			break
		}
		for _, pr := range batch {
			if pr.Head.Ref == req.Head && pr.Head.Repo.FullName != "" && strings.EqualFold(pr.Head.Repo.FullName, pr.Base.Repo.FullName) {
				found := &PullRequest{Number: pr.Number, URL: pr.URL}
				title := keepDraftMarker(pr.Title, req.Title, "WIP:", "[WIP]")
				if pr.Title != title || pr.Body != req.Body {
					edit := map[string]any{"title": title, "body": req.Body}
					if err := doJSON(ctx, g.hc, "PATCH", g.base+path+fmt.Sprintf("/%d", pr.Number), g.auth(), edit, &struct{}{}); err != nil {
						return nil, fmt.Errorf("gitea: update pull request #%d: %w", pr.Number, err)
					}
					found.Updated = true
				}
				return found, nil
			}
		}
	}
	title := req.Title
	if req.Draft {
		title = "WIP: " + title // Gitea's draft marker
	}
	var pr struct {
		Number int    `json:"number"`
		URL    string `json:"html_url"`
	}
	body := map[string]any{"head": req.Head, "base": req.Base, "title": title, "body": req.Body}
	if err := doJSON(ctx, g.hc, "POST", g.base+path, g.auth(), body, &pr); err != nil {
		return nil, fmt.Errorf("gitea: open pull request: %w", err)
	}
	return &PullRequest{Number: pr.Number, URL: pr.URL, Created: true}, nil
}

func (g *Gitea) auth() http.Header {
	h := http.Header{}
	if g.token != "" {
		h.Set("Authorization", "token "+g.token)
	}
	return h
}

// GitLab is the GitLab adapter (merge requests, /api/v4).
type GitLab struct {
	base, token string
	hc          *http.Client
}

func (*GitLab) Name() string { return "gitlab" }

func (g *GitLab) EnsurePR(ctx context.Context, req PRRequest) (*PullRequest, error) {
	project := url.PathEscape(req.Repo.fullPath())
	path := g.base + "/api/v4/projects/" + project + "/merge_requests"
	var open []struct {
		IID         int    `json:"iid"`
		URL         string `json:"web_url"`
		Title       string `json:"title"`
		Description string `json:"description"`
		Source      int    `json:"source_project_id"`
		Target      int    `json:"target_project_id"`
	}
	q := url.Values{"state": {"opened"}, "source_branch": {req.Head}, "per_page": {"100"}}
	if err := doJSON(ctx, g.hc, "GET", path+"?"+q.Encode(), g.auth(), nil, &open); err != nil {
		return nil, fmt.Errorf("gitlab: list merge requests: %w", err)
	}
	// A fork's merge request may come from a branch of the same name: the
	// task's comes from the project itself.
	for _, mr := range open {
		if mr.Source != 0 && mr.Source == mr.Target {
			found := &PullRequest{Number: mr.IID, URL: mr.URL}
			title := keepDraftMarker(mr.Title, req.Title, "Draft:", "[Draft]", "(Draft)")
			if mr.Title != title || mr.Description != req.Body {
				edit := map[string]any{"title": title, "description": req.Body}
				if err := doJSON(ctx, g.hc, "PUT", path+fmt.Sprintf("/%d", mr.IID), g.auth(), edit, &struct{}{}); err != nil {
					return nil, fmt.Errorf("gitlab: update merge request !%d: %w", mr.IID, err)
				}
				found.Updated = true
			}
			return found, nil
		}
	}
	title := req.Title
	if req.Draft {
		title = "Draft: " + title
	}
	var mr struct {
		IID int    `json:"iid"`
		URL string `json:"web_url"`
	}
	body := map[string]any{"source_branch": req.Head, "target_branch": req.Base, "title": title, "description": req.Body}
	if err := doJSON(ctx, g.hc, "POST", path, g.auth(), body, &mr); err != nil {
		return nil, fmt.Errorf("gitlab: open merge request: %w", err)
	}
	return &PullRequest{Number: mr.IID, URL: mr.URL, Created: true}, nil
}

func (g *GitLab) auth() http.Header {
	h := http.Header{}
	if g.token != "" {
		h.Set("PRIVATE-TOKEN", g.token)
	}
	return h
}

// keepDraftMarker is title for a found pull request whose title is found:
// with found's draft marker (one of markers, which Gitea and GitLab read
// at the start of a title) if it has one, so an update neither marks
// ready a draft nor makes a draft again one a person marked ready.
func keepDraftMarker(found, title string, markers ...string) string {
	for _, m := range markers {
		if len(found) >= len(m) && strings.EqualFold(found[:len(m)], m) {
			return found[:len(m)] + " " + title
		}
	}
	return title
}

// doJSON sends a JSON request and decodes a 2xx JSON answer into out.
func doJSON(ctx context.Context, hc *http.Client, method, u string, h http.Header, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return err
	}
	for k, v := range h {
		req.Header[k] = v
	}
	req.Header.Set("Accept", "application/json")
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, rerr := io.ReadAll(io.LimitReader(resp.Body, maxAnswerBytes+1))
	if rerr == nil && len(b) > maxAnswerBytes {
		rerr = errAnswerTooLarge // a client without limitedTransport
	}
	if resp.StatusCode/100 != 2 {
		msg := strings.TrimSpace(string(b))
		// A body that echoes the credential loses it before the cut: a
		// cut through it would leave a prefix no later redaction finds.
		var secrets []string
		for _, vs := range h {
			for _, v := range vs {
				for _, secret := range []string{v, v[strings.LastIndexByte(v, ' ')+1:]} {
					if len(secret) >= 8 {
						secrets = append(secrets, tokenForms(secret)...)
					}
				}
			}
		}
		msg = textcut.Ellipsis(redact(msg, secrets), 300)
		return &statusError{msg: fmt.Sprintf("%s %s: %s: %s", method, req.URL.Path, resp.Status, msg),
			retryAfter: api.RetryAfter(resp.Header, time.Now())}
	}
	if rerr != nil {
		return fmt.Errorf("%s %s: %s: %w", method, req.URL.Path, resp.Status, rerr)
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("%s %s: the answer is not the JSON expected: %v", method, req.URL.Path, err)
	}
	return nil
}
