package scheduler

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sort"
	"unicode/utf8"

	segjson "github.com/segmentio/encoding/json"

	"github.com/warrenhq/warren/api"
	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
)

// MaxPayloadBytes is the largest event payload accepted. A writer records
// a larger one as payload_part events and the event with the rest
// (api.SplitPayload).
const MaxPayloadBytes = api.MaxEventPayloadBytes

// MaxEventsPerAppend bounds one AppendEvents request.
const MaxEventsPerAppend = 256

// Event kinds. docs/events.md documents each one and its payload.
const (
	KindTaskCreated       = "task_created"
	KindMessage           = "message"
	KindModelCall         = "model_call"
	KindToolCall          = "tool_call"
	KindToolResult        = "tool_result"
	KindApprovalRequested = "approval_requested"
	KindApprovalDecided   = "approval_decided"
	KindStateChanged      = "state_changed"
	KindCancelRequested   = "cancel_requested"
	KindCheckpoint        = "checkpoint"
	KindEgress            = "egress"
	KindLog               = "log"
	KindEffect            = "effect"
	KindParked            = "parked"
	KindCheckout          = "checkout"
	KindFinishRejected    = "finish_rejected"
	KindTestRun           = "test_run"
	KindDiffChecked       = "diff_checked"
	KindPullRequest       = "pull_request"
	KindPayloadPart       = api.KindPayloadPart
)

// kinds maps every known kind to whether a writer may append it through
// AppendEvents. The others are written only by the FSM itself.
var kinds = map[string]bool{
	KindTaskCreated:       false,
	KindMessage:           true,
	KindModelCall:         true,
	KindToolCall:          true,
	KindToolResult:        true,
	KindApprovalRequested: true,
	KindApprovalDecided:   false,
	KindStateChanged:      true,
	KindCancelRequested:   false,
	KindCheckpoint:        true,
	KindEgress:            true,
	KindLog:               true,
	KindEffect:            true,
	KindParked:            true,
	KindCheckout:          true,
	KindFinishRejected:    true,
	KindTestRun:           true,
	KindDiffChecked:       true,
	KindPullRequest:       true,
	KindPayloadPart:       true,
}

// Kinds returns every known event kind, sorted.
func Kinds() []string {
	out := make([]string, 0, len(kinds))
	for k := range kinds {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// checkEventInput validates one event a writer submits, the i-th of its
// append (named events[i] in errors). The API runs it before it proposes an
// append, and the leader runs it on appends a follower forwards (Propose),
// so every append in the log has passed it.
func checkEventInput(i int, ev *warrenv1.EventInput) error { return checkEvent(i, ev, true) }

// checkEventApplied is checkEventInput as the FSM runs it on every replica:
// the same checks, except that the payload's JSON is not scanned again
// (checkEventInput did so before the append was proposed; the scan was 5%
// of a replica's CPU under bench/appends). Whatever the kind needs from the
// payload is still parsed and checked here.
func checkEventApplied(i int, ev *warrenv1.EventInput) error { return checkEvent(i, ev, false) }

func checkEvent(i int, ev *warrenv1.EventInput, scanJSON bool) error {
	field := func() string { return fmt.Sprintf("events[%d]", i) }
	appendable, known := kinds[ev.GetKind()]
	switch {
	case ev.GetKind() == "":
		return fmt.Errorf("%s.kind: required", field())
	case !known:
		return fmt.Errorf("%s.kind: unknown kind %q", field(), ev.GetKind())
	case !appendable:
		return fmt.Errorf("%s.kind: %q is written by the server, not appended", field(), ev.GetKind())
	}
	if n := len(ev.GetPayload()); n > MaxPayloadBytes {
		return fmt.Errorf("%s.payload: %d bytes is over the %d-byte limit", field(), n, MaxPayloadBytes)
	}
	if len(ev.GetPayload()) == 0 {
		return nil // an empty payload means {}
	}
	// JSON (as encoding/json reads it) takes any byte in a string; SSE
	// and `task watch -o json` would then print text that is not UTF-8,
	// which strict readers refuse. Events the nodes build are marshalled
	// from Go strings, so this refuses only a writer's own bytes.
	if scanJSON && !utf8.Valid(ev.GetPayload()) {
		return fmt.Errorf("%s.payload: not UTF-8 text", field())
	}
	if scanJSON && !isJSONObject(ev.GetPayload()) {
		var obj map[string]json.RawMessage
		err := json.Unmarshal(ev.GetPayload(), &obj) // only to say why
		return fmt.Errorf("%s.payload: not a JSON object: %v", field(), err)
	}
	switch ev.GetKind() {
	case KindStateChanged:
		var p struct {
			To string `json:"to"`
		}
		_ = json.Unmarshal(ev.GetPayload(), &p)
		if _, ok := stateByName[p.To]; !ok {
			return fmt.Errorf("%s.payload.to: unknown state %q", field(), p.To)
		}
		if scanJSON {
			if err := oneSpelling(ev.GetPayload(), "to", p.To); err != nil {
				return fmt.Errorf("%s.payload.to: %w", field(), err)
			}
		}
	case KindApprovalRequested:
		var p struct {
			ToolCallID string `json:"tool_call_id"`
		}
		_ = json.Unmarshal(ev.GetPayload(), &p)
		if p.ToolCallID == "" {
			return fmt.Errorf("%s.payload.tool_call_id: required", field())
		}
		if scanJSON {
			if err := oneSpelling(ev.GetPayload(), "tool_call_id", p.ToolCallID); err != nil {
				return fmt.Errorf("%s.payload.tool_call_id: %w", field(), err)
			}
		}
		// A new append (not one being applied: committed entries keep
		// the rule they were made under) asks only for a decision that
		// Approve and Reject can name: one they refuse could never be
		// decided, and its task would wait until cancelled.
		if scanJSON {
			var pr problems
			pr.text(field()+".payload.tool_call_id", p.ToolCallID, true, maxRequestID, true)
			if err := pr.err(); err != nil {
				return err
			}
		}
	}
	return nil
}

// oneSpelling checks that a payload's key reads the same to the FSM, which
// takes the key spelt exactly (payloadString), as to encoding/json's
// struct decoding, which matches a key in any case and keeps the last
// match (the check above, and the nodes). Otherwise a payload like
// {"TOOL_CALL_ID":"c1"} passed the check as c1 and was recorded as a
// pending approval for "", which Approve and Reject cannot name.
// Committed entries are not checked again (they keep the rule they were
// made under).
func oneSpelling(payload []byte, key, structValue string) error {
	if exact := payloadString(payload, key); exact != structValue {
		return fmt.Errorf("read as %q, and as %q with the key spelt another way or given twice; give %q once, in lower case", exact, structValue, key)
	}
	return nil
}

// isJSONObject reports whether p is one valid JSON object, without
// allocating (this runs for every event a server receives). It accepts
// what encoding/json.Valid accepts (FuzzIsJSONObject), with segmentio's
// validator: encoding/json's state machine was about 5% of the leader's
// CPU at 1024 writers, and segmentio's is 18 times as fast on a 256-byte
// payload and 3 times on a tool result full of escapes.
func isJSONObject(p []byte) bool {
	p = bytes.TrimLeft(p, " \t\r\n")
	return len(p) > 0 && p[0] == '{' && segjson.Valid(p)
}

// mustJSON marshals server-built payloads, which cannot fail.
func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}
