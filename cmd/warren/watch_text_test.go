package main

import (
	"bytes"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/warrenhq/warren/api"
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

// A model turn too large for one event shows in the text output as one
// line, the joined model_call, and its parts show nothing; a watch that
// begins among the parts shows the event as the log holds it.
func TestWatchTextJoinsSplitEvents(t *testing.T) {
	turn := `{"step":3,"cost_micro_usd":1000,"response":{"content":[{"type":"tool_use","name":"write_file","input":{"path":"big.txt","content":"` +
		strings.Repeat("x", 100<<10) + `"}}]}}`
	evs, err := api.SplitPayload("model_call", []byte(turn))
	if err != nil || len(evs) < 3 {
		t.Fatalf("%d events, %v", len(evs), err)
	}
	show := func(from int) string {
		var j api.PartJoiner
		var b bytes.Buffer
		for i, e := range evs[from:] {
			ev, ok := joinParts(&j, &warrenv1.Event{Seq: uint64(from + i + 1), Kind: e.GetKind(), Payload: e.GetPayload()})
			if !ok {
				continue
			}
			if err := printEvent(&b, "text", ev); err != nil {
				t.Fatal(err)
			}
		}
		return b.String()
	}
	if out := show(0); strings.Count(out, "\n") != 1 || !strings.Contains(out, `step 3: → write_file {"path":"big.txt","content":"xxx`) {
		t.Errorf("the whole turn: %q", out)
	}
	if out := show(1); strings.Count(out, "\n") != 1 || !strings.Contains(out, "model_call") || !strings.Contains(out, "step 3:") {
		t.Errorf("from its second part: %q", out)
	}
}
