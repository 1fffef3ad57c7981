package model

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warrenhq/warren/actor"
)

// fakeServer is an in-process stand-in for a provider's API (a FAKE
// model server, not a model): it records each request and answers with
// the next canned reply.
type fakeServer struct {
	t       *testing.T
	mu      sync.Mutex
	bodies  [][]byte
	headers []http.Header
	replies []fakeReply
	*httptest.Server
}

type fakeReply struct {
	status  int
	header  map[string]string
	body    string
	truncAt int // if > 0, declare the full length but send only this many bytes
}

func newFake(t *testing.T, path string, replies ...fakeReply) *fakeServer {
	f := &fakeServer{t: t, replies: replies}
	f.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != path || r.Method != http.MethodPost {
			http.Error(w, "not found", http.StatusNotFound)
			return
		}
		b, _ := io.ReadAll(r.Body)
		f.mu.Lock()
		f.bodies = append(f.bodies, b)
		f.headers = append(f.headers, r.Header.Clone())
		if len(f.replies) == 0 {
			f.mu.Unlock()
			http.Error(w, "no reply left", http.StatusTeapot)
			return
		}
		rep := f.replies[0]
		f.replies = f.replies[1:]
		f.mu.Unlock()
		for k, v := range rep.header {
			w.Header().Set(k, v)
		}
		w.Header().Set("content-type", "application/json")
		if rep.truncAt > 0 {
			w.Header().Set("content-length", fmtInt(len(rep.body)))
			w.WriteHeader(rep.status)
			w.Write([]byte(rep.body[:rep.truncAt]))
			w.(http.Flusher).Flush()
			panic(http.ErrAbortHandler) // cut the connection mid-body
		}
		w.WriteHeader(rep.status)
		io.WriteString(w, rep.body)
	}))
	t.Cleanup(f.Close)
	return f
}

func fmtInt(n int) string { b, _ := json.Marshal(n); return string(b) }

func (f *fakeServer) calls() int { f.mu.Lock(); defer f.mu.Unlock(); return len(f.bodies) }

func (f *fakeServer) body(i int) map[string]any {
	f.mu.Lock()
	defer f.mu.Unlock()
	var m map[string]any
	if err := json.Unmarshal(f.bodies[i], &m); err != nil {
		f.t.Fatalf("request %d is not JSON: %v", i, err)
	}
	return m
}

// conversation is a task's second call: system, two tools, a first turn
// that called a tool, and its result.
func conversation() Request {
	return Request{
		Model: "claude-sonnet-4-5", MaxTokens: 1024, System: "You fix bugs.",
		Tools: []Tool{
			{Name: "read_file", Description: "Read a file.", InputSchema: json.RawMessage(`{"type":"object","properties":{"path":{"type":"string"}},"required":["path"]}`)},
			{Name: "finish", Description: "Finish.", InputSchema: json.RawMessage(`{"type":"object","properties":{"summary":{"type":"string"}}}`)},
		},
		Messages: []Message{
			{Role: RoleUser, Content: []Block{{Type: BlockText, Text: "Fix the failing test."}}},
			{Role: RoleAssistant, Content: []Block{{Type: BlockText, Text: "Reading."}, {Type: BlockToolUse, ID: "toolu_1", Name: "read_file", Input: json.RawMessage(`{"path":"main.go"}`)}}},
			{Role: RoleUser, Content: []Block{{Type: BlockToolResult, ToolUseID: "toolu_1", Content: "package main", IsError: false}}},
		},
	}
}

const antOK = `{"id":"msg_01","type":"message","role":"assistant","model":"claude-sonnet-4-5",
 "content":[{"type":"text","text":"Found it."},{"type":"tool_use","id":"toolu_2","name":"finish","input":{"summary":"done"}}],
 "stop_reason":"tool_use","stop_sequence":null,
 "usage":{"input_tokens":12,"cache_creation_input_tokens":300,"cache_read_input_tokens":2000,"output_tokens":40}}`

