package model

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
)

// OpenAI is Chat Completions (POST {BaseURL}/chat/completions) at OpenAI
// or any compatible server (vLLM, llama.cpp, Ollama).
type OpenAI struct {
	BaseURL string // "" means https://api.openai.com/v1
	APIKey  string // may be empty for a local server; never logged
	HTTP    *http.Client
}

// Name is "openai".
func (*OpenAI) Name() string { return "openai" }

type (
	oaiFunction struct {
		Name        string          `json:"name"`
		Description string          `json:"description,omitempty"`
		Parameters  json.RawMessage `json:"parameters"`
	}
	oaiTool struct {
		Type     string      `json:"type"`
		Function oaiFunction `json:"function"`
	}
	oaiCall struct {
		ID       string `json:"id"`
		Type     string `json:"type"`
		Function struct {
			Name      string `json:"name"`
			Arguments string `json:"arguments"`
		} `json:"function"`
	}
	oaiMessage struct {
		Role       string    `json:"role"`
		Content    *string   `json:"content"`
		ToolCalls  []oaiCall `json:"tool_calls,omitempty"`
		ToolCallID string    `json:"tool_call_id,omitempty"`
	}
	oaiRequest struct {
		Model     string       `json:"model"`
		Messages  []oaiMessage `json:"messages"`
		Tools     []oaiTool    `json:"tools,omitempty"`
		MaxTokens int          `json:"max_tokens"`
	}
	oaiResponse struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Model   string `json:"model"`
		Choices []struct {
			Message struct {
				Role      string    `json:"role"`
				Content   *string   `json:"content"`
				ToolCalls []oaiCall `json:"tool_calls"`
			} `json:"message"`
			FinishReason *string `json:"finish_reason"`
		} `json:"choices"`
		Usage *struct {
			PromptTokens        int64 `json:"prompt_tokens"`
			CompletionTokens    int64 `json:"completion_tokens"`
			PromptTokensDetails *struct {
				CachedTokens int64 `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
)

// openaiBody renders req as a Chat Completions request body. Tool results
// become "tool" messages after the assistant's tool_calls; a user turn's
// text blocks become one user message.
func openaiBody(req Request) ([]byte, error) {
	out := oaiRequest{Model: req.Model, MaxTokens: req.MaxTokens}
	str := func(s string) *string { return &s }
	if req.System != "" {
		out.Messages = append(out.Messages, oaiMessage{Role: "system", Content: str(req.System)})
	}
	for _, t := range req.Tools {
		out.Tools = append(out.Tools, oaiTool{Type: "function", Function: oaiFunction{Name: t.Name, Description: t.Description, Parameters: t.InputSchema}})
	}
	for _, m := range req.Messages {
		var text []string
		var calls []oaiCall
		var results []oaiMessage
		for _, b := range m.Content {
			switch b.Type {
			case BlockText:
				text = append(text, b.Text)
			case BlockToolUse:
				c := oaiCall{ID: b.ID, Type: "function"}
				c.Function.Name, c.Function.Arguments = b.Name, string(b.Input)
				calls = append(calls, c)
			case BlockToolResult:
				content := b.Content
				if b.IsError {
					content = "error: " + content
				}
				results = append(results, oaiMessage{Role: "tool", ToolCallID: b.ToolUseID, Content: str(content)})
			}
		}
		out.Messages = append(out.Messages, results...)
		if len(text) > 0 || len(calls) > 0 {
			om := oaiMessage{Role: m.Role, ToolCalls: calls}
			if len(text) > 0 {
				om.Content = str(strings.Join(text, "\n"))
			}
			out.Messages = append(out.Messages, om)
		}
	}
	return json.Marshal(out)
}

// Call sends one request.
func (o *OpenAI) Call(ctx context.Context, req Request) (*Response, error) {
	if err := req.Check(); err != nil {
		return nil, fmt.Errorf("openai: %w", err)
	}
	body, err := openaiBody(req)
	if err != nil {
		return nil, err
	}
	base := strings.TrimSuffix(o.BaseURL, "/")
	if base == "" {
		base = "https://api.openai.com/v1"
	}
	h := http.Header{}
	if o.APIKey != "" {
		h.Set("authorization", "Bearer "+o.APIKey)
	}
	raw, err := post(ctx, o.HTTP, "openai", base+"/chat/completions", h, body, o.APIKey)
	if err != nil {
		return nil, err
	}
	return decodeOpenAI(raw)
}

// decodeOpenAI reads a Chat Completions response body.
func decodeOpenAI(raw []byte) (*Response, error) {
	var r oaiResponse
	if err := json.Unmarshal(raw, &r); err != nil {
		return nil, fmt.Errorf("openai: %w: %v", ErrMalformed, err)
	}
	if len(r.Choices) == 0 || r.Choices[0].FinishReason == nil || r.Usage == nil {
		return nil, fmt.Errorf("openai: %w: want a choice with a finish_reason, and usage", ErrMalformed)
	}
	ch := r.Choices[0]
	out := &Response{ID: r.ID, Model: r.Model, Raw: raw}
	switch *ch.FinishReason {
	case "stop":
		out.StopReason = StopEndTurn
	case "tool_calls", "function_call":
		out.StopReason = StopToolUse
	case "length":
		out.StopReason = StopMaxTokens
	case "content_filter":
		out.StopReason = StopContentFilter
	default:
		out.StopReason = *ch.FinishReason
	}
	cached := int64(0)
	if d := r.Usage.PromptTokensDetails; d != nil {
		cached = d.CachedTokens
	}
	out.Usage = Usage{InputTokens: r.Usage.PromptTokens - cached, CacheReadTokens: cached, OutputTokens: r.Usage.CompletionTokens}
	if err := out.Usage.check(); err != nil { // cached_tokens over prompt_tokens, too
		return nil, fmt.Errorf("openai: %w", err)
	}
	if ch.Message.Content != nil && *ch.Message.Content != "" {
		out.Content = append(out.Content, Block{Type: BlockText, Text: *ch.Message.Content})
	}
	cut := out.StopReason == StopMaxTokens
	for i, c := range ch.Message.ToolCalls {
		args := json.RawMessage(c.Function.Arguments)
		if c.Function.Arguments == "" && !cut {
			args = json.RawMessage("{}")
		}
		if c.Function.Name == "" || !json.Valid(args) {
			if cut {
				// The output limit cut the call short: it is dropped,
				// and the loop tells the model to continue.
				continue
			}
			if c.Function.Name == "" {
				return nil, fmt.Errorf("openai: %w: tool_calls[%d]: no name", ErrMalformed, i)
			}
			// The model's mistake, not the server's: the call is kept
			// with its text, and the loop answers it with a tool error,
			// so the model can call again.
			args, _ = json.Marshal(map[string]string{InvalidArgumentsKey: c.Function.Arguments})
		}
		// An empty or repeated id is the Gateway's to replace.
		out.Content = append(out.Content, Block{Type: BlockToolUse, ID: c.ID, Name: c.Function.Name, Input: args})
	}
	if out.StopReason == StopEndTurn && len(ch.Message.ToolCalls) > 0 {
		out.StopReason = StopToolUse // some servers say "stop" with tool calls
	}
	return out, nil
}
