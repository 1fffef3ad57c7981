package raftlog

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

func encode(l *raft.Log) []byte {
	buf := make([]byte, encodedLen(l))
	encodeLog(buf, l)
	return buf
}

// logsEqual compares every field of a raft.Log, treating nil and empty
// slices as equal and times with time.Time.Equal.
func logsEqual(a, b *raft.Log) bool {
	return a.Index == b.Index && a.Term == b.Term && a.Type == b.Type &&
		bytes.Equal(a.Data, b.Data) && bytes.Equal(a.Extensions, b.Extensions) &&
		a.AppendedAt.Equal(b.AppendedAt)
}

var codecCases = []struct {
	name string
	log  raft.Log
}{
	{"zero", raft.Log{}},
	{"command", raft.Log{Index: 1, Term: 1, Type: raft.LogCommand, Data: []byte("hello")}},
	{"all fields", raft.Log{
		Index: 42, Term: 7, Type: raft.LogConfiguration,
		Data: []byte{0, 1, 2, 3}, Extensions: []byte("ext"),
		AppendedAt: time.Date(2025, 3, 4, 5, 6, 7, 891011121, time.UTC),
	}},
	{"max ints", raft.Log{Index: math.MaxUint64, Term: math.MaxUint64, Type: raft.LogType(255)}},
	{"pre-epoch time", raft.Log{Index: 3, AppendedAt: time.Date(1900, 1, 1, 0, 0, 0, 1, time.UTC)}},
	{"extensions only", raft.Log{Index: 9, Type: raft.LogBarrier, Extensions: []byte{0xff}}},
	{"large data", raft.Log{Index: 1 << 40, Term: 300, Data: bytes.Repeat([]byte("x"), 1<<16)}},
	{"time with zone", raft.Log{Index: 5, AppendedAt: time.Date(2030, 12, 31, 23, 59, 59, 999999999, time.FixedZone("X", 3600))}},
}

func TestCodecRoundTrip(t *testing.T) {
	for _, tc := range codecCases {
		t.Run(tc.name, func(t *testing.T) {
			buf := encode(&tc.log)
			if len(buf) != encodedLen(&tc.log) {
				t.Fatalf("encoded %d bytes, encodedLen says %d", len(buf), encodedLen(&tc.log))
			}
			var got raft.Log
			if err := decodeLog(buf, &got); err != nil {
				t.Fatalf("decode: %v", err)
			}
			if !logsEqual(&got, &tc.log) {
				t.Fatalf("round trip:\n got %+v\nwant %+v", got, tc.log)
			}
		})
	}
}

func TestCodecCompact(t *testing.T) {
	// A typical entry costs a few bytes beyond its data.
	l := raft.Log{Index: 1 << 20, Term: 5, Data: make([]byte, 1024), AppendedAt: time.Unix(1.7e9, 123)}
	if n, overhead := encodedLen(&l), encodedLen(&l)-len(l.Data); overhead > 24 {
		t.Fatalf("encoded %d bytes for %d data bytes: overhead %d > 24", n, len(l.Data), overhead)
	}
}

func TestDecodeRejects(t *testing.T) {
	valid := encode(&codecCases[2].log)
	withCRC := func(body []byte) []byte {
		out := append([]byte(nil), body...)
		return binary.LittleEndian.AppendUint32(out, crc32.Checksum(body, castagnoli))
	}
	body := valid[:len(valid)-crcLen]
	flipped := append([]byte(nil), valid...)
	flipped[len(flipped)/2] ^= 0x10

	cases := []struct {
		name string
		buf  []byte
	}{
		{"nil", nil},
		{"short", []byte{1, 2, 3}},
		{"bit flip", flipped},
		{"bad crc", append(append([]byte(nil), body...), 0, 0, 0, 0)},
		{"bad version", withCRC(append([]byte{9}, body[1:]...))},
		{"bad flags", withCRC(append([]byte{codecVersion, 0, 0x80}, body[3:]...))},
		{"trailing byte", withCRC(append(append([]byte(nil), body...), 0))},
		{"truncated body", withCRC(body[:len(body)-1])},
		{"header only", withCRC([]byte{codecVersion, 0, 0})},
		{"overlong varint", withCRC([]byte{codecVersion, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01})},
		{"huge length", withCRC([]byte{codecVersion, 0, 0, 1, 1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01})},
		{"nanos out of range", withCRC(binary.AppendUvarint(binary.AppendVarint([]byte{codecVersion, 0, flagTime, 1, 1}, 5), uint64(time.Second)))},
	}
	for i := range len(valid) {
		cases = append(cases, struct {
			name string
			buf  []byte
		}{fmt.Sprintf("truncated to %d", i), valid[:i]})
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var l raft.Log
			err := decodeLog(tc.buf, &l)
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("decodeLog(%x) = %v, want ErrCorrupt", tc.buf, err)
			}
		})
	}
}

// FuzzDecodeLog checks that decodeLog never panics, and that whatever it
// accepts re-encodes to an equal entry. Each input is also tried with a
// correct checksum appended so the fuzzer gets past the CRC.
func FuzzDecodeLog(f *testing.F) {
	for _, tc := range codecCases {
		buf := encode(&tc.log)
		if len(buf) > 256 {
			continue // large seeds make the fuzzer's minimisation crawl
		}
		f.Add(buf)
		f.Add(buf[:len(buf)-crcLen])
		f.Add(buf[:len(buf)/2])
	}
	f.Add([]byte{})
	f.Add([]byte{codecVersion, 0, flagTime, 1, 1, 0x80})
	f.Fuzz(func(t *testing.T, in []byte) {
		fixed := binary.LittleEndian.AppendUint32(append([]byte(nil), in...), crc32.Checksum(in, castagnoli))
		for _, buf := range [][]byte{in, fixed} {
			var l raft.Log
			if err := decodeLog(buf, &l); err != nil {
				if !errors.Is(err, ErrCorrupt) {
					t.Fatalf("error %v does not wrap ErrCorrupt", err)
				}
				continue
			}
			var again raft.Log
			if err := decodeLog(encode(&l), &again); err != nil {
				t.Fatalf("re-encoding of an accepted entry is rejected: %v", err)
			}
			if !logsEqual(&l, &again) {
				t.Fatalf("re-encode changed the entry:\n got %+v\nwant %+v", again, l)
			}
		}
	})
}

// FuzzLogRoundTrip checks encode then decode is the identity on all fields.
func FuzzLogRoundTrip(f *testing.F) {
	f.Add(uint64(1), uint64(1), uint8(0), []byte("x"), []byte(nil), int64(0), int64(0), false)
	f.Add(uint64(math.MaxUint64), uint64(0), uint8(5), []byte(nil), []byte("e"), int64(-1e12), int64(999999999), true)
	f.Fuzz(func(t *testing.T, index, term uint64, typ uint8, data, ext []byte, sec, nsec int64, hasTime bool) {
		l := raft.Log{Index: index, Term: term, Type: raft.LogType(typ), Data: data, Extensions: ext}
		if hasTime {
			l.AppendedAt = time.Unix(sec, nsec)
		}
		var got raft.Log
		if err := decodeLog(encode(&l), &got); err != nil {
			t.Fatalf("decode: %v", err)
		}
		if !logsEqual(&got, &l) {
			t.Fatalf("round trip:\n got %+v\nwant %+v", got, l)
		}
	})
}
