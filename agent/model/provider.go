package model

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	neturl "net/url"
	"strings"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/api/textcut"
)

// AttemptTimeout bounds one HTTP attempt of a model call, answer read
// whole: a server that accepts the request and never answers is given up
// on (and the call retried as any transport failure) instead of holding
// the task. A long answer without streaming takes minutes at most.
var AttemptTimeout = 10 * time.Minute

// Provider speaks one vendor's wire protocol. Call makes exactly one HTTP
// request (or none, for scripted): retries, rate limits and unique
// tool_use ids (a response's may be empty or repeated) are the Gateway's.
// Implementations are safe for concurrent use.
type Provider interface {
	// Name is "anthropic", "openai" or "scripted".
	Name() string
	Call(ctx context.Context, req Request) (*Response, error)
}

// HTTPError is a provider's refusal. Retryable ones (429, 5xx, Anthropic's
// 529 overloaded) carry the wait the server asked for, if any.
type HTTPError struct {
	Provider   string
	Status     int
	Type       string        // the provider's error type, e.g. "overloaded_error"
	Message    string        // the provider's message, shortened
	RetryAfter time.Duration // 0 when the server gave none
}

func (e *HTTPError) Error() string {
	s := fmt.Sprintf("%s: HTTP %d", e.Provider, e.Status)
	if e.Type != "" {
		s += " " + e.Type
	}
	if e.Message != "" {
		s += ": " + e.Message
	}
	return s
}

// Retryable reports whether the same request may succeed later.
func (e *HTTPError) Retryable() bool {
	return e.Status == http.StatusTooManyRequests || e.Status == 529 || e.Status >= 500 ||
		e.Type == "overloaded_error" || e.Type == "rate_limit_error" || e.Type == "transport"
}

// InvalidArgumentsKey holds, as a tool call's only input, arguments the
// model wrote that are not JSON: the loop answers such a call with a tool
// error instead of running it.
const InvalidArgumentsKey = "warren_invalid_arguments"

// ErrMalformed wraps a response the gateway cannot read: not JSON, cut
// short, or missing what a response must have. It is not retried: the
// task records it and stops the call.
var ErrMalformed = errors.New("malformed response")

// post sends one JSON request body to url and returns the body of a 200.
// Any other status is an *HTTPError with the provider's error type and
// message (both APIs put them at error.type and error.message) and the
// wait it asked for; a transport failure is a retryable *HTTPError. No
// error's message holds secret: some proxies echo the key they were given
// in their own error message. One attempt takes at most AttemptTimeout.
func post(ctx context.Context, hc *http.Client, provider, url string, header http.Header, body []byte, secret string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, AttemptTimeout)
	defer cancel()
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", provider, err)
	}
	hr.Header = header
	hr.Header.Set("content-type", "application/json")
	if hc == nil {
		hc = http.DefaultClient
	}
	// A redirect is not followed: the APIs have no reason to redirect a
	// POST, and Go would send the key on to another host in a header it
	// does not know to drop (x-api-key).
	noRedirect := *hc
	noRedirect.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	resp, err := noRedirect.Do(hr)
	if err != nil {
		var ue *neturl.Error
		if errors.As(err, &ue) {
			ue.URL = withoutUserInfo(ue.URL) // Go hides a password, not a user
		}
		return nil, &HTTPError{Provider: provider, Type: "transport", Message: shorten(redact(err.Error(), secret), 200)}
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 && resp.StatusCode < 400 {
		return nil, &HTTPError{Provider: provider, Status: resp.StatusCode, Type: "redirect",
			Message: shorten(redact("redirected to "+withoutUserInfo(resp.Header.Get("Location"))+"; not followed (set the base URL to where the API is)", secret), 300)}
	}
	raw, err := readBody(provider, resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		he := &HTTPError{Provider: provider, Status: resp.StatusCode, RetryAfter: api.RetryAfter(resp.Header, time.Now())}
		var e apiError
		if json.Unmarshal(raw, &e) == nil {
			he.Type, he.Message = e.Error.Type, e.Error.Message
		}
		return nil, he.redact(secret)
	}
	return raw, nil
}

// withoutUserInfo is u without the user info of its authority, if it is a
// URL that has one.
func withoutUserInfo(u string) string {
	if p, err := neturl.Parse(u); err == nil && p.User != nil {
		p.User = nil
		return p.String()
	}
	return u
}

// apiError is the error body both APIs send.
type apiError struct {
	Error struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	} `json:"error"`
}

// redact removes secret from what e took from a response body, then
// shortens the type and the message (in that order: a cut through the
// key would leave its first part). Both are the server's text, and a
// proxy may send anything there: each lands in every retry's log line
// and in the task's end reason.
func (e *HTTPError) redact(secret string) *HTTPError {
	e.Type = shorten(redact(e.Type, secret), maxErrorType)
	e.Message = shorten(redact(e.Message, secret), 300)
	return e
}

// maxErrorType bounds a provider's error type (the APIs' are words such
// as "overloaded_error").
const maxErrorType = 100

// redact removes a credential from a message.
func redact(s, secret string) string {
	if secret == "" {
		return s
	}
	return strings.ReplaceAll(s, secret, "[redacted]")
}

// maxBody bounds what is read of a response.
const maxBody = 32 << 20

// readBody reads a response body whole. A body the connection cut short
// (a reset, a timeout) is a transport error, which the gateway retries;
// one over maxBody is malformed.
func readBody(provider string, r io.Reader) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r, maxBody+1))
	if err != nil {
		return nil, &HTTPError{Provider: provider, Type: "transport", Message: shorten("reading the body: "+err.Error(), 200)}
	}
	if len(b) > maxBody {
		return nil, fmt.Errorf("%s: %w: body over %d bytes", provider, ErrMalformed, maxBody)
	}
	return b, nil
}

// shorten is s cut to n bytes, at a character, with "…" if it was cut.
func shorten(s string, n int) string { return textcut.Ellipsis(s, n) }
