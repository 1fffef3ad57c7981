package model

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/warrenhq/warren/actor"
)

const oaiOK = `{"id":"chatcmpl-1","object":"chat.completion","model":"gpt-5","choices":[{"index":0,
 "message":{"role":"assistant","content":"Found it.","tool_calls":[{"id":"call_2","type":"function","function":{"name":"finish","arguments":"{\"summary\":\"done\"}"}}]},
 "finish_reason":"tool_calls"}],
 "usage":{"prompt_tokens":2312,"completion_tokens":40,"total_tokens":2352,"prompt_tokens_details":{"cached_tokens":2000}}}`

// Any OpenAI-compatible server: the base URL carries its path prefix.
func TestOpenAIRequestAndResponse(t *testing.T) {
	f := newFake(t, "/compat/v1/chat/completions", fakeReply{status: 200, body: oaiOK})
	p := &OpenAI{BaseURL: f.URL + "/compat/v1", APIKey: "sk-oai-secret"}
	req := conversation()
	req.Model = "gpt-5"
	resp, err := p.Call(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	if h := f.headers[0]; h.Get("authorization") != "Bearer sk-oai-secret" {
		t.Errorf("authorization: %q", h.Get("authorization"))
	}
	b := f.body(0)
	if b["model"] != "gpt-5" || b["max_tokens"] != float64(1024) {
		t.Errorf("model, max_tokens: %v", b)
	}
	tools := b["tools"].([]any)
	fn := tools[0].(map[string]any)
	if len(tools) != 2 || fn["type"] != "function" || fn["function"].(map[string]any)["name"] != "read_file" ||
		fn["function"].(map[string]any)["parameters"].(map[string]any)["type"] != "object" {
		t.Errorf("tools: %v", tools)
	}
	msgs := b["messages"].([]any)
	roles := []string{}
	for _, m := range msgs {
		roles = append(roles, m.(map[string]any)["role"].(string))
	}
	if strings.Join(roles, ",") != "system,user,assistant,tool" {
		t.Fatalf("roles %v", roles)
	}
	as := msgs[2].(map[string]any)
	call := as["tool_calls"].([]any)[0].(map[string]any)
	if as["content"] != "Reading." || call["id"] != "toolu_1" || call["type"] != "function" ||
		call["function"].(map[string]any)["name"] != "read_file" || call["function"].(map[string]any)["arguments"] != `{"path":"main.go"}` {
		t.Errorf("assistant turn: %v", as)
	}
	if tm := msgs[3].(map[string]any); tm["tool_call_id"] != "toolu_1" || tm["content"] != "package main" {
		t.Errorf("tool message: %v", tm)
	}
	if resp.StopReason != StopToolUse || resp.Text() != "Found it." || len(resp.ToolUses()) != 1 || string(resp.ToolUses()[0].Input) != `{"summary":"done"}` {
		t.Errorf("response: %+v", resp)
	}
	// prompt_tokens includes the cached ones; Usage counts them apart.
	if resp.Usage != (Usage{InputTokens: 312, CacheReadTokens: 2000, OutputTokens: 40}) {
		t.Errorf("usage: %+v", resp.Usage)
	}
	if hr := resp.Usage.CacheHitRate(); hr < 0.86 || hr > 0.87 {
		t.Errorf("cache hit rate %.3f", hr)
	}
}

func TestOpenAIFinishReasonsAndMalformed(t *testing.T) {
	for fr, want := range map[string]string{"stop": StopEndTurn, "length": StopMaxTokens, "content_filter": StopContentFilter} {
		body := strings.Replace(strings.Replace(oaiOK, `"finish_reason":"tool_calls"`, `"finish_reason":"`+fr+`"`, 1), `"tool_calls":[`, `"x":[`, 1)
		f := newFake(t, "/chat/completions", fakeReply{status: 200, body: body})
		resp, err := (&OpenAI{BaseURL: f.URL}).Call(context.Background(), conversation())
		if err != nil || resp.StopReason != want {
			t.Errorf("%s: %v %+v", fr, err, resp)
		}
	}
	for name, rep := range map[string]fakeReply{
		"no choices":     {status: 200, body: `{"id":"x","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1}}`},
		"no usage":       {status: 200, body: strings.Replace(oaiOK, `"usage"`, `"nousage"`, 1)},
		"html, not json": {status: 200, body: `<html>bad gateway</html>`},
	} {
		f := newFake(t, "/chat/completions", rep)
		if _, err := (&OpenAI{BaseURL: f.URL}).Call(context.Background(), conversation()); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: %v; want ErrMalformed", name, err)
		}
	}
	// Arguments that are not JSON are the model's mistake: the call is
	// kept with their text, for the loop to answer with a tool error.
	f := newFake(t, "/chat/completions", fakeReply{status: 200, body: strings.Replace(oaiOK, `"{\"summary\":\"done\"}"`, `"{not json"`, 1)})
	resp, err := (&OpenAI{BaseURL: f.URL}).Call(context.Background(), conversation())
	if err != nil || len(resp.ToolUses()) != 1 || string(resp.ToolUses()[0].Input) != `{"`+InvalidArgumentsKey+`":"{not json"}` {
		t.Errorf("arguments that are not JSON: %v %+v", err, resp)
	}
	// A body the connection cuts short is the network's failure, retried.
	f = newFake(t, "/chat/completions", fakeReply{status: 200, body: oaiOK, truncAt: 50})
	var cut *HTTPError
	if _, err := (&OpenAI{BaseURL: f.URL}).Call(context.Background(), conversation()); !errors.As(err, &cut) || !cut.Retryable() || cut.Type != "transport" {
		t.Errorf("a body cut short: %v; want a retryable transport error", err)
	}
	f = newFake(t, "/chat/completions", fakeReply{status: 429, header: map[string]string{"retry-after-ms": "1500"}, body: `{"error":{"type":"requests","message":"Rate limit"}}`})
	var he *HTTPError
	if _, err := (&OpenAI{BaseURL: f.URL}).Call(context.Background(), conversation()); !errors.As(err, &he) || !he.Retryable() || he.RetryAfter != 1500*time.Millisecond {
		t.Errorf("429: %v", err)
	}
}

