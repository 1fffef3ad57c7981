package noded

import (
	"errors"
	"testing"
	"time"

	"connectrpc.com/connect"
)

// A node the servers refuse says so at once, above debug; one that cannot
// reach them says so after warnAfter; then once a minute, not at every
// retry; a healthy session starts over.
func TestSessionWarner(t *testing.T) {
	t0 := time.Date(2026, 12, 6, 0, 0, 0, 0, time.UTC)
	refused := connect.NewError(connect.CodeInvalidArgument, errors.New("node.id: bad"))
	down := errors.New("dial tcp 127.0.0.1:1: connection refused")
	var w sessionWarner
	steps := []struct {
		at      time.Duration
		err     error
		healthy bool
		want    bool
	}{
		{0, refused, false, true},
		{time.Second, refused, false, false},
		{30 * time.Second, refused, false, false},
		{61 * time.Second, refused, false, true},
		{62 * time.Second, nil, true, false}, // a healthy session
		{63 * time.Second, down, false, false},
		{70 * time.Second, down, false, false},
		{73 * time.Second, down, false, true}, // 10 s after the streak began
		{74 * time.Second, errors.New("other"), false, false},
		{134 * time.Second, down, false, true},
		// Another node with this --id: its text changes at each retry
		// (how long ago the other was heard), and it still warns once.
		{135 * time.Second, connect.NewError(connect.CodeAlreadyExists, errors.New("heard 10ms ago")), false, true},
		{136 * time.Second, connect.NewError(connect.CodeAlreadyExists, errors.New("heard 20ms ago")), false, false},
	}
	for i, s := range steps {
		if got := w.note(s.err, s.healthy, t0.Add(s.at)); got != s.want {
			t.Errorf("step %d (%v, %v): warn %v, want %v", i, s.at, s.err, got, s.want)
		}
	}
}
