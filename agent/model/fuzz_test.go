package model

import (
	"encoding/json"
	"testing"
)

// The response decoders take whatever a server sends: they return a
// response whose tool calls carry a name and JSON input (and, once the
// gateway has seen them, ids of their own), or an error; never a panic.
func FuzzDecodeAnthropic(f *testing.F) {
	f.Add([]byte(antOK))
	f.Add([]byte(`{"type":"error","error":{"type":"overloaded_error"}}`))
	f.Add([]byte(`{"type":"message","role":"assistant","content":[{"type":"tool_use","id":"a","name":"b","input":null}],"stop_reason":"x","usage":{}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := decodeAnthropic(b)
		if err == nil {
			for _, tu := range r.ToolUses() {
				if tu.ID == "" || tu.Name == "" || !json.Valid(tu.Input) {
					t.Fatalf("accepted a bad tool_use: %+v", tu)
				}
			}
		}
	})
}

func FuzzDecodeOpenAI(f *testing.F) {
	f.Add([]byte(oaiOK))
	f.Add([]byte(`{"choices":[{"message":{"tool_calls":[{"id":"a","function":{"name":"b","arguments":""}}]},"finish_reason":"stop"}],"usage":{}}`))
	f.Add([]byte(`{"choices":[{"message":{"tool_calls":[{"id":"a","function":{"name":"b"}},{"id":"a","function":{"name":"b"}},{"function":{"name":"b"}}]},"finish_reason":"stop"}],"usage":{}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := decodeOpenAI(b)
		if err == nil {
			uniqueToolIDs(r.Content, Request{})
			seen := map[string]bool{}
			for _, tu := range r.ToolUses() {
				if tu.ID == "" || seen[tu.ID] || tu.Name == "" || !json.Valid(tu.Input) {
					t.Fatalf("accepted a bad tool call: %+v", tu)
				}
				seen[tu.ID] = true
			}
		}
	})
}