func TestScripted(t *testing.T) {
	path := filepath.Join(t.TempDir(), "turns.jsonl")
	os.WriteFile(path, []byte(`# a fix in two turns
{"content":[{"type":"text","text":"Let me look."},{"type":"tool_use","name":"read_file","input":{"path":"main.go"}}],"usage":{"input_tokens":100,"output_tokens":20}}
{"content":[{"type":"tool_use","name":"finish","input":{"summary":"fixed"}}]}
`), 0o644)
	s, err := NewScripted(path)
	if err != nil {
		t.Fatal(err)
	}
	req := conversation()
	req.Messages = req.Messages[:1]
	r1, err := s.Call(context.Background(), req)
	if err != nil || r1.StopReason != StopToolUse || r1.ToolUses()[0].Name != "read_file" || r1.ToolUses()[0].ID == "" || r1.Usage.InputTokens != 100 {
		t.Fatalf("turn 1: %+v %v", r1, err)
	}
	// The same conversation gets the same turn (replay is stateless).
	if again, _ := s.Call(context.Background(), req); again.ToolUses()[0].ID != r1.ToolUses()[0].ID {
		t.Error("the same conversation got another turn")
	}
	req = conversation() // one assistant turn in it
	if r2, err := s.Call(context.Background(), req); err != nil || r2.ToolUses()[0].Name != "finish" {
		t.Fatalf("turn 2: %+v %v", r2, err)
	}
	req.Messages = append(req.Messages, Message{Role: RoleAssistant, Content: []Block{{Type: BlockText, Text: "x"}}}, Message{Role: RoleUser, Content: []Block{{Type: BlockText, Text: "y"}}})
	if _, err := s.Call(context.Background(), req); err == nil || !strings.Contains(err.Error(), "has 2 turns") {
		t.Errorf("past the end: %v", err)
	}
	for name, body := range map[string]string{
		"not json":      "{\n",
		"unknown field": `{"content":[],"surprise":1}`,
		"bad block":     `{"content":[{"type":"image"}]}`,
		"empty":         "# nothing\n",
		// A negative count would lower what the task has spent.
		"negative usage": `{"content":[{"type":"text","text":"x"}],"usage":{"input_tokens":-1000000}}`,
	} {
		p := filepath.Join(t.TempDir(), "bad.jsonl")
		os.WriteFile(p, []byte(body), 0o644)
		if _, err := NewScripted(p); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// Two calls of 60% of a minute's tokens each: the second waits for the
// bucket to refill, then both settle what they did not use.
func TestLimiter(t *testing.T) {
	clock := actor.NewFakeClock(time.Unix(1e9, 0))
	l := NewLimiter(1000, clock)
	ctx := context.Background()
	if err := l.Wait(ctx, 600); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- l.Wait(ctx, 600) }()
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := clock.WaitForTimers(wctx, 1); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
		t.Fatal("the second call did not wait")
	default:
	}
	clock.Advance(12 * time.Second) // 200 tokens: 400 + 200 = 600
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the second call still waits after the refill")
	}
	l.Settle(600, 100) // used 100 of 600
	l.mu.Lock()
	got := l.tokens
	l.mu.Unlock()
	if got < 499 || got > 501 {
		t.Errorf("after settling: %.0f tokens, want 500", got)
	}
}

func TestRequestCheck(t *testing.T) {
	r := Request{Tools: []Tool{{Name: "a", InputSchema: json.RawMessage(`{`)}, {Name: "a", InputSchema: json.RawMessage(`{}`)}},
		Messages: []Message{{Role: "system", Content: []Block{{Type: "image"}}}}}
	err := r.Check()
	for _, want := range []string{"model: required", "max_tokens", "tools[0].input_schema", "tools[1].name", "messages[0].role", "messages[0].content[0].type"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("want %q in %v", want, err)
		}
	}
}

