package scheduler

import (
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
	"pgregory.net/rapid"

	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
)

// The hand-written encoder and proto.Marshal write the same bytes, so
// every reader (proto.Unmarshal) sees the event the FSM meant.
func TestEventValueRoundTrips(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		want := &warrenv1.Event{
			Seq:       rapid.OneOf(rapid.Just(uint64(0)), rapid.Uint64()).Draw(rt, "seq"),
			Kind:      rapid.String().Draw(rt, "kind"),
			Payload:   rapid.SliceOf(rapid.Byte()).Draw(rt, "payload"),
			Epoch:     rapid.OneOf(rapid.Just(uint64(0)), rapid.Uint64()).Draw(rt, "epoch"),
			RequestId: rapid.String().Draw(rt, "request_id"),
		}
		if rapid.Bool().Draw(rt, "has_time") {
			want.Time = &timestamppb.Timestamp{
				Seconds: rapid.Int64Range(-62135596800, 253402300799).Draw(rt, "seconds"),
				Nanos:   rapid.Int32Range(0, 999_999_999).Draw(rt, "nanos"),
			}
		}
		prefix := rapid.SliceOf(rapid.Byte()).Draw(rt, "scratch")
		got := appendEventValue(prefix, want.GetSeq(), want.GetTime(), want.GetKind(), want.GetPayload(), want.GetEpoch(), want.GetRequestId())[len(prefix):]
		ref, err := proto.MarshalOptions{Deterministic: true}.Marshal(want)
		if err != nil {
			rt.Fatal(err)
		}
		if string(got) != string(ref) {
			rt.Fatalf("encoded %x, proto.Marshal gives %x", got, ref)
		}
		if id, err := eventRequestID(got); err != nil || id != want.GetRequestId() {
			rt.Fatalf("eventRequestID = %q, %v; want %q", id, err, want.GetRequestId())
		}
		var back warrenv1.Event
		if err := proto.Unmarshal(got, &back); err != nil {
			rt.Fatal(err)
		}
		if len(want.GetPayload()) == 0 {
			want.Payload = nil
		}
		if !proto.Equal(&back, want) {
			rt.Fatalf("decoded %v, want %v", &back, want)
		}
	})
}

// eventRequestID reads the request id proto.Unmarshal reads from any
// value the latter accepts.
func FuzzEventRequestID(f *testing.F) {
	f.Add(appendEventValue(nil, 3, timestamppb.New(t0), "log", []byte(`{"a":1}`), 2, "req-1"))
	f.Add(appendEventValue(appendEventValue(nil, 1, nil, "", nil, 0, "first"), 0, nil, "", nil, 0, "second"))
	f.Add([]byte{0x3a, 0x03, 'a', 'b'})
	f.Fuzz(func(t *testing.T, v []byte) {
		var ev warrenv1.Event
		if err := proto.Unmarshal(v, &ev); err != nil {
			return
		}
		if id, err := eventRequestID(v); err != nil || id != ev.GetRequestId() {
			t.Fatalf("eventRequestID = %q, %v; proto.Unmarshal reads %q", id, err, ev.GetRequestId())
		}
	})
}
