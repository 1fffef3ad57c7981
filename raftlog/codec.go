package raftlog

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"time"

	"github.com/hashicorp/raft"
)

// ErrCorrupt is returned (wrapped) when stored data cannot be decoded.
var ErrCorrupt = errors.New("corrupt data")

// Encoding of a raft.Log (all integers little-endian or varint):
//
//	version   1 byte, codecVersion
//	type      1 byte, raft.LogType
//	flags     1 byte, bit 0: AppendedAt is set; other bits must be zero
//	index     uvarint
//	term      uvarint
//	[if flags&flagTime] seconds varint (Unix), nanoseconds uvarint (< 1e9)
//	data      uvarint length, bytes
//	ext       uvarint length, bytes
//	crc       4 bytes, CRC-32C of everything before it
//
// Empty Data and Extensions decode as nil. AppendedAt decodes in the local
// time zone and without a monotonic reading; it is Equal to what was stored.
const (
	codecVersion byte = 1
	flagTime     byte = 1 << 0
	crcLen            = 4
	headerLen         = 3
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// encodedLen returns the exact number of bytes encodeLog writes for l.
func encodedLen(l *raft.Log) int {
	n := headerLen + uvarintLen(l.Index) + uvarintLen(l.Term)
	if !l.AppendedAt.IsZero() {
		n += varintLen(l.AppendedAt.Unix()) + uvarintLen(uint64(l.AppendedAt.Nanosecond()))
	}
	n += uvarintLen(uint64(len(l.Data))) + len(l.Data)
	n += uvarintLen(uint64(len(l.Extensions))) + len(l.Extensions)
	return n + crcLen
}

// encodeLog writes l into dst, which must be exactly encodedLen(l) bytes.
func encodeLog(dst []byte, l *raft.Log) {
	var flags byte
	if !l.AppendedAt.IsZero() {
		flags |= flagTime
	}
	dst[0], dst[1], dst[2] = codecVersion, byte(l.Type), flags
	n := headerLen
	n += binary.PutUvarint(dst[n:], l.Index)
	n += binary.PutUvarint(dst[n:], l.Term)
	if flags&flagTime != 0 {
		n += binary.PutVarint(dst[n:], l.AppendedAt.Unix())
		n += binary.PutUvarint(dst[n:], uint64(l.AppendedAt.Nanosecond()))
	}
	n += binary.PutUvarint(dst[n:], uint64(len(l.Data)))
	n += copy(dst[n:], l.Data)
	n += binary.PutUvarint(dst[n:], uint64(len(l.Extensions)))
	n += copy(dst[n:], l.Extensions)
	binary.LittleEndian.PutUint32(dst[n:], crc32.Checksum(dst[:n], castagnoli))
}

// decodeLog decodes buf into l. l.Data and l.Extensions alias buf, so the
// caller must own buf. It returns an error wrapping ErrCorrupt for any input
// that encodeLog could not have produced, and never panics.
func decodeLog(buf []byte, l *raft.Log) error {
	if len(buf) < headerLen+crcLen {
		return fmt.Errorf("%w: %d bytes is too short", ErrCorrupt, len(buf))
	}
	body := buf[:len(buf)-crcLen]
	if want, got := binary.LittleEndian.Uint32(buf[len(body):]), crc32.Checksum(body, castagnoli); want != got {
		return fmt.Errorf("%w: checksum %08x, want %08x", ErrCorrupt, got, want)
	}
	if body[0] != codecVersion {
		return fmt.Errorf("%w: unknown version %d", ErrCorrupt, body[0])
	}
	typ, flags := raft.LogType(body[1]), body[2]
	if flags&^flagTime != 0 {
		return fmt.Errorf("%w: unknown flags %#x", ErrCorrupt, flags)
	}
	d := decoder{buf: body[headerLen:]}
	index := d.uvarint("index")
	term := d.uvarint("term")
	var appendedAt time.Time
	if flags&flagTime != 0 {
		sec := d.varint("appended-at seconds")
		nsec := d.uvarint("appended-at nanoseconds")
		if d.err == nil && nsec >= uint64(time.Second) {
			d.err = fmt.Errorf("%w: appended-at nanoseconds %d out of range", ErrCorrupt, nsec)
		}
		appendedAt = time.Unix(sec, int64(nsec))
	}
	data := d.bytes("data")
	ext := d.bytes("extensions")
	if d.err != nil {
		return d.err
	}
	if len(d.buf) != 0 {
		return fmt.Errorf("%w: %d trailing bytes", ErrCorrupt, len(d.buf))
	}
	*l = raft.Log{
		Index:      index,
		Term:       term,
		Type:       typ,
		Data:       data,
		Extensions: ext,
		AppendedAt: appendedAt,
	}
	return nil
}

// decoder reads fields from buf, remembering the first error.
type decoder struct {
	buf []byte
	err error
}

func (d *decoder) uvarint(field string) uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.buf)
	if n <= 0 {
		d.err = fmt.Errorf("%w: bad %s varint", ErrCorrupt, field)
		return 0
	}
	d.buf = d.buf[n:]
	return v
}

func (d *decoder) varint(field string) int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.buf)
	if n <= 0 {
		d.err = fmt.Errorf("%w: bad %s varint", ErrCorrupt, field)
		return 0
	}
	d.buf = d.buf[n:]
	return v
}

func (d *decoder) bytes(field string) []byte {
	n := d.uvarint(field + " length")
	if d.err != nil {
		return nil
	}
	if n > uint64(len(d.buf)) {
		d.err = fmt.Errorf("%w: %s length %d exceeds the %d bytes left", ErrCorrupt, field, n, len(d.buf))
		return nil
	}
	if n == 0 {
		return nil
	}
	b := d.buf[:n:n]
	d.buf = d.buf[n:]
	return b
}

func uvarintLen(v uint64) int {
	n := 1
	for v >= 0x80 {
		v >>= 7
		n++
	}
	return n
}

func varintLen(v int64) int {
	// Zig-zag, as binary.PutVarint does.
	u := uint64(v) << 1
	if v < 0 {
		u = ^u
	}
	return uvarintLen(u)
}
