package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
)

// -o json prints every field, false, 0, "" and empty lists too (scripts
// read `.eligible` after `nodes cordon`, and jq gives null for a missing
// key), on one line per object; an unset message is left out.
func TestPrintJSONKeepsFalseAndZero(t *testing.T) {
	var b bytes.Buffer
	if err := printJSON(&b, &warrenv1.Node{Id: "n1", Eligible: false, TaskCount: 0}); err != nil {
		t.Fatal(err)
	}
	if strings.Count(b.String(), "\n") != 1 {
		t.Errorf("not one line: %q", b.String())
	}
	var m map[string]any
	if err := json.Unmarshal(b.Bytes(), &m); err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]any{"id": "n1", "eligible": false, "task_count": float64(0)} {
		if got, ok := m[k]; !ok || got != want {
			t.Errorf("nodes -o json %s: %q is %v (present %v), want %v", strings.TrimSpace(b.String()), k, got, ok, want)
		}
	}
	b.Reset()
	if err := printJSON(&b, &warrenv1.Sandbox{Id: "s1", Egress: &warrenv1.EgressPolicy{Profile: "registries"}}); err != nil {
		t.Fatal(err)
	}
	var sb struct {
		Egress map[string]any `json:"egress"`
	}
	if err := json.Unmarshal(b.Bytes(), &sb); err != nil {
		t.Fatal(err)
	}
	if allow, ok := sb.Egress["allow"].([]any); !ok || len(allow) != 0 {
		t.Errorf("sandbox -o json %s: egress.allow is %v, want []", strings.TrimSpace(b.String()), sb.Egress["allow"])
	}
}
