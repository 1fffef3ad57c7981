package forge

import (
	"encoding/base64"
	"net/url"
	"slices"
	"strings"
)

// user is the name git sends the token under.
func (a *Auth) user() string {
	if a.User == "" {
		return "x-access-token"
	}
	return a.User
}

// basic is the credential git sends: the base64 of user:token, as the
// Authorization header's Basic value.
func (a *Auth) basic() string {
	return base64.StdEncoding.EncodeToString([]byte(a.user() + ":" + a.Token))
}

// secrets is every form of a's token that git's output may echo: the
// token and the Basic value git sends it as (a forge or proxy that echoes
// the Authorization header echoes the latter), each as tokenForms says.
// None for no token.
func (a *Auth) secrets() []string {
	if a == nil || a.Token == "" {
		return nil
	}
	return append(tokenForms(a.Token), tokenForms(strings.TrimRight(a.basic(), "="))...)
}

// tokenForms is a credential as sent, URL-escaped (as an echo inside a
// URL or a query shows it) and with its slashes JSON-escaped (as some
// servers write "/" in a JSON string), without duplicates. A base64 value
// is best given without its = padding, so that an echo that drops or
// escapes the padding still contains it.
func tokenForms(secret string) []string {
	if secret == "" {
		return nil
	}
	forms := []string{secret}
	for _, f := range []string{url.QueryEscape(secret), url.PathEscape(secret), strings.ReplaceAll(secret, "/", `\/`)} {
		if !slices.Contains(forms, f) {
			forms = append(forms, f)
		}
	}
	return forms
}

// redact replaces every secret in s with "[redacted]", before any cut of s:
// a cut through a secret would leave a prefix no later redaction finds.
func redact(s string, secrets []string) string {
	for _, secret := range secrets {
		if secret != "" {
			s = strings.ReplaceAll(s, secret, "[redacted]")
		}
	}
	return s
}
