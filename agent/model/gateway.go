package model

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/warrenhq/warren/actor"
)

// Price is what a model's tokens cost, in US dollars per million.
type Price struct {
	Input      float64 `json:"input"`
	CacheWrite float64 `json:"cache_write"`
	CacheRead  float64 `json:"cache_read"`
	Output     float64 `json:"output"`
}

// CostMicroUSD is u's cost in millionths of a dollar, rounded up.
func (p Price) CostMicroUSD(u Usage) int64 {
	// $/Mtok × tokens = µ$.
	c := p.Input*float64(u.InputTokens) + p.CacheWrite*float64(u.CacheWriteTokens) +
		p.CacheRead*float64(u.CacheReadTokens) + p.Output*float64(u.OutputTokens)
	return int64(math.Ceil(c))
}

// WorstCaseMicroUSD bounds a call's cost before it is made: every input
// token written to the cache or read uncached, whichever is dearer, and
// every output token the call may produce.
func (p Price) WorstCaseMicroUSD(inputTokens, maxTokens int64) int64 {
	in := max(p.Input, p.CacheWrite)
	return int64(math.Ceil(in*float64(inputTokens) + p.Output*float64(maxTokens)))
}

// EstimateInputTokens bounds a request's prompt from above without a
// tokenizer: its JSON's ASCII bytes / 3 (real tokenizers average 3.5–4
// bytes a token on code and English), and one token for each byte of
// other text. A byte-level tokenizer makes at most one token of each
// byte, and CJK text or emoji often take one to three tokens a character:
// at 3 bytes a token they counted a third of that or less, so a task in
// such a language compacted late and could pass its token budget. (ASCII
// that tokenizes badly, a long random string, can still be under-counted.)
func EstimateInputTokens(req Request) int64 {
	b, _ := json.Marshal(req)
	other := 0
	for _, c := range b {
		if c >= utf8.RuneSelf {
			other++
		}
	}
	return int64((len(b)-other)/3 + other + 1)
}

// RetryPolicy says how a failed call is retried: 429, 5xx, overloaded and
// transport errors; never a refusal of the request itself.
type RetryPolicy struct {
	MaxAttempts int           // total tries (default 6)
	Base        time.Duration // first backoff (default 1s), doubled each time
	Max         time.Duration // backoff cap (default 60s); a server's retry-after is honoured even above it, up to 10 min
}

func (p RetryPolicy) withDefaults() RetryPolicy {
	if p.MaxAttempts <= 0 {
		p.MaxAttempts = 6
	}
	if p.Base <= 0 {
		p.Base = time.Second
	}
	if p.Max <= 0 {
		p.Max = time.Minute
	}
	return p
}

// Gateway calls one provider for one task's model: retries, the node's
// tokens-per-minute limiter for that provider, and cost.
type Gateway struct {
	Provider Provider
	Price    Price
	Limiter  *Limiter // shared by all the node's actors on this provider; nil: none
	Retry    RetryPolicy
	Clock    actor.Clock      // nil: the real clock
	Jitter   func() float64   // in [0,1); nil: math/rand
	OnRetry  func(RetryEvent) // optional, for logs and metrics
}

// RetryEvent describes one retry.
type RetryEvent struct {
	Attempt int
	Err     error
	Wait    time.Duration
}

// Result is one call through the gateway.
type Result struct {
	Response     *Response
	CostMicroUSD int64
	Attempts     int
}

// Call makes the call, retrying what may succeed later.
func (g *Gateway) Call(ctx context.Context, req Request) (*Result, error) {
	pol := g.Retry.withDefaults()
	clock := g.Clock
	if clock == nil {
		clock = actor.RealClock()
	}
	jitter := g.Jitter
	if jitter == nil {
		jitter = rand.Float64
	}
	want := EstimateInputTokens(req) + int64(req.MaxTokens)
	for attempt := 1; ; attempt++ {
		if g.Limiter != nil {
			if err := g.Limiter.Wait(ctx, want); err != nil {
				return nil, err
			}
		}
		resp, err := g.Provider.Call(ctx, req)
		if err == nil {
			uniqueToolIDs(resp.Content, req)
			if g.Limiter != nil {
				g.Limiter.Settle(want, resp.Usage.Total())
			}
			return &Result{Response: resp, CostMicroUSD: g.Price.CostMicroUSD(resp.Usage), Attempts: attempt}, nil
		}
		if g.Limiter != nil {
			// A refused or failed call used none of the tokens it took:
			// repeated 429s or 5xx would drain the node's budget for
			// every task otherwise.
			g.Limiter.Settle(want, 0)
		}
		var he *HTTPError
		if !errors.As(err, &he) || !he.Retryable() || attempt >= pol.MaxAttempts || ctx.Err() != nil {
			return nil, fmt.Errorf("model call (attempt %d of %d): %w", attempt, pol.MaxAttempts, err)
		}
		wait := he.RetryAfter
		if wait <= 0 {
			back := min(pol.Max, pol.Base<<(attempt-1))
			wait = time.Duration(float64(back) * (0.5 + 0.5*jitter())) // half to full
		}
		wait = min(wait, 10*time.Minute)
		if g.OnRetry != nil {
			g.OnRetry(RetryEvent{Attempt: attempt, Err: err, Wait: wait})
		}
		if err := sleep(ctx, clock, wait); err != nil {
			return nil, err
		}
	}
}

