package scheduler

import (
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
		var n int
		if s := ts.GetSeconds(); s != 0 {
			n += protowire.SizeTag(1) + protowire.SizeVarint(uint64(s))
		}
		if ns := ts.GetNanos(); ns != 0 {
			n += protowire.SizeTag(2) + protowire.SizeVarint(uint64(int64(ns)))
		}
		b = protowire.AppendTag(b, 3, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(n))
		if s := ts.GetSeconds(); s != 0 {
			b = protowire.AppendTag(b, 1, protowire.VarintType)
			b = protowire.AppendVarint(b, uint64(s))
		}
		if ns := ts.GetNanos(); ns != 0 {
			b = protowire.AppendTag(b, 2, protowire.VarintType)
			b = protowire.AppendVarint(b, uint64(int64(ns)))
		}
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

// eventRequestID returns the request_id of a stored event without decoding
// the rest (its payload may be 64 KiB): the request index reads it from
// every event of a task when it rebuilds the task's set.
func eventRequestID(v []byte) (string, error) {
	var id []byte
	for len(v) > 0 {
		num, typ, n := protowire.ConsumeTag(v)
		if n < 0 {
			return "", protowire.ParseError(n)
		}
		v = v[n:]
		if num == 7 && typ == protowire.BytesType {
			b, m := protowire.ConsumeBytes(v)
			if m < 0 {
				return "", protowire.ParseError(m)
			}
			id, v = b, v[m:] // the last one wins, as in proto.Unmarshal
			continue
		}
		m := protowire.ConsumeFieldValue(num, typ, v)
		if m < 0 {
			return "", protowire.ParseError(m)
		}
		v = v[m:]
	}
	return string(id), nil
}
