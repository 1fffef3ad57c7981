package scheduler

import (
	"fmt"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// appendEventValue appends the stored form of an event (a warren.v1.Event
// without task_id, which its key holds) to b: the same wire format
// proto.Marshal writes, encoded directly. Every replica's FSM writes one
// value per event, and the generic marshaller's reflection and the
// message it needs were a few percent of a follower's CPU. Readers decode
// it with proto.Unmarshal; TestEventValueRoundTrips checks the two agree.
func appendEventValue(b []byte, seq uint64, ts *timestamppb.Timestamp, kind string, payload []byte, epoch uint64, requestID string) []byte {
	if seq != 0 {
		b = protowire.AppendTag(b, 2, protowire.VarintType)
		b = protowire.AppendVarint(b, seq)
	}
	if ts != nil {
		b = appendTimestampField(b, 3, ts)
	}
	if kind != "" {
		b = protowire.AppendTag(b, 4, protowire.BytesType)
		b = protowire.AppendString(b, kind)
	}
	if len(payload) != 0 {
		b = protowire.AppendTag(b, 5, protowire.BytesType)
		b = protowire.AppendBytes(b, payload)
	}
	if epoch != 0 {
		b = protowire.AppendTag(b, 6, protowire.VarintType)
		b = protowire.AppendVarint(b, epoch)
	}
	if requestID != "" {
		b = protowire.AppendTag(b, 7, protowire.BytesType)
		b = protowire.AppendString(b, requestID)
	}
	return b
}

// appendTimestampField appends ts as field num of a message, as
// proto.Marshal writes it.
func appendTimestampField(b []byte, num protowire.Number, ts *timestamppb.Timestamp) []byte {
	b = protowire.AppendTag(b, num, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(timestampSize(ts)))
	if s := ts.GetSeconds(); s != 0 {
		b = protowire.AppendTag(b, 1, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(s))
	}
	if ns := ts.GetNanos(); ns != 0 {
		b = protowire.AppendTag(b, 2, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(int64(ns)))
	}
	return b
}

// timestampSize is the encoded size of ts's fields.
func timestampSize(ts *timestamppb.Timestamp) int {
	n := 0
	if s := ts.GetSeconds(); s != 0 {
		n += protowire.SizeTag(1) + protowire.SizeVarint(uint64(s))
	}
	if ns := ts.GetNanos(); ns != 0 {
		n += protowire.SizeTag(2) + protowire.SizeVarint(uint64(int64(ns)))
	}
	return n
}

// eventRequestID returns the request_id of a stored event without decoding
// the rest (its payload may be 64 KiB): the request index reads it from
// every event of a task when it rebuilds the task's set.
func eventRequestID(v []byte) (string, error) {
	var id []byte
	err := eachBytesField(v, 7, func(b []byte) { id = b }) // the last one wins, as in proto.Unmarshal
	return string(id), err
}

// eachBytesField calls fn, in order, with the value of every field of the
// encoded message b that has number num and the bytes wire type (as
// sub-slices of b), and checks the other fields' encoding as
// proto.Unmarshal does, skipping their values.
func eachBytesField(b []byte, num protowire.Number, fn func([]byte)) error {
	for len(b) > 0 {
		n, typ, l := protowire.ConsumeTag(b)
		if l < 0 {
			return protowire.ParseError(l)
		}
		if !n.IsValid() {
			return fmt.Errorf("invalid field number %d", n)
		}
		b = b[l:]
		if n == num && typ == protowire.BytesType {
			v, m := protowire.ConsumeBytes(b)
			if m < 0 {
				return protowire.ParseError(m)
			}
			fn(v)
			b = b[m:]
			continue
		}
		m := protowire.ConsumeFieldValue(n, typ, b)
		if m < 0 {
			return protowire.ParseError(m)
		}
		b = b[m:]
	}
	return nil
}
