package scheduler

import (
	"bytes"
	"encoding/json"
	"testing"
)

// isJSONObject accepts exactly the payloads encoding/json.Valid accepts
// that are objects: swapping the validator changes speed, not what the API
// takes.
func FuzzIsJSONObject(f *testing.F) {
	for _, s := range []string{
		`{}`, ` {"a":1} `, `{"a":"\xff"}`, `{"a":1e999}`, `{"a":[1,{"b":null}],"c":"\u00e9\n"}`,
		`{"a":1}{`, `[1]`, `"s"`, `{"a":01}`, `{"a":"` + "\x01" + `"}`, "\ufeff{}", `{"a":tru}`, `{"\ud800":0}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, p []byte) {
		trimmed := bytes.TrimLeft(p, " \t\r\n")
		want := len(trimmed) > 0 && trimmed[0] == '{' && json.Valid(p)
		if got := isJSONObject(p); got != want {
			t.Fatalf("isJSONObject(%q) = %v, encoding/json says %v", p, got, want)
		}
	})
}
