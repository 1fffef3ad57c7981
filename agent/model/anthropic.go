package model

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
)

// AnthropicVersion is the Messages API version sent with every request.
const AnthropicVersion = "2023-06-01"

// Anthropic is the Messages API (POST {BaseURL}/v1/messages).
type Anthropic struct {
	BaseURL string // "" means https://api.anthropic.com
	APIKey  string // from the node's config or environment; never logged
	HTTP    *http.Client
}

// Name is "anthropic".
func (*Anthropic) Name() string { return "anthropic" }

// The wire shapes. cache_control is set on the last tool, the last system
// block and the last block of the last message: three of the four
// breakpoints the API allows, so a call reads everything before its newest
// turn from the cache and writes the rest.
type (
	antCache struct {
		Type string `json:"type"`
	}
	antText struct {
		Type         string    `json:"type"`
		Text         string    `json:"text"`
		CacheControl *antCache `json:"cache_control,omitempty"`
	}
	antTool struct {
		Name         string          `json:"name"`
		Description  string          `json:"description,omitempty"`
		InputSchema  json.RawMessage `json:"input_schema"`
		CacheControl *antCache       `json:"cache_control,omitempty"`
	}
	antBlock struct {
		Type         string          `json:"type"`
		Text         *string         `json:"text,omitempty"`
		ID           string          `json:"id,omitempty"`
		Name         string          `json:"name,omitempty"`
		Input        json.RawMessage `json:"input,omitempty"`
		ToolUseID    string          `json:"tool_use_id,omitempty"`
		Content      *string         `json:"content,omitempty"`
		IsError      bool            `json:"is_error,omitempty"`
		CacheControl *antCache       `json:"cache_control,omitempty"`
	}
	antMessage struct {
		Role    string     `json:"role"`
		Content []antBlock `json:"content"`
	}
	antRequest struct {
		Model     string       `json:"model"`
		MaxTokens int          `json:"max_tokens"`
		System    []antText    `json:"system,omitempty"`
		Tools     []antTool    `json:"tools,omitempty"`
		Messages  []antMessage `json:"messages"`
	}
	antResponse struct {
		ID      string `json:"id"`
		Type    string `json:"type"`
		Role    string `json:"role"`
		Model   string `json:"model"`
		Content []struct {
			Type  string          `json:"type"`
			Text  string          `json:"text"`
			ID    string          `json:"id"`
			Name  string          `json:"name"`
			Input json.RawMessage `json:"input"`
		} `json:"content"`
		StopReason *string `json:"stop_reason"`
		Usage      *struct {
			InputTokens              int64 `json:"input_tokens"`
			CacheCreationInputTokens int64 `json:"cache_creation_input_tokens"`
			CacheReadInputTokens     int64 `json:"cache_read_input_tokens"`
			OutputTokens             int64 `json:"output_tokens"`
		} `json:"usage"`
	}
)

var ephemeral = &antCache{Type: "ephemeral"}

// anthropicBody renders req as the Messages API's request body.
func anthropicBody(req Request) ([]byte, error) {
	out := antRequest{Model: req.Model, MaxTokens: req.MaxTokens}
	if req.System != "" {
		out.System = []antText{{Type: "text", Text: req.System, CacheControl: ephemeral}}
	}
	for _, t := range req.Tools {
		out.Tools = append(out.Tools, antTool{Name: t.Name, Description: t.Description, InputSchema: t.InputSchema})
	}
	if n := len(out.Tools); n > 0 {
		out.Tools[n-1].CacheControl = ephemeral
	}
	for _, m := range req.Messages {
		am := antMessage{Role: m.Role}
		for _, b := range m.Content {
			ab := antBlock{Type: b.Type}
			switch b.Type {
			case BlockText:
				text := b.Text
				ab.Text = &text
			case BlockToolUse:
				ab.ID, ab.Name, ab.Input = b.ID, b.Name, b.Input
			case BlockToolResult:
				content := b.Content
				ab.ToolUseID, ab.Content, ab.IsError = b.ToolUseID, &content, b.IsError
			}
			am.Content = append(am.Content, ab)
		}
		out.Messages = append(out.Messages, am)
	}
	if n := len(out.Messages); n > 0 {
		if k := len(out.Messages[n-1].Content); k > 0 {
			out.Messages[n-1].Content[k-1].CacheControl = ephemeral
		}
	}
	return json.Marshal(out)
}

// Call sends one request.
func (a *Anthropic) Call(ctx context.Context, req Request) (*Response, error) {
	if err := req.Check(); err != nil {
		return nil, fmt.Errorf("anthropic: %w", err)
	}
	body, err := anthropicBody(req)
	if err != nil {
		return nil, err
	}
	base := strings.TrimSuffix(a.BaseURL, "/")
	if base == "" {
		base = "https://api.anthropic.com"
	}
	h := http.Header{}
	h.Set("x-api-key", a.APIKey)
	h.Set("anthropic-version", AnthropicVersion)
	raw, err := post(ctx, a.HTTP, "anthropic", base+"/v1/messages", h, body, a.APIKey)
	if err != nil {
		return nil, err
	}
	resp, err := decodeAnthropic(raw)
	var he *HTTPError
	if errors.As(err, &he) {
		he.redact(a.APIKey) // an error in a 200's body
	}
	return resp, err
}

// decodeAnthropic reads a Messages API response body.
func decodeAnthropic(raw []byte) (*Response, error) {
	var r antResponse
	if err := json.Unmarshal(raw, &r); err != nil {
		return nil, fmt.Errorf("anthropic: %w: %v", ErrMalformed, err)
	}
	if r.Type == "error" {
		var e apiError
		_ = json.Unmarshal(raw, &e)
		return nil, &HTTPError{Provider: "anthropic", Status: http.StatusOK, Type: e.Error.Type, Message: e.Error.Message}
	}
	if r.Type != "message" || r.Role != RoleAssistant || r.StopReason == nil || r.Usage == nil {
		return nil, fmt.Errorf("anthropic: %w: want a message from the assistant with a stop_reason and usage", ErrMalformed)
	}
	out := &Response{ID: r.ID, Model: r.Model, StopReason: *r.StopReason, Raw: raw,
		Usage: Usage{InputTokens: r.Usage.InputTokens, CacheWriteTokens: r.Usage.CacheCreationInputTokens,
			CacheReadTokens: r.Usage.CacheReadInputTokens, OutputTokens: r.Usage.OutputTokens}}
	if err := out.Usage.check(); err != nil {
		return nil, fmt.Errorf("anthropic: %w", err)
	}
	for i, c := range r.Content {
		switch c.Type {
		case BlockText:
			out.Content = append(out.Content, Block{Type: BlockText, Text: c.Text})
		case BlockToolUse:
			if out.StopReason == StopMaxTokens && (i == len(r.Content)-1 || c.Name == "" || !json.Valid(c.Input)) {
				// The output limit cut the call short (its input, even
				// when it parses, is only what was written so far): it
				// is dropped, and the loop tells the model to continue.
				continue
			}
			if c.ID == "" || c.Name == "" || !json.Valid(c.Input) {
				return nil, fmt.Errorf("anthropic: %w: content[%d]: a tool_use without an id, a name or JSON input", ErrMalformed, i)
			}
			out.Content = append(out.Content, Block{Type: BlockToolUse, ID: c.ID, Name: c.Name, Input: c.Input})
		default:
			// thinking, server tools and blocks to come: kept in Raw, not
			// shown to the loop.
		}
	}
	return out, nil
}
