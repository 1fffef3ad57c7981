package model

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
)

// A provider (or a proxy in front of it) that answers 307/308 sends the
// client to another host. Go's http.Client drops only Authorization,
// Cookie and the like on a cross-host redirect, not Anthropic's
// x-api-key, so no redirect is followed: the call fails naming it.
func TestRedirectNotFollowedWithTheKey(t *testing.T) {
	const key = "sk-zzreview-SECRET"
	var mu sync.Mutex
	var got []string
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, r.Header.Get("x-api-key"), r.Header.Get("authorization"))
		mu.Unlock()
		w.Header().Set("content-type", "application/json")
		_, _ = w.Write([]byte(antOK))
	}))
	defer other.Close()
	_, port, _ := net.SplitHostPort(other.Listener.Addr().String())
	// Another host name for the same listener: "localhost" is not
	// "127.0.0.1", so Go treats the redirect as cross-host.
	target := "http://localhost:" + port + "/v1/messages"
	redirector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, target, http.StatusTemporaryRedirect)
	}))
	defer redirector.Close()

	for name, p := range map[string]Provider{
		"anthropic": &Anthropic{BaseURL: redirector.URL, APIKey: key},
		"openai":    &OpenAI{BaseURL: redirector.URL, APIKey: key},
	} {
		mu.Lock()
		got = nil
		mu.Unlock()
		_, err := p.Call(context.Background(), conversation())
		var he *HTTPError
		if !errors.As(err, &he) || he.Status != http.StatusTemporaryRedirect || !strings.Contains(he.Message, "not followed") {
			t.Errorf("%s: err %v, want the redirect named", name, err)
		}
		mu.Lock()
		for _, h := range got {
			if strings.Contains(h, key) {
				t.Errorf("%s: the API key was sent to the host a redirect named (%s): %q", name, target, h)
			}
		}
		mu.Unlock()
	}
}

// OPENAI_BASE_URL / ANTHROPIC_BASE_URL may carry the credential of an
// OpenAI-compatible server or a gateway in its user info. Go strips a
// password from a transport error's URL, but not a bare user: the
// credential is then in the error, which the loop records (model_error
// in the task's last state_changed event) and the node logs. It is cut.
func TestBaseURLUserInfoNotInTransportError(t *testing.T) {
	const secret = "sk-zzreview-SECRET"
	for name, p := range map[string]Provider{
		"openai":    &OpenAI{BaseURL: "http://" + secret + "@127.0.0.1:1/v1"},
		"anthropic": &Anthropic{BaseURL: "http://" + secret + "@127.0.0.1:1", APIKey: "other"},
	} {
		_, err := p.Call(context.Background(), conversation())
		if err == nil {
			t.Fatalf("%s: no error", name)
		}
		if strings.Contains(err.Error(), secret) {
			t.Errorf("%s: the transport error holds the base URL's credential: %v", name, err)
		}
	}
}
