package scheduler

import (
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/types/known/timestamppb"

	fsmv1 "github.com/warrenhq/warren/api/gen/warren/fsm/v1"
	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
)

// decodeAppendEvents decodes the body of an AppendEvents command (what
// follows the type byte) without protobuf's reflection: each event's
// payload is a sub-slice of b instead of a copy, and known kinds are not
// allocated again. Every replica decodes every append this way; with
// proto.Unmarshal the decode was about a tenth of a follower's CPU under
// load. The caller keeps b unchanged while the message is in use (a raft
// entry's data is never changed).
//
// It handles the shape the servers encode and returns false for anything
// else: an unknown field, a known field with another wire type, a repeated
// time, invalid UTF-8 in a string, a malformed encoding. DecodeCommand then
// decodes it the general way or refuses it with its error. So it never
// accepts what proto.Unmarshal refuses, and what it accepts it decodes as
// proto.Unmarshal does (FuzzDecodeAppendEvents).
func decodeAppendEvents(b []byte) (*fsmv1.AppendEvents, bool) {
	m := &fsmv1.AppendEvents{}
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, false
		}
		b = b[n:]
		switch {
		case typ == protowire.VarintType && (num == 2 || num == 6):
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return nil, false
			}
			b = b[n:]
			if num == 2 {
				m.LeaseEpoch = v
			} else {
				m.ExpectedSeq = v
			}
		case typ == protowire.BytesType && num >= 1 && num <= 5:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return nil, false
			}
			b = b[n:]
			switch num {
			case 1, 4: // task_id, request_id: the last one wins, as in proto
				if !utf8.Valid(v) {
					return nil, false
				}
				if num == 1 {
					m.TaskId = string(v)
				} else {
					m.RequestId = string(v)
				}
			case 3:
				ev, ok := decodeEventInput(v)
				if !ok {
					return nil, false
				}
				m.Events = append(m.Events, ev)
			case 5:
				if m.Time != nil { // proto would merge the two
					return nil, false
				}
				ts, ok := decodeTimestamp(v)
				if !ok {
					return nil, false
				}
				m.Time = ts
			default: // 2 with the bytes wire type
				return nil, false
			}
		default:
			return nil, false
		}
	}
	return m, true
}

func decodeEventInput(b []byte) (*warrenv1.EventInput, bool) {
	ev := &warrenv1.EventInput{}
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 || typ != protowire.BytesType || (num != 1 && num != 2) {
			return nil, false
		}
		b = b[n:]
		v, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return nil, false
		}
		b = b[n:]
		if num == 2 {
			ev.Payload = nil // proto3 bytes: empty decodes as nil
			if len(v) > 0 {
				ev.Payload = v[:len(v):len(v)]
			}
			continue
		}
		if k, ok := kindNames[string(v)]; ok {
			ev.Kind = k
			continue
		}
		if !utf8.Valid(v) {
			return nil, false
		}
		ev.Kind = string(v)
	}
	return ev, true
}

func decodeTimestamp(b []byte) (*timestamppb.Timestamp, bool) {
	ts := &timestamppb.Timestamp{}
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 || typ != protowire.VarintType || (num != 1 && num != 2) {
			return nil, false
		}
		b = b[n:]
		v, n := protowire.ConsumeVarint(b)
		if n < 0 {
			return nil, false
		}
		b = b[n:]
		if num == 1 {
			ts.Seconds = int64(v)
		} else {
			ts.Nanos = int32(v)
		}
	}
	return ts, true
}

// kindNames holds one string per known kind, so decoding one does not
// allocate.
var kindNames = func() map[string]string {
	m := make(map[string]string, len(kinds))
	for k := range kinds {
		m[k] = k
	}
	return m
}()

// sizeAppendEvents returns the size of m's encoding, as proto.Size does,
// and false for what appendAppendEvents does not encode: what proto.Marshal
// would refuse (invalid UTF-8) or handles beyond the plain shape (unknown
// fields, a nil event). EncodeCommand then uses proto.Marshal.
func sizeAppendEvents(m *fsmv1.AppendEvents) (int, bool) {
	if !utf8.ValidString(m.GetTaskId()) || !utf8.ValidString(m.GetRequestId()) ||
		len(m.ProtoReflect().GetUnknown()) > 0 || len(m.GetTime().ProtoReflect().GetUnknown()) > 0 {
		return 0, false
	}
	n := 0
	if id := m.GetTaskId(); id != "" {
		n += protowire.SizeTag(1) + protowire.SizeBytes(len(id))
	}
	if e := m.GetLeaseEpoch(); e != 0 {
		n += protowire.SizeTag(2) + protowire.SizeVarint(e)
	}
	for _, ev := range m.GetEvents() {
		if ev == nil || !utf8.ValidString(ev.GetKind()) || len(ev.ProtoReflect().GetUnknown()) > 0 {
			return 0, false
		}
		n += protowire.SizeTag(3) + protowire.SizeBytes(eventInputSize(ev))
	}
	if id := m.GetRequestId(); id != "" {
		n += protowire.SizeTag(4) + protowire.SizeBytes(len(id))
	}
	if ts := m.GetTime(); ts != nil {
		n += protowire.SizeTag(5) + protowire.SizeBytes(timestampSize(ts))
	}
	if s := m.GetExpectedSeq(); s != 0 {
		n += protowire.SizeTag(6) + protowire.SizeVarint(s)
	}
	return n, true
}

// appendAppendEvents appends m's encoding to b as proto.Marshal writes it
// (TestEncodeAppendEventsMatchesProto), without reflection: the leader
// encodes every append it is sent, and proto.Marshal was most of its
// EncodeCommand time. Only for m that sizeAppendEvents accepts.
func appendAppendEvents(b []byte, m *fsmv1.AppendEvents) []byte {
	if id := m.GetTaskId(); id != "" {
		b = protowire.AppendTag(b, 1, protowire.BytesType)
		b = protowire.AppendString(b, id)
	}
	if e := m.GetLeaseEpoch(); e != 0 {
		b = protowire.AppendTag(b, 2, protowire.VarintType)
		b = protowire.AppendVarint(b, e)
	}
	for _, ev := range m.GetEvents() {
		b = protowire.AppendTag(b, 3, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(eventInputSize(ev)))
		if k := ev.GetKind(); k != "" {
			b = protowire.AppendTag(b, 1, protowire.BytesType)
			b = protowire.AppendString(b, k)
		}
		if p := ev.GetPayload(); len(p) != 0 {
			b = protowire.AppendTag(b, 2, protowire.BytesType)
			b = protowire.AppendBytes(b, p)
		}
	}
	if id := m.GetRequestId(); id != "" {
		b = protowire.AppendTag(b, 4, protowire.BytesType)
		b = protowire.AppendString(b, id)
	}
	if ts := m.GetTime(); ts != nil {
		b = appendTimestampField(b, 5, ts)
	}
	if s := m.GetExpectedSeq(); s != 0 {
		b = protowire.AppendTag(b, 6, protowire.VarintType)
		b = protowire.AppendVarint(b, s)
	}
	return b
}

func eventInputSize(ev *warrenv1.EventInput) int {
	n := 0
	if k := ev.GetKind(); k != "" {
		n += protowire.SizeTag(1) + protowire.SizeBytes(len(k))
	}
	if p := ev.GetPayload(); len(p) != 0 {
		n += protowire.SizeTag(2) + protowire.SizeBytes(len(p))
	}
	return n
}
