package model

import (
	"context"
	"errors"
	"strings"
	"testing"
	"unicode/utf8"
)

// A provider's error type is the server's text too (a proxy may put
// anything there): it is shortened like the message, after the key is
// redacted. Before, only the message was shortened, and a type of
// megabytes went whole into every retry's log line and the task's end.
func TestProviderErrorTypeIsShortened(t *testing.T) {
	const key = "sk-proxy-very-secret-key"
	// The key straddles where the type is cut: redacted first, none of it
	// is left.
	typ := strings.Repeat("t", maxErrorType-len(key)/2) + key + strings.Repeat("y", 4<<20)
	body := `{"type":"error","error":{"type":"` + typ + `","message":"no"}}`
	for name, c := range map[string]struct {
		p    Provider
		path string
		rep  fakeReply
	}{
		"openai 400":          {&OpenAI{APIKey: key}, "/chat/completions", fakeReply{status: 400, body: body}},
		"anthropic 500":       {&Anthropic{APIKey: key}, "/v1/messages", fakeReply{status: 500, body: body}},
		"anthropic 200 error": {&Anthropic{APIKey: key}, "/v1/messages", fakeReply{status: 200, body: body}},
	} {
		f := newFake(t, c.path, c.rep)
		switch p := c.p.(type) {
		case *OpenAI:
			p.BaseURL = f.URL
		case *Anthropic:
			p.BaseURL = f.URL
		}
		_, err := c.p.Call(context.Background(), conversation())
		var he *HTTPError
		if !errors.As(err, &he) {
			t.Fatalf("%s: %v, want an *HTTPError", name, err)
		}
		if len(he.Type) > maxErrorType+len("…") || len(err.Error()) > 600 {
			t.Errorf("%s: a type of %d bytes, an error of %d; want them shortened", name, len(he.Type), len(err.Error()))
		}
		if !strings.HasPrefix(he.Type, "ttt") || strings.Contains(err.Error(), key[:len(key)/2]) {
			t.Errorf("%s: type %q", name, he.Type)
		}
	}
}

// A shortened text is cut at a character, not inside one (a provider's
// message may be any language).
func TestShortenCutsAtACharacter(t *testing.T) {
	if got := shorten("ab€", 3); got != "ab…" || !utf8.ValidString(got) {
		t.Fatalf("shorten(\"ab€\", 3) = %q", got)
	}
}
