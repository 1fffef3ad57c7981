package noded

import "testing"

// A model's context window is the node's --model-context for it, or
// Claude's 200,000 tokens, or 128,000 for any other model: an
// OpenAI-compatible model with a smaller window answered 400 before the
// loop, which assumed 200,000 for every model, compacted.
func TestContextWindow(t *testing.T) {
	m := &Models{ContextWindows: map[string]int64{"qwen2.5-coder": 32768}}
	for model, want := range map[string]int64{"qwen2.5-coder": 32768, "claude-sonnet-4-5": 200_000, "gpt-4o": 128_000} {
		if got := m.contextWindow(model); got != want {
			t.Errorf("%s: %d, want %d", model, got, want)
		}
	}
}
