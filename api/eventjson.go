package api

import (
	"encoding/json"
	"time"

	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
)

// EventJSON is the JSON form of an event used by the SSE gateway and by
// `warren task watch -o json`: the payload is inlined as a JSON value.
type EventJSON struct {
	TaskID string    `json:"task_id"`
	Seq    uint64    `json:"seq"`
	Time   time.Time `json:"time"`
	Kind   string    `json:"kind"`
	Epoch  uint64    `json:"epoch,omitempty"`
	// RequestID is set on the events of an append that gave expected_seq.
	RequestID string          `json:"request_id,omitempty"`
	Payload   json.RawMessage `json:"payload"`
}

// MarshalEvent renders ev as one line of JSON (no trailing newline).
func MarshalEvent(ev *warrenv1.Event) ([]byte, error) {
	p := json.RawMessage(ev.GetPayload())
	if len(p) == 0 || !json.Valid(p) {
		p = json.RawMessage("{}")
	}
	// A time JSON cannot hold (outside the years 1 to 9999: a log written
	// before the servers checked forwarded times) is left at the zero
	// time: an error here would end every stream of the task on it.
	var at time.Time
	if ev.GetTime().CheckValid() == nil {
		at = ev.GetTime().AsTime().UTC()
	}
	return json.Marshal(EventJSON{
		TaskID:    ev.GetTaskId(),
		Seq:       ev.GetSeq(),
		Time:      at,
		Kind:      ev.GetKind(),
		Epoch:     ev.GetEpoch(),
		RequestID: ev.GetRequestId(),
		Payload:   p,
	})
}
