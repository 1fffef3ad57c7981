package model

import (
	"encoding/json"
	"errors"
	"fmt"
)

// Roles of a message.
const (
	RoleUser      = "user"
	RoleAssistant = "assistant"
)

// Block kinds.
const (
	BlockText       = "text"
	BlockToolUse    = "tool_use"
	BlockToolResult = "tool_result"
)

// Stop reasons, in the Messages API's words; the openai provider maps its
// finish reasons onto them.
const (
	StopEndTurn       = "end_turn"
	StopToolUse       = "tool_use"
	StopMaxTokens     = "max_tokens"
	StopSequence      = "stop_sequence"
	StopPauseTurn     = "pause_turn"
	StopRefusal       = "refusal"
	StopContentFilter = "content_filter"
)

// Block is one piece of a message's content.
type Block struct {
	Type string `json:"type"`
	// text
	Text string `json:"text,omitempty"`
	// tool_use
	ID    string          `json:"id,omitempty"`
	Name  string          `json:"name,omitempty"`
	Input json.RawMessage `json:"input,omitempty"`
	// tool_result
	ToolUseID string `json:"tool_use_id,omitempty"`
	Content   string `json:"content,omitempty"`
	IsError   bool   `json:"is_error,omitempty"`
}

// Message is one turn of the conversation.
type Message struct {
	Role    string  `json:"role"`
	Content []Block `json:"content"`
}

// Tool is a tool the model may call; InputSchema is a JSON Schema object.
type Tool struct {
	Name        string          `json:"name"`
	Description string          `json:"description"`
	InputSchema json.RawMessage `json:"input_schema"`
}

// Request is one model call. System, Tools and the earlier Messages stay
// the same from call to call in a task, so providers with a prompt cache
// hit it: the anthropic provider marks the end of the tools, of the system
// prompt and of the last message as cache breakpoints.
type Request struct {
	Model     string    `json:"model"`
	System    string    `json:"system,omitempty"`
	Tools     []Tool    `json:"tools,omitempty"`
	Messages  []Message `json:"messages"`
	MaxTokens int       `json:"max_tokens"`
	// Turn numbers the call within its task, from 1 (compactions
	// included); never sent to a provider. The scripted provider answers
	// with line Turn; 0 makes it count the assistant turns instead.
	Turn int `json:"-"`
	// TakenToolIDs are tool call ids the task used before, besides those
	// of Messages (a compaction took their calls out of the conversation,
	// but not out of its log); never sent to a provider. The gateway gives
	// none of them to a new call. The caller may not change it during the
	// call.
	TakenToolIDs map[string]bool `json:"-"`
}

// Usage is what a call used, in tokens. InputTokens excludes the cached
// parts: cache writes and cache reads are counted apart.
type Usage struct {
	InputTokens      int64 `json:"input_tokens"`
	CacheWriteTokens int64 `json:"cache_write_tokens"`
	CacheReadTokens  int64 `json:"cache_read_tokens"`
	OutputTokens     int64 `json:"output_tokens"`
}

// check refuses usage a budget cannot count: a negative count would lower
// what the task has spent.
func (u Usage) check() error {
	if u.InputTokens < 0 || u.CacheWriteTokens < 0 || u.CacheReadTokens < 0 || u.OutputTokens < 0 {
		return fmt.Errorf("%w: negative token counts in usage %+v", ErrMalformed, u)
	}
	return nil
}

// Add sums usage.
func (u Usage) Add(v Usage) Usage {
	return Usage{u.InputTokens + v.InputTokens, u.CacheWriteTokens + v.CacheWriteTokens, u.CacheReadTokens + v.CacheReadTokens, u.OutputTokens + v.OutputTokens}
}

// Total is every token of the call.
func (u Usage) Total() int64 {
	return u.InputTokens + u.CacheWriteTokens + u.CacheReadTokens + u.OutputTokens
}

// CacheHitRate is the share of the prompt read from the cache.
func (u Usage) CacheHitRate() float64 {
	in := u.InputTokens + u.CacheWriteTokens + u.CacheReadTokens
	if in == 0 {
		return 0
	}
	return float64(u.CacheReadTokens) / float64(in)
}

// Response is the model's turn.
type Response struct {
	ID         string  `json:"id"`
	Model      string  `json:"model"`
	Content    []Block `json:"content"`
	StopReason string  `json:"stop_reason"`
	Usage      Usage   `json:"usage"`
	// Raw is the provider's response body as received, for the event log.
	Raw json.RawMessage `json:"-"`
}

// ToolUses returns the response's tool calls, in order.
func (r *Response) ToolUses() []Block {
	var out []Block
	for _, b := range r.Content {
		if b.Type == BlockToolUse {
			out = append(out, b)
		}
	}
	return out
}

// Text joins the response's text blocks.
func (r *Response) Text() string {
	s := ""
	for _, b := range r.Content {
		if b.Type == BlockText {
			s += b.Text
		}
	}
	return s
}

// Check validates a request before it is sent, naming the field at fault.
func (r *Request) Check() error {
	var errs []error
	if r.Model == "" {
		errs = append(errs, errors.New("model: required"))
	}
	if r.MaxTokens <= 0 {
		errs = append(errs, fmt.Errorf("max_tokens: %d must be positive", r.MaxTokens))
	}
	if len(r.Messages) == 0 {
		errs = append(errs, errors.New("messages: at least one is required"))
	}
	seen := map[string]bool{}
	for i, t := range r.Tools {
		if t.Name == "" || seen[t.Name] {
			errs = append(errs, fmt.Errorf("tools[%d].name: %q is empty or repeated", i, t.Name))
		}
		seen[t.Name] = true
		if !json.Valid(t.InputSchema) {
			errs = append(errs, fmt.Errorf("tools[%d].input_schema: not JSON", i))
		}
	}
	for i, m := range r.Messages {
		if m.Role != RoleUser && m.Role != RoleAssistant {
			errs = append(errs, fmt.Errorf("messages[%d].role: %q is not user or assistant", i, m.Role))
		}
		if len(m.Content) == 0 {
			errs = append(errs, fmt.Errorf("messages[%d].content: empty", i))
		}
		for j, b := range m.Content {
			switch b.Type {
			case BlockText, BlockToolResult:
			case BlockToolUse:
				if b.ID == "" || b.Name == "" || !json.Valid(b.Input) {
					errs = append(errs, fmt.Errorf("messages[%d].content[%d]: a tool_use needs an id, a name and JSON input", i, j))
				}
			default:
				errs = append(errs, fmt.Errorf("messages[%d].content[%d].type: %q is unknown", i, j, b.Type))
			}
		}
	}
	return errors.Join(errs...)
}
