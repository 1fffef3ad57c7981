package main

import (
	"strings"
	"testing"

	"github.com/warrenhq/warren/agent/model"
)

func TestModelFlags(t *testing.T) {
	p, err := parsePrices("claude-sonnet-4-5=3/3.75/0.3/15, gpt-5=1.25/0/0.125/10")
	if err != nil || p["claude-sonnet-4-5"] != (model.Price{Input: 3, CacheWrite: 3.75, CacheRead: 0.3, Output: 15}) || p["gpt-5"].Output != 10 {
		t.Fatalf("%+v %v", p, err)
	}
	for _, bad := range []string{"x=1/2/3", "=1/2/3/4", "x=1/2/three/4", "x=-1/0/0/0"} {
		if _, err := parsePrices(bad); err == nil || !strings.Contains(err.Error(), "model-prices") {
			t.Errorf("%q: %v", bad, err)
		}
	}
	if m, err := parseTPM("anthropic=400000,openai=1000000"); err != nil || m["anthropic"] != 400000 {
		t.Fatalf("%v %v", m, err)
	}
	for _, bad := range []string{"gemini=1", "anthropic=0", "anthropic"} {
		if _, err := parseTPM(bad); err == nil || !strings.Contains(err.Error(), "model-tpm") {
			t.Errorf("%q: %v", bad, err)
		}
	}
	if m, err := parseContextWindows("qwen2.5-coder=32768, gpt-4.1=1000000"); err != nil || m["qwen2.5-coder"] != 32768 || m["gpt-4.1"] != 1000000 {
		t.Fatalf("%v %v", m, err)
	}
	for bad, want := range map[string]string{"x": "is not MODEL=TOKENS", "=4096": "is not MODEL=TOKENS", "x=many": "is not MODEL=TOKENS",
		"x=100": "between 4096", "x=8192,x=16384": "given twice"} {
		if _, err := parseContextWindows(bad); err == nil || !strings.Contains(err.Error(), "model-context") || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v", bad, err)
		}
	}
	t.Setenv("ANTHROPIC_API_KEY", "")
	t.Setenv("OPENAI_API_KEY", "")
	t.Setenv("OPENAI_BASE_URL", "")
	if m, err := (&modelFlags{}).models(); m != nil || err != nil {
		t.Errorf("no settings: %+v %v", m, err)
	}
	t.Setenv("OPENAI_BASE_URL", "http://127.0.0.1:11434/v1")
	if m, err := (&modelFlags{tpm: "openai=1000"}).models(); err != nil || m.OpenAIURL == "" || m.TPM["openai"] != 1000 {
		t.Errorf("%+v %v", m, err)
	}
}
