package noded

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"
)

// A scripted step's output fits its tool_result whatever it printed: a
// step that printed more than an event holds used to fail its task.
func TestStepOutputFitsAnEvent(t *testing.T) {
	for name, raw := range map[string][]byte{
		"short":            []byte("hello\n"),
		"200 KiB of text":  []byte(strings.Repeat("abcdefgh\n", 200<<10/9)),
		"control bytes":    []byte(strings.Repeat("\x01", 100<<10)), // each is 6 bytes as JSON
		"invalid UTF-8":    []byte(strings.Repeat("\xff\xfe ok ", 20<<10)),
		"multi-byte runes": []byte(strings.Repeat("é€😀", 30<<10)),
	} {
		out, cut := stepOutput(raw)
		b, _ := json.Marshal(out)
		if len(b) > maxStepOutputJSON || !utf8.ValidString(out) {
			t.Errorf("%s: %d bytes as JSON, valid UTF-8 %v", name, len(b), utf8.ValidString(out))
		}
		whole := strings.ToValidUTF8(string(raw), "\uFFFD")
		if !strings.HasSuffix(whole, out) || cut != len(whole)-len(out) {
			t.Errorf("%s: not the output's tail, or cut %d of %d wrong (kept %d)", name, cut, len(whole), len(out))
		}
		if name == "short" && (out != "hello\n" || cut != 0) {
			t.Errorf("short: %q, cut %d", out, cut)
		}
	}
}
