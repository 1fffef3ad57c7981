package api

import (
	"encoding/json"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
)

func TestMarshalEvent(t *testing.T) {
	at := time.Date(2026, 12, 2, 17, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name string
		ev   *warrenv1.Event
		want string
	}{
		{"client event", &warrenv1.Event{TaskId: "t1", Seq: 2, Time: timestamppb.New(at), Kind: "message", Payload: []byte(`{"text":"hi"}`)},
			`{"task_id":"t1","seq":2,"time":"2026-12-02T17:00:00Z","kind":"message","payload":{"text":"hi"}}`},
		{"positioned append", &warrenv1.Event{TaskId: "t1", Seq: 3, Time: timestamppb.New(at), Kind: "log", Epoch: 4, RequestId: "r-1", Payload: []byte(`{}`)},
			`{"task_id":"t1","seq":3,"time":"2026-12-02T17:00:00Z","kind":"log","epoch":4,"request_id":"r-1","payload":{}}`},
		{"time JSON cannot hold", &warrenv1.Event{TaskId: "t1", Seq: 5, Time: &timestamppb.Timestamp{Seconds: 400000000000}, Kind: "log", Payload: []byte(`{}`)},
			`{"task_id":"t1","seq":5,"time":"0001-01-01T00:00:00Z","kind":"log","payload":{}}`},
		{"payload not JSON", &warrenv1.Event{TaskId: "t1", Seq: 4, Time: timestamppb.New(at), Kind: "log", Payload: []byte(`{`)},
			`{"task_id":"t1","seq":4,"time":"2026-12-02T17:00:00Z","kind":"log","payload":{}}`},
	} {
		got, err := MarshalEvent(tc.ev)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if string(got) != tc.want {
			t.Errorf("%s:\n got %s\nwant %s", tc.name, got, tc.want)
		}
		if !json.Valid(got) {
			t.Errorf("%s: not JSON", tc.name)
		}
	}
}
