package forge

import (
	"context"
	"encoding/base64"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
)

// A remote can make git print without end: here a 403 whose text/plain
// body git prints line by line as "remote: …", 32 MiB of it. The node kept
// the whole of git's stderr in memory, and its error only the first 2,000
// bytes, without git's last words (the status, "fatal: …"). It keeps the
// head and the tail now, and the token, which the body echoes where the
// head is cut, leaves nothing of itself there.
func TestGitStderrIsBoundedAndKeepsItsEnd(t *testing.T) {
	needGit(t)
	const printed = 32 << 20
	basic := base64.StdEncoding.EncodeToString([]byte("x-access-token:" + testToken))
	// "remote: " + 486 bytes + "Basic " puts the base64 across byte 512.
	first := "denied " + strings.Repeat("a", 479) + "Basic " + basic + "\n"
	line := strings.Repeat("y", 99) + "\n"
	body := []byte(first + strings.Repeat(line, printed/len(line)) + "denied: Basic " + basic + "\n")
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusForbidden)
		_, _ = w.Write(body)
	}))
	defer srv.Close()
	c := &Cache{Dir: t.TempDir(), Auth: func(string) *Auth { return &Auth{Token: testToken} }}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	_, err := c.Mirror(context.Background(), srv.URL+"/o/r", "")
	runtime.ReadMemStats(&after)
	if err == nil {
		t.Fatal("no error")
	}
	msg := err.Error()
	if len(msg) > 4<<10 {
		t.Errorf("an error of %d bytes", len(msg))
	}
	if !strings.Contains(msg, "403") || !strings.Contains(msg, "left out") {
		t.Errorf("the error lost git's last words: %.3000s", msg)
	}
	if strings.Contains(msg, basic[:8]) || strings.Contains(msg, testToken[:8]) {
		t.Errorf("the error holds part of the token: %s", msg)
	}
	if grew := after.TotalAlloc - before.TotalAlloc; grew > printed/2 {
		t.Errorf("the node allocated %d MiB for %d MiB of git's stderr", grew>>20, printed>>20)
	}
}

// Where stderr is cut, neither side keeps a piece of a secret that the
// cut split.
func TestHeadTailTextLeavesNoPieceOfASecret(t *testing.T) {
	const secret = "SECRET-0123456789"
	for _, tc := range []struct {
		name string
		text string
	}{
		{"across the head's end", strings.Repeat("a", maxStderrHead-5) + secret + strings.Repeat("m", 10000) + "end"},
		{"across the tail's start", "start" + strings.Repeat("m", 10000) + secret + strings.Repeat("z", maxStderrTail-6)},
		{"whole", "start " + secret + " end"},
	} {
		var h headTail
		for _, b := range []byte(tc.text) { // a byte at a time: the tail shifts
			h.Write([]byte{b})
		}
		got := h.text([]string{secret})
		if strings.Contains(got, "SECRET") || strings.Contains(got, "6789") {
			t.Errorf("%s: %q", tc.name, got)
		}
		if len(got) > maxStderrHead+maxStderrTail+100 {
			t.Errorf("%s: %d bytes kept", tc.name, len(got))
		}
	}
}