func TestAnthropicRequestAndResponse(t *testing.T) {
	f := newFake(t, "/v1/messages", fakeReply{status: 200, body: antOK})
	p := &Anthropic{BaseURL: f.URL, APIKey: "sk-ant-test-secret"}
	resp, err := p.Call(context.Background(), conversation())
	if err != nil {
		t.Fatal(err)
	}
	h := f.headers[0]
	if h.Get("x-api-key") != "sk-ant-test-secret" || h.Get("anthropic-version") != AnthropicVersion || h.Get("content-type") != "application/json" {
		t.Errorf("headers: %v", h)
	}
	b := f.body(0)
	if b["model"] != "claude-sonnet-4-5" || b["max_tokens"] != float64(1024) {
		t.Errorf("model, max_tokens: %v %v", b["model"], b["max_tokens"])
	}
	cc := func(v any) any {
		m, _ := v.(map[string]any)
		return m["cache_control"]
	}
	eph := map[string]any{"type": "ephemeral"}
	sys := b["system"].([]any)
	if len(sys) != 1 || sys[0].(map[string]any)["text"] != "You fix bugs." || !equalJSON(cc(sys[0]), eph) {
		t.Errorf("system: %v", sys)
	}
	tools := b["tools"].([]any)
	if len(tools) != 2 || cc(tools[0]) != nil || !equalJSON(cc(tools[1]), eph) {
		t.Errorf("tools: cache_control must be on the last tool only: %v", tools)
	}
	if s := tools[0].(map[string]any)["input_schema"].(map[string]any); s["type"] != "object" {
		t.Errorf("tools[0].input_schema: %v", s)
	}
	msgs := b["messages"].([]any)
	if len(msgs) != 3 {
		t.Fatalf("messages: %v", msgs)
	}
	for i, m := range msgs {
		for j, blk := range m.(map[string]any)["content"].([]any) {
			last := i == 2 && j == len(m.(map[string]any)["content"].([]any))-1
			if got := cc(blk); (got != nil) != last {
				t.Errorf("messages[%d].content[%d].cache_control = %v; want it only on the last block of the last message", i, j, got)
			}
		}
	}
	tu := msgs[1].(map[string]any)["content"].([]any)[1].(map[string]any)
	if tu["type"] != "tool_use" || tu["id"] != "toolu_1" || tu["name"] != "read_file" || tu["input"].(map[string]any)["path"] != "main.go" {
		t.Errorf("tool_use: %v", tu)
	}
	tr := msgs[2].(map[string]any)["content"].([]any)[0].(map[string]any)
	if tr["type"] != "tool_result" || tr["tool_use_id"] != "toolu_1" || tr["content"] != "package main" {
		t.Errorf("tool_result: %v", tr)
	}
	if _, ok := tr["is_error"]; ok {
		t.Errorf("is_error false must be omitted: %v", tr)
	}

	if resp.ID != "msg_01" || resp.StopReason != StopToolUse || resp.Text() != "Found it." {
		t.Errorf("response: %+v", resp)
	}
	if tus := resp.ToolUses(); len(tus) != 1 || tus[0].ID != "toolu_2" || tus[0].Name != "finish" || string(tus[0].Input) != `{"summary":"done"}` {
		t.Errorf("tool uses: %+v", tus)
	}
	if resp.Usage != (Usage{InputTokens: 12, CacheWriteTokens: 300, CacheReadTokens: 2000, OutputTokens: 40}) {
		t.Errorf("usage: %+v", resp.Usage)
	}
	if !json.Valid(resp.Raw) || !strings.Contains(string(resp.Raw), "msg_01") {
		t.Error("the raw body is kept for the event log")
	}
}

func equalJSON(a, b any) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return string(x) == string(y)
}

func TestAnthropicStopReasons(t *testing.T) {
	for _, sr := range []string{"end_turn", "max_tokens", "stop_sequence", "tool_use", "pause_turn", "refusal"} {
		body := strings.Replace(antOK, `"stop_reason":"tool_use"`, `"stop_reason":"`+sr+`"`, 1)
		f := newFake(t, "/v1/messages", fakeReply{status: 200, body: body})
		resp, err := (&Anthropic{BaseURL: f.URL, APIKey: "k"}).Call(context.Background(), conversation())
		if err != nil || resp.StopReason != sr {
			t.Errorf("%s: %v %+v", sr, err, resp)
		}
	}
}

