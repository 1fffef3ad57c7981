package main

import (
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/warrenhq/warren/agent/model"
	"github.com/warrenhq/warren/noded"
)

// modelFlags are the node's model gateway settings; credentials come only
// from the environment.
type modelFlags struct {
	prices, tpm, context string
	approvalGrace        time.Duration
}

func (m *modelFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&m.prices, "model-prices", "", "agent tasks: price table, MODEL=INPUT/CACHE_WRITE/CACHE_READ/OUTPUT in US dollars per million tokens, comma-separated (e.g. claude-sonnet-4-5=3/3.75/0.3/15); a model without a price costs 0 and a cost budget cannot stop it")
	fs.DurationVar(&m.approvalGrace, "approval-grace", noded.DefaultApprovalGrace, "agent tasks: how long a task waiting for approval keeps its sandbox on the node before it parks (releasing the sandbox and its room; the decision resumes it on any node from its last checkpoint)")
	fs.StringVar(&m.context, "model-context", "", "agent tasks: context windows in tokens, MODEL=TOKENS comma-separated (e.g. qwen2.5-coder=32768); the loop compacts a task's history before a request would fill 80% of it. Default: 200000 for claude* models, 128000 for others")
	fs.StringVar(&m.tpm, "model-tpm", "", "agent tasks: tokens per minute for all the node's tasks on a provider, PROVIDER=N comma-separated (anthropic, openai)")
}

// models builds the node's settings: credentials from ANTHROPIC_API_KEY
// (and ANTHROPIC_BASE_URL), OPENAI_API_KEY and OPENAI_BASE_URL, and the
// flags' prices and limits. nil when there is nothing to say (tasks with
// a model_script need none).
func (m *modelFlags) models() (*noded.Models, error) {
	out := &noded.Models{AnthropicKey: os.Getenv("ANTHROPIC_API_KEY"), AnthropicURL: os.Getenv("ANTHROPIC_BASE_URL"),
		OpenAIKey: os.Getenv("OPENAI_API_KEY"), OpenAIURL: os.Getenv("OPENAI_BASE_URL")}
	var err error
	if out.Prices, err = parsePrices(m.prices); err != nil {
		return nil, err
	}
	if out.TPM, err = parseTPM(m.tpm); err != nil {
		return nil, err
	}
	if out.ContextWindows, err = parseContextWindows(m.context); err != nil {
		return nil, err
	}
	if out.AnthropicKey == "" && out.OpenAIKey == "" && out.OpenAIURL == "" && len(out.Prices) == 0 && len(out.TPM) == 0 && len(out.ContextWindows) == 0 {
		return nil, nil
	}
	return out, nil
}

func parsePrices(s string) (map[string]model.Price, error) {
	out := map[string]model.Price{}
	for _, kv := range splitComma(s) {
		name, v, ok := strings.Cut(kv, "=")
		parts := strings.Split(v, "/")
		if !ok || name == "" || len(parts) != 4 {
			return nil, fmt.Errorf("model-prices: %q is not MODEL=INPUT/CACHE_WRITE/CACHE_READ/OUTPUT", kv)
		}
		var f [4]float64
		for i, p := range parts {
			x, err := strconv.ParseFloat(p, 64)
			if err != nil || !(x >= 0 && x <= 1e6) { // NaN too
				return nil, fmt.Errorf("model-prices: %s: %q is not a price in dollars per million tokens", name, p)
			}
			f[i] = x
		}
		out[name] = model.Price{Input: f[0], CacheWrite: f[1], CacheRead: f[2], Output: f[3]}
	}
	return out, nil
}

func parseTPM(s string) (map[string]int64, error) {
	out := map[string]int64{}
	for _, kv := range splitComma(s) {
		p, v, ok := strings.Cut(kv, "=")
		n, err := strconv.ParseInt(v, 10, 64)
		if !ok || (p != "anthropic" && p != "openai") || err != nil || n <= 0 {
			return nil, fmt.Errorf("model-tpm: %q is not anthropic=N or openai=N with N > 0", kv)
		}
		out[p] = n
	}
	return out, nil
}

// parseContextWindows reads --model-context: MODEL=TOKENS, comma-separated.
func parseContextWindows(s string) (map[string]int64, error) {
	out := map[string]int64{}
	for _, kv := range splitComma(s) {
		name, v, ok := strings.Cut(kv, "=")
		n, err := strconv.ParseInt(v, 10, 64)
		switch {
		case !ok || name == "" || err != nil:
			return nil, fmt.Errorf("model-context: %q is not MODEL=TOKENS", kv)
		case n < 4096 || n > 100_000_000:
			return nil, fmt.Errorf("model-context: %s: %d tokens must be between 4096 and 100000000", name, n)
		}
		if _, dup := out[name]; dup {
			return nil, fmt.Errorf("model-context: %s given twice", name)
		}
		out[name] = n
	}
	return out, nil
}
