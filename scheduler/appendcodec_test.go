package scheduler

import (
	"strings"
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

// drawAppend draws an AppendEvents as a server builds one.
func drawAppend(rt *rapid.T) *fsmv1.AppendEvents {
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
	return m
}

// EncodeCommand writes every AppendEvents a server builds without
// proto.Marshal, and writes the bytes proto.Marshal writes.
func TestEncodeAppendEventsMatchesProto(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		m := drawAppend(rt)
		n, ok := sizeAppendEvents(m)
		if !ok {
			rt.Fatalf("%v: not encoded on the fast path", m)
		}
		if n != proto.Size(m) {
			rt.Fatalf("size %d, proto.Size gives %d", n, proto.Size(m))
		}
		got, err := EncodeCommand(m)
		if err != nil {
			rt.Fatal(err)
		}
		want, err := proto.Marshal(m)
		if err != nil {
			rt.Fatal(err)
		}
		if got[0] != byte(CmdAppendEvents) || string(got[1:]) != string(want) {
			rt.Fatalf("encoded %x, want %02x%x", got, byte(CmdAppendEvents), want)
		}
		if cap(got) != len(got) {
			rt.Fatalf("capacity %d for %d bytes: the size was not exact", cap(got), len(got))
		}
	})
}

// What the fast encoder leaves alone still encodes as proto.Marshal does,
// or fails as it does.
func TestEncodeAppendEventsFallsBack(t *testing.T) {
	var withUnknown warrenv1.EventInput
	if err := proto.Unmarshal([]byte{0x0a, 0x03, 'l', 'o', 'g', 0x18, 0x07}, &withUnknown); err != nil { // field 3: unknown
		t.Fatal(err)
	}
	m := &fsmv1.AppendEvents{TaskId: "t", Events: []*warrenv1.EventInput{&withUnknown}}
	if _, ok := sizeAppendEvents(m); ok {
		t.Fatal("an event with an unknown field took the fast path")
	}
	got, err := EncodeCommand(m)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := proto.Marshal(m)
	if string(got[1:]) != string(want) {
		t.Fatalf("encoded %x, want %x", got[1:], want)
	}
	for _, bad := range []*fsmv1.AppendEvents{
		{TaskId: "t\xff"},
		{TaskId: "t", RequestId: "\xc3"},
		{TaskId: "t", Events: []*warrenv1.EventInput{{Kind: "\xff"}}},
	} {
		if _, err := EncodeCommand(bad); err == nil {
			t.Errorf("%q: encoded invalid UTF-8", bad.String())
		}
	}
}

// Every AppendEvents a server encodes takes the fast path and decodes as
// proto.Unmarshal decodes it.
func TestDecodeAppendEventsMatchesProto(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		m := drawAppend(rt)
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

// BenchmarkEncodeAppendEvents compares EncodeCommand's encoding of a
// typical append (one 256-byte event) with proto.Marshal's, in one run.
func BenchmarkEncodeAppendEvents(b *testing.B) {
	m := &fsmv1.AppendEvents{
		TaskId: "01KBJ6Z3M8Q7R2S5T9V4W6X8Y0", RequestId: "app-0123456789abcdef01234567", LeaseEpoch: 3,
		Time:   timestamppb.Now(),
		Events: []*warrenv1.EventInput{{Kind: KindLog, Payload: []byte(`{"line":"` + strings.Repeat("x", 240) + `"}`)}},
	}
	b.Run("fast", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := EncodeCommand(m); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("proto", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			buf := make([]byte, 1, 1+proto.Size(m))
			if _, err := (proto.MarshalOptions{}).MarshalAppend(buf, m); err != nil {
				b.Fatal(err)
			}
		}
	})
}
