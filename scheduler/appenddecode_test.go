package scheduler

import (
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
	"pgregory.net/rapid"

	fsmv1 "github.com/warrenhq/warren/api/gen/warren/fsm/v1"
	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
)

// sameAppend reports how got differs from proto.Unmarshal's want, also in
// what proto.Equal does not look at: a nil payload against an empty one.
func sameAppend(got, want *fsmv1.AppendEvents) string {
	if !proto.Equal(got, want) {
		return "messages differ"
	}
	for i, ev := range want.GetEvents() {
		if (ev.Payload == nil) != (got.GetEvents()[i].Payload == nil) {
			return "a payload's nil-ness differs"
		}
	}
	return ""
}

// Every AppendEvents a server encodes takes the fast path and decodes as
// proto.Unmarshal decodes it.
func TestDecodeAppendEventsMatchesProto(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		m := &fsmv1.AppendEvents{
			TaskId:      rapid.String().Draw(rt, "task_id"),
			LeaseEpoch:  rapid.OneOf(rapid.Just(uint64(0)), rapid.Uint64()).Draw(rt, "epoch"),
			RequestId:   rapid.String().Draw(rt, "request_id"),
			ExpectedSeq: rapid.OneOf(rapid.Just(uint64(0)), rapid.Uint64()).Draw(rt, "expected_seq"),
		}
		for range rapid.IntRange(0, 5).Draw(rt, "events") {
			m.Events = append(m.Events, &warrenv1.EventInput{
				Kind:    rapid.OneOf(rapid.SampledFrom(Kinds()), rapid.String()).Draw(rt, "kind"),
				Payload: rapid.SliceOf(rapid.Byte()).Draw(rt, "payload"),
			})
		}
		if rapid.Bool().Draw(rt, "has_time") {
			m.Time = &timestamppb.Timestamp{Seconds: rapid.Int64().Draw(rt, "seconds"), Nanos: rapid.Int32().Draw(rt, "nanos")}
		}
		b, err := EncodeCommand(m)
		if err != nil {
			rt.Fatal(err)
		}
		got, ok := decodeAppendEvents(b[1:])
		if !ok {
			rt.Fatalf("%x: not decoded on the fast path", b)
		}
		c, err := DecodeCommand(b)
		if err != nil {
			rt.Fatal(err)
		}
		if d := sameAppend(got, c.Body.(*fsmv1.AppendEvents)); d != "" {
			rt.Fatalf("%s: got %v, proto.Unmarshal gives %v", d, got, c.Body)
		}
	})
}

// Whatever decodeAppendEvents accepts, proto.Unmarshal accepts and decodes
// the same way; whatever else it gets, it leaves to DecodeCommand.
func FuzzDecodeAppendEvents(f *testing.F) {
	for _, m := range allCommands() {
		if a, ok := m.(*fsmv1.AppendEvents); ok {
			b, _ := EncodeCommand(a)
			f.Add(b[1:])
		}
	}
	f.Add([]byte{0x0a, 0x01, 't', 0x0a, 0x01, 'u'})               // task_id twice: the last wins
	f.Add([]byte{0x1a, 0x04, 0x12, 0x00, 0x0a, 0x00})             // an event with an empty payload and kind
	f.Add([]byte{0x2a, 0x02, 0x08, 0x01, 0x2a, 0x02, 0x10, 0x01}) // time twice: merged by proto
	f.Add([]byte{0x0a, 0x01, 0xff})                               // invalid UTF-8
	f.Add([]byte{0x38, 0x01})                                     // unknown field 7
	f.Add([]byte{0x10, 0x80})                                     // truncated varint
	f.Fuzz(func(t *testing.T, b []byte) {
		got, ok := decodeAppendEvents(b)
		if !ok {
			return
		}
		var want fsmv1.AppendEvents
		if err := proto.Unmarshal(b, &want); err != nil {
			t.Fatalf("%x: decoded on the fast path, proto.Unmarshal refuses it: %v", b, err)
		}
		if d := sameAppend(got, &want); d != "" {
			t.Fatalf("%x: %s: got %v, proto.Unmarshal gives %v", b, d, got, &want)
		}
	})
}
