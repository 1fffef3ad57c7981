package model

import (
	"errors"
	"testing"
)

func usageNonNegative(u Usage) bool {
	return u.InputTokens >= 0 && u.CacheWriteTokens >= 0 && u.CacheReadTokens >= 0 && u.OutputTokens >= 0
}

// A provider's usage is what the budgets count: an accepted response never
// has negative token counts (they would lower what the task has spent).
func TestNegativeUsageRefused(t *testing.T) {
	oai := `{"choices":[{"message":{"content":"x"},"finish_reason":"stop"}],` +
		`"usage":{"prompt_tokens":10,"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":1000000}}}`
	if r, err := decodeOpenAI([]byte(oai)); err == nil || !errors.Is(err, ErrMalformed) {
		t.Errorf("openai: cached_tokens > prompt_tokens: %v, want ErrMalformed", err)
	} else if r != nil && !usageNonNegative(r.Usage) {
		t.Errorf("openai: cached_tokens > prompt_tokens accepted with usage %+v (total %d)", r.Usage, r.Usage.Total())
	}
	ant := `{"type":"message","role":"assistant","content":[],"stop_reason":"end_turn",` +
		`"usage":{"input_tokens":-1000000,"output_tokens":5}}`
	if r, err := decodeAnthropic([]byte(ant)); err == nil || !errors.Is(err, ErrMalformed) {
		t.Errorf("anthropic: negative input_tokens: %v, want ErrMalformed", err)
	} else if r != nil && !usageNonNegative(r.Usage) {
		t.Errorf("anthropic: negative input_tokens accepted with usage %+v (total %d)", r.Usage, r.Usage.Total())
	}
}

func FuzzUsageNonNegative(f *testing.F) {
	f.Add([]byte(antOK), true)
	f.Add([]byte(oaiOK), false)
	f.Fuzz(func(t *testing.T, b []byte, ant bool) {
		var r *Response
		var err error
		if ant {
			r, err = decodeAnthropic(b)
		} else {
			r, err = decodeOpenAI(b)
		}
		if err == nil && !usageNonNegative(r.Usage) {
			t.Fatalf("accepted usage %+v", r.Usage)
		}
	})
}