// A Chat Completions response cut by its output limit (finish_reason
// "length") ends in the middle of a tool call's arguments: that call is
// dropped (an empty arguments string too: it was cut before it began), the
// whole calls stay, and the stop reason tells the loop to ask for the rest.
func TestOpenAILengthCutDropsTheCutToolCall(t *testing.T) {
	for name, c := range map[string]struct {
		calls string
		want  []string // the tool calls kept
	}{
		"cut in the arguments": {`{"id":"call_1","type":"function","function":{"name":"write_file","arguments":"{\"path\":\"big.go\",\"content\":\"package big\\n\\nfunc"}}`, nil},
		"cut before them":      {`{"id":"call_1","type":"function","function":{"name":"finish","arguments":""}}`, nil},
		"a whole call first": {`{"id":"call_0","type":"function","function":{"name":"read_file","arguments":"{\"path\":\"a.go\"}"}},` +
			`{"id":"call_1","type":"function","function":{"name":"write_file","arguments":"{\"path\":"}}`, []string{"read_file"}},
	} {
		body := `{"id":"c","object":"chat.completion","model":"m","choices":[{"message":{"role":"assistant","content":null,"tool_calls":[` + c.calls +
			`]},"finish_reason":"length"}],"usage":{"prompt_tokens":10,"completion_tokens":256}}`
		r, err := decodeOpenAI([]byte(body))
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		var kept []string
		for _, tu := range r.ToolUses() {
			kept = append(kept, tu.Name)
		}
		if r.StopReason != StopMaxTokens || strings.Join(kept, ",") != strings.Join(c.want, ",") {
			t.Errorf("%s: stop reason %q, calls %v", name, r.StopReason, kept)
		}
	}
}

// Some OpenAI-compatible servers give every call of a response the same
// id, or none; the loop matches approvals and results by id. The gateway
// renames an empty id or one already taken (in the response or in the
// conversation), the same way for the same response.
func TestGatewayMakesToolCallIDsUnique(t *testing.T) {
	use := func(id string) Block {
		return Block{Type: BlockToolUse, ID: id, Name: "read_file", Input: json.RawMessage(`{}`)}
	}
	text := Block{Type: BlockText, Text: "x"}
	for name, c := range map[string]struct {
		content []Block
		want    []string // the ids after, "" for a text block
	}{
		"unique":             {[]Block{text, use("a"), use("b")}, []string{"", "a", "b"}},
		"repeated":           {[]Block{use("call_0"), text, use("call_0"), use("call_0")}, []string{"call_0", "", "call_0-3-2", "call_0-3-3"}},
		"none":               {[]Block{use(""), use("")}, []string{"call-3-0", "call-3-1"}},
		"in the history":     {[]Block{use("toolu_1")}, []string{"toolu_1-3-0"}},
		"new id sent too":    {[]Block{use("a"), use("a"), use("a-3-1")}, []string{"a", "a-3-1-1", "a-3-1"}},
		"new id in history":  {[]Block{use("toolu_1"), use("toolu_1-3-0")}, []string{"toolu_1-3-0-1", "toolu_1-3-0"}},
		"text blocks only":   {[]Block{text}, []string{""}},
		"no content at all":  {nil, nil},
		"empty, then its id": {[]Block{use(""), use("call-3-0")}, []string{"call-3-0-1", "call-3-0"}},
		// The node's own approvals (a push) have ids in this namespace.
		"reserved prefix": {[]Block{use("push-0123456789abcdef"), use("push-")}, []string{"call-3-0", "call-3-1"}},
	} {
		req := conversation() // toolu_1 is in its history
		req.Turn = 3
		uniqueToolIDs(c.content, req)
		var got []string
		for _, b := range c.content {
			got = append(got, b.ID)
		}
		if strings.Join(got, ",") != strings.Join(c.want, ",") {
			t.Errorf("%s: %q, want %q", name, got, c.want)
		}
	}

	// Through the gateway: two calls of one response never share an id,
	// and the same response gets the same ids again.
	body := `{"id":"c","object":"chat.completion","model":"m","choices":[{"message":{"role":"assistant","tool_calls":[{"id":"call_0","type":"function","function":{"name":"read_file","arguments":"{}"}},{"type":"function","function":{"name":"finish","arguments":"{}"}},{"id":"call_0","type":"function","function":{"name":"finish","arguments":"{}"}}]},"finish_reason":"tool_calls"}],"usage":{"prompt_tokens":10,"completion_tokens":5}}`
	f := newFake(t, "/chat/completions", fakeReply{status: 200, body: body}, fakeReply{status: 200, body: body})
	g := &Gateway{Provider: &OpenAI{BaseURL: f.URL}}
	var ids [2]string
	for i := range ids {
		res, err := g.Call(context.Background(), conversation())
		if err != nil {
			t.Fatal(err)
		}
		seen := map[string]bool{}
		for _, tu := range res.Response.ToolUses() {
			if tu.ID == "" || seen[tu.ID] {
				t.Errorf("tool call ids %+v", res.Response.ToolUses())
			}
			seen[tu.ID] = true
			ids[i] += tu.ID + " "
		}
	}
	if ids[0] != ids[1] {
		t.Errorf("the same response got other ids: %s, then %s", ids[0], ids[1])
	}
}