// ReservedToolIDPrefix starts the ids the node gives approvals of its own
// (the push of a reviewed diff, "push-" and the diff's hash). A model's
// tool call never gets such an id (uniqueToolIDs renames it), so no
// approval of a tool call can be taken for one of the node's.
const ReservedToolIDPrefix = "push-"

// uniqueToolIDs gives each tool_use of content an id that no other call
// of the response, of req's conversation or of req.TakenToolIDs has. The loop matches
// approvals and results by id, and some OpenAI-compatible servers give
// every call the same id, or none. An empty or taken id becomes the old
// one (or "call") + "-" + the turn + "-" + the call's index, with "-n"
// added while that is taken too: the same response to the same request
// always gets the same ids, and the model_call event records them. An id
// that starts with ReservedToolIDPrefix is renamed the same way, from
// "call".
func uniqueToolIDs(content []Block, req Request) {
	taken := map[string]bool{}
	for id := range req.TakenToolIDs {
		taken[id] = true
	}
	for _, m := range req.Messages {
		for _, b := range m.Content {
			if b.Type == BlockToolUse {
				taken[b.ID] = true
			}
		}
	}
	sent := map[string]bool{} // the response's ids, as the server sent them
	for _, b := range content {
		if b.Type == BlockToolUse {
			sent[b.ID] = true
		}
	}
	for i, b := range content {
		if b.Type != BlockToolUse {
			continue
		}
		reserved := strings.HasPrefix(b.ID, ReservedToolIDPrefix)
		if b.ID != "" && !taken[b.ID] && !reserved {
			taken[b.ID] = true
			continue
		}
		base := cmp.Or(b.ID, "call")
		if reserved {
			base = "call"
		}
		id := fmt.Sprintf("%s-%d-%d", base, req.Turn, i)
		for n := 1; taken[id] || sent[id]; n++ {
			id = fmt.Sprintf("%s-%d-%d-%d", base, req.Turn, i, n)
		}
		content[i].ID = id
		taken[id] = true
	}
}

// sleep waits d on clock, or until ctx is done.
func sleep(ctx context.Context, clock actor.Clock, d time.Duration) error {
	done := make(chan struct{})
	t := clock.AfterFunc(d, func() { close(done) })
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		t.Stop()
		return ctx.Err()
	}
}

// Limiter is a tokens-per-minute budget shared by every call to one
// provider on a node: a token bucket of one minute's tokens, refilled
// continuously. A call takes its worst case up front and gives back what
// it did not use.
type Limiter struct {
	clock  actor.Clock
	perMin float64

	mu     sync.Mutex
	tokens float64
	last   time.Time
}

// NewLimiter allows tpm tokens a minute (nil clock: the real one).
func NewLimiter(tpm int64, clock actor.Clock) *Limiter {
	if clock == nil {
		clock = actor.RealClock()
	}
	return &Limiter{clock: clock, perMin: float64(tpm), tokens: float64(tpm), last: clock.Now()}
}

func (l *Limiter) refill() {
	now := l.clock.Now()
	l.tokens = min(l.perMin, l.tokens+l.perMin*now.Sub(l.last).Minutes())
	l.last = now
}

// Wait takes n tokens, waiting until the bucket has them (a call larger
// than a minute's budget waits for a full bucket and takes it all).
func (l *Limiter) Wait(ctx context.Context, n int64) error {
	need := min(float64(n), l.perMin)
	for {
		l.mu.Lock()
		l.refill()
		if l.tokens >= need {
			l.tokens -= need
			l.mu.Unlock()
			return nil
		}
		wait := time.Duration((need - l.tokens) / l.perMin * float64(time.Minute))
		l.mu.Unlock()
		if err := sleep(ctx, l.clock, max(wait, time.Millisecond)); err != nil {
			return err
		}
	}
}

// Settle gives back what a call took but did not use.
func (l *Limiter) Settle(took, used int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.refill()
	if back := min(float64(took), l.perMin) - float64(used); back > 0 {
		l.tokens = min(l.perMin, l.tokens+back)
	}
}
