package model

import (
	"encoding/json"
	"strings"
	"testing"
)

// A byte-level tokenizer makes at most one token of each byte, and text
// outside ASCII (CJK, emoji) often takes one to three tokens a character:
// the estimate counts each of its bytes as a token, so it stays above what
// a provider can count. Before, JSON bytes / 3 put 1,000 emoji at about
// 1,300 tokens, under the 2,000–4,000 a tokenizer may make of them.
func TestTheEstimateCountsEachByteOfOtherTextAsAToken(t *testing.T) {
	for _, text := range []string{strings.Repeat("😀", 1000), strings.Repeat("漢字", 1000)} {
		req := Request{Messages: []Message{{Role: RoleUser, Content: []Block{{Type: BlockText, Text: text}}}}}
		if got := EstimateInputTokens(req); got < int64(len(text)) {
			t.Errorf("%q…: estimate %d, under its %d bytes", string([]rune(text)[:2]), got, len(text))
		}
	}
	// ASCII keeps its 3 bytes a token: the estimate of code and English
	// does not change.
	code := strings.Repeat("func f() { return x + y }\n", 300)
	req := Request{Messages: []Message{{Role: RoleUser, Content: []Block{{Type: BlockText, Text: code}}}}}
	b, _ := json.Marshal(req)
	if got, want := EstimateInputTokens(req), int64(len(b)/3+1); got != want {
		t.Errorf("ASCII: estimate %d, want %d (its JSON's bytes / 3)", got, want)
	}
}
