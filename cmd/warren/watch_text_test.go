package main

import (
	"bytes"
	"strings"
	"testing"
	"unicode/utf8"

	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
)

// Every event of `warren task watch` in text is one line of valid UTF-8
// with no control characters: the summary's strings come from the model,
// tools and the repository, and an ESC sequence among them would reach
// the terminal raw.
func TestWatchTextIsOneCleanLinePerEvent(t *testing.T) {
	for _, c := range []struct {
		name, kind, payload string
		want                string // in the line
	}{
		{"failed reason with newline", "state_changed", `{"from":"running","to":"failed","reason":"model_error: 500\nretry later"}`, "running → failed: model_error: 500 retry later"},
		{"multi-line test command", "test_run", `{"command":"set -e\nmake test","exit_code":1,"passed":false}`, "set -e make test failed (exit 1)"},
		{"cut in a multi-byte char", "message", `{"from":"user","text":"` + "a" + strings.Repeat("é", 150) + `"}`, "éé…"},
		{"escape sequence in tool output", "tool_result", `{"tool_call_id":"c","output":"ok \u001b]0;pwned\u0007 \u001b[31mred"}`, "ok ]0;pwned [31mred"},
		{"C1 control and DEL", "message", `{"text":"a\u009bb\u007fc"}`, "a b c"},
		{"unknown kind, pretty payload", "log", "{\n  \"msg\": \"x\"\n}", `{"msg":"x"}`},
		{"not JSON, invalid UTF-8", "log", "a\xff\x1b[2Jb", "a\uFFFD [2Jb"},
		{"pull request head", "pull_request", `{"head":"agent/x\u001b[2J","commit":"0123456789abcdef","forge":"git"}`, "agent/x [2J pushed at 0123456789ab"},
	} {
		var b bytes.Buffer
		if err := printEvent(&b, "text", &warrenv1.Event{Seq: 7, Kind: c.kind, Payload: []byte(c.payload)}); err != nil {
			t.Fatal(err)
		}
		out := b.String()
		if strings.Count(out, "\n") != 1 || !strings.HasSuffix(out, "\n") || !utf8.ValidString(out) ||
			strings.ContainsFunc(strings.TrimSuffix(out, "\n"), func(r rune) bool { return r < ' ' || r == 0x7f || r >= 0x80 && r < 0xa0 }) {
			t.Errorf("%s: not one clean line: %q", c.name, out)
		}
		if !strings.Contains(out, c.want) {
			t.Errorf("%s: %q, want %q in it", c.name, out, c.want)
		}
	}
}