func TestAnthropicMalformed(t *testing.T) {
	for name, rep := range map[string]fakeReply{
		"not json":      {status: 200, body: `{"id":"msg_01",`},
		"no usage":      {status: 200, body: strings.Replace(antOK, `"usage"`, `"usage_gone"`, 1)},
		"no stop":       {status: 200, body: strings.Replace(antOK, `"stop_reason":"tool_use"`, `"stop_reason":null`, 1)},
		"bad tool_use":  {status: 200, body: strings.Replace(antOK, `"name":"finish"`, `"name":""`, 1)},
		"not a message": {status: 200, body: `{"type":"completion","completion":"hi"}`},
	} {
		f := newFake(t, "/v1/messages", rep)
		_, err := (&Anthropic{BaseURL: f.URL, APIKey: "k"}).Call(context.Background(), conversation())
		if !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: %v; want ErrMalformed", name, err)
		}
	}
	// A body the connection cuts short is the network's failure, retried
	// (it used to fail the task as malformed).
	f := newFake(t, "/v1/messages", fakeReply{status: 200, body: antOK, truncAt: 60})
	var cut *HTTPError
	if _, err := (&Anthropic{BaseURL: f.URL, APIKey: "k"}).Call(context.Background(), conversation()); !errors.As(err, &cut) || !cut.Retryable() || cut.Type != "transport" {
		t.Errorf("a body cut short: %v; want a retryable transport error", err)
	}
	// An error body in a 200 is the provider's error, not a message.
	f = newFake(t, "/v1/messages", fakeReply{status: 200, body: `{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`})
	var he *HTTPError
	if _, err := (&Anthropic{BaseURL: f.URL, APIKey: "k"}).Call(context.Background(), conversation()); !errors.As(err, &he) || !he.Retryable() {
		t.Errorf("error event in a 200: %v", err)
	}
}

// A 429 with retry-after is retried after exactly that wait; a 529
// overloaded with backoff; a 400 not at all. The clock is fake: the test
// advances it.
func TestGatewayRetries(t *testing.T) {
	clock := actor.NewFakeClock(time.Unix(1e9, 0))
	f := newFake(t, "/v1/messages",
		fakeReply{status: 429, header: map[string]string{"retry-after": "7"}, body: `{"type":"error","error":{"type":"rate_limit_error","message":"slow down"}}`},
		fakeReply{status: 529, body: `{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`},
		fakeReply{status: 200, body: antOK},
		fakeReply{status: 400, body: `{"type":"error","error":{"type":"invalid_request_error","message":"bad"}}`},
	)
	var retries []RetryEvent
	g := &Gateway{Provider: &Anthropic{BaseURL: f.URL, APIKey: "k"}, Clock: clock, Jitter: func() float64 { return 0 },
		Retry: RetryPolicy{Base: 2 * time.Second}, Price: Price{Input: 3, CacheWrite: 3.75, CacheRead: 0.3, Output: 15},
		OnRetry: func(e RetryEvent) { retries = append(retries, e) }}
	type out struct {
		r   *Result
		err error
	}
	done := make(chan out, 1)
	go func() { r, err := g.Call(context.Background(), conversation()); done <- out{r, err} }()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// First wait: the server's 7 s.
	if err := clock.WaitForTimers(ctx, 1); err != nil {
		t.Fatal(err)
	}
	clock.Advance(6999 * time.Millisecond)
	if f.calls() != 1 {
		t.Fatalf("retried before retry-after: %d calls", f.calls())
	}
	clock.Advance(time.Millisecond)
	// Second wait (the second attempt's backoff): 2 s × 2 × (0.5 + 0.5 ×
	// jitter 0) = 2 s.
	if err := clock.WaitForTimers(ctx, 1); err != nil {
		t.Fatal(err)
	}
	clock.Advance(2 * time.Second)
	var res out
	select {
	case res = <-done:
	case <-time.After(10 * time.Second):
		t.Fatalf("the call did not end; %d calls, retries %+v", f.calls(), retries)
	}
	if res.err != nil {
		t.Fatal(res.err)
	}
	if res.r.Attempts != 3 || f.calls() != 3 || len(retries) != 2 || retries[0].Wait != 7*time.Second || retries[1].Wait != 2*time.Second {
		t.Fatalf("attempts %d, calls %d, retries %+v", res.r.Attempts, f.calls(), retries)
	}
	// 12×3 + 300×3.75 + 2000×0.3 + 40×15 = 36 + 1125 + 600 + 600 µ$.
	if res.r.CostMicroUSD != 2361 {
		t.Errorf("cost: %d µ$, want 2361", res.r.CostMicroUSD)
	}
	_, err := g.Call(context.Background(), conversation())
	var he *HTTPError
	if !errors.As(err, &he) || he.Status != 400 || f.calls() != 4 {
		t.Fatalf("a 400 must not be retried: %v, %d calls", err, f.calls())
	}
}

func TestCredentialsStayOut(t *testing.T) {
	const key = "sk-ant-very-secret-key"
	f := newFake(t, "/v1/messages", fakeReply{status: 401, body: `{"type":"error","error":{"type":"authentication_error","message":"invalid x-api-key"}}`})
	_, err := (&Anthropic{BaseURL: f.URL, APIKey: key}).Call(context.Background(), conversation())
	if err == nil || strings.Contains(err.Error(), key) {
		t.Fatalf("error %v", err)
	}
	// A transport error names the URL, never the key.
	_, err = (&Anthropic{BaseURL: "http://127.0.0.1:1", APIKey: key}).Call(context.Background(), conversation())
	if err == nil || strings.Contains(err.Error(), key) {
		t.Fatalf("transport error %v", err)
	}
	var he *HTTPError
	if !errors.As(err, &he) || !he.Retryable() {
		t.Errorf("a transport error is retried: %v", err)
	}
}

// Some proxies echo the key they were given in their error message: it is
// redacted before the message is shortened (a cut through the key would
// leave its first half), in a non-200's body and in an error in a 200's.
func TestCredentialsEchoedByTheServerAreRedacted(t *testing.T) {
	const key = "sk-proxy-very-secret-key"
	echo := func(prefix string) string {
		return `{"type":"error","error":{"type":"auth_error","message":"` + prefix + `Received API Key = ` + key + `"}}`
	}
	for name, c := range map[string]struct {
		p    Provider
		path string
		rep  fakeReply
	}{
		"openai 401":          {&OpenAI{APIKey: key}, "/chat/completions", fakeReply{status: 401, body: echo("Invalid proxy server token. ")}},
		"anthropic 401":       {&Anthropic{APIKey: key}, "/v1/messages", fakeReply{status: 401, body: echo("")}},
		"anthropic 200 error": {&Anthropic{APIKey: key}, "/v1/messages", fakeReply{status: 200, body: echo("")}},
		"cut through the key": {&OpenAI{APIKey: key}, "/chat/completions", fakeReply{status: 403, body: echo(strings.Repeat("x", 300-len("Received API Key = ")-len(key)/2))}},
	} {
		f := newFake(t, c.path, c.rep)
		switch p := c.p.(type) {
		case *OpenAI:
			p.BaseURL = f.URL
		case *Anthropic:
			p.BaseURL = f.URL
		}
		_, err := c.p.Call(context.Background(), conversation())
		var he *HTTPError
		if !errors.As(err, &he) || !strings.Contains(he.Message, "[redacted]") || strings.Contains(err.Error(), key[:len(key)/2]) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// A response cut by its output limit ends in the middle of its last
// tool_use, whose input (parsed by the server from what was written so
// far) may look whole: that call is dropped, not run; the calls before it
// stay, and the stop reason tells the loop to ask for the rest.
func TestAnthropicMaxTokensDropsTheCutToolUse(t *testing.T) {
	body := strings.Replace(strings.Replace(antOK, `"stop_reason":"tool_use"`, `"stop_reason":"max_tokens"`, 1),
		`{"type":"text","text":"Found it."},`, `{"type":"text","text":"Found it."},{"type":"tool_use","id":"toolu_1","name":"read_file","input":{"path":"a.go"}},`, 1)
	r, err := decodeAnthropic([]byte(body))
	if err != nil || r.StopReason != StopMaxTokens || len(r.ToolUses()) != 1 || r.ToolUses()[0].ID != "toolu_1" {
		t.Fatalf("%+v %v", r, err)
	}
	// A cut input that is not JSON is no malformed response either.
	body = strings.Replace(strings.Replace(antOK, `"stop_reason":"tool_use"`, `"stop_reason":"max_tokens"`, 1), `{"summary":"done"}`, `"{\"summ"`, 1)
	if r, err := decodeAnthropic([]byte(body)); err != nil || len(r.ToolUses()) != 0 || r.Text() != "Found it." {
		t.Fatalf("%+v %v", r, err)
	}
}

// A failed attempt gives back the tokens it took from the node's limiter:
// repeated 429s or 5xx drained the budget every task shares.
func TestFailedCallsGiveBackTheirTokens(t *testing.T) {
	clock := actor.NewFakeClock(time.Unix(1e9, 0))
	f := newFake(t, "/v1/messages", fakeReply{status: 500, body: `{"type":"error","error":{"type":"api_error","message":"boom"}}`})
	l := NewLimiter(100_000, clock)
	g := &Gateway{Provider: &Anthropic{BaseURL: f.URL, APIKey: "k"}, Clock: clock, Limiter: l, Retry: RetryPolicy{MaxAttempts: 1}}
	req := conversation()
	req.MaxTokens = 8000
	if _, err := g.Call(context.Background(), req); err == nil {
		t.Fatal("the call did not fail")
	}
	l.mu.Lock()
	got := l.tokens
	l.mu.Unlock()
	if got < 99_999 {
		t.Errorf("after a failed call the limiter has %.0f of 100000 tokens", got)
	}
}
