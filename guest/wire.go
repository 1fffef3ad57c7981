package guest

import (
	"fmt"
	"math"

	"google.golang.org/protobuf/encoding/protowire"
)

// The wire codec: Request and Result in the protobuf wire format, written
// and read field by field with protowire, in frames of their own kinds
// (frameRequestWire, frameResultWire). An agent that reads it says so in
// its answers (Result.Wire), and a Client that knows it sends every call
// in it; the agent answers each call in the codec of its request.
//
// Why not JSON for every call: under TCG every code path a fresh clone
// runs for the first time is translated, and a clone's first calls ran
// encoding/json and reflect (about 790 of the agent's 6,950 translated
// blocks per restore). This codec is a few hundred lines of straight code.
//
// Field numbers, as a .proto would give them (never reuse one):
//
//	Request:   1 op, 2 argv (repeated), 3 env (repeated Entry), 4 dir,
//	           5 timeout_ms, 6 stdin, 7 path, 8 mode, 9 limit,
//	           10 unix_nano, 11 entropy, 12 hostname, 13 pids, 14 net,
//	           15 call, 16 mode_set
//	Entry:     1 key, 2 value
//	NetConfig: 1 iface, 2 addrs, 3 gateways, 4 dns (all but 1 repeated)
//	Result:    1 exit_code, 2 signal, 3 timed_out, 4 duration_us, 5 file,
//	           6 files (repeated), 7 stats, 8 guest_unix_nano, 9 ordered,
//	           10 wire
//	FileInfo:  1 name, 2 size, 3 mode, 4 mod_nano, 5 dir
//	Stats:     1 mem_total_kb, 2 mem_available_kb, 3 load1 (double),
//	           4 procs, 5 disk_total_kb, 6 disk_free_kb, 7 uptime_ms
//
// Integers are varints (negative ones as 64-bit two's complement, as
// protobuf's int64), booleans varints 0 or 1, strings and bytes
// length-delimited. A decoder skips fields it does not know, as JSON's
// does, and refuses a known field of the wrong type, naming it.
const (
	frameRequestWire byte = 'Q'
	frameResultWire  byte = 'R'
	frameFilesWire   byte = 'L'
)

func appendString(b []byte, num protowire.Number, s string) []byte {
	if s == "" {
		return b
	}
	return protowire.AppendString(protowire.AppendTag(b, num, protowire.BytesType), s)
}

func appendInt(b []byte, num protowire.Number, v int64) []byte {
	if v == 0 {
		return b
	}
	return protowire.AppendVarint(protowire.AppendTag(b, num, protowire.VarintType), uint64(v))
}

func appendBool(b []byte, num protowire.Number, v bool) []byte {
	if !v {
		return b
	}
	return protowire.AppendVarint(protowire.AppendTag(b, num, protowire.VarintType), 1)
}

func appendStrings(b []byte, num protowire.Number, ss []string) []byte {
	for _, s := range ss {
		b = protowire.AppendString(protowire.AppendTag(b, num, protowire.BytesType), s)
	}
	return b
}

// appendMessage appends field num holding the message enc appends.
func appendMessage(b []byte, num protowire.Number, enc func([]byte) []byte) []byte {
	return protowire.AppendBytes(protowire.AppendTag(b, num, protowire.BytesType), enc(nil))
}

func (r *Request) appendWire(b []byte) []byte {
	b = appendString(b, 1, string(r.Op))
	b = appendStrings(b, 2, r.Argv)
	for k, v := range r.Env {
		b = appendMessage(b, 3, func(e []byte) []byte {
			// Both fields always, so an empty name or value survives.
			e = protowire.AppendString(protowire.AppendTag(e, 1, protowire.BytesType), k)
			return protowire.AppendString(protowire.AppendTag(e, 2, protowire.BytesType), v)
		})
	}
	b = appendString(b, 4, r.Dir)
	b = appendInt(b, 5, r.TimeoutMS)
	b = appendBool(b, 6, r.Stdin)
	b = appendString(b, 7, r.Path)
	b = appendInt(b, 8, int64(r.Mode))
	b = appendInt(b, 9, r.Limit)
	b = appendInt(b, 10, r.UnixNano)
	if len(r.Entropy) > 0 {
		b = protowire.AppendBytes(protowire.AppendTag(b, 11, protowire.BytesType), r.Entropy)
	}
	b = appendString(b, 12, r.Hostname)
	b = appendInt(b, 13, int64(r.Pids))
	if r.Net != nil {
		b = appendMessage(b, 14, r.Net.appendWire)
	}
	b = appendInt(b, 15, int64(r.Call))
	return appendBool(b, 16, r.ModeSet)
}

func (c *NetConfig) appendWire(b []byte) []byte {
	// iface always: a present but empty message is a NetConfig all the same.
	b = protowire.AppendString(protowire.AppendTag(b, 1, protowire.BytesType), c.Iface)
	b = appendStrings(b, 2, c.Addrs)
	b = appendStrings(b, 3, c.Gateways)
	return appendStrings(b, 4, c.DNS)
}

func (r *Result) appendWire(b []byte) []byte {
	b = appendInt(b, 1, int64(r.ExitCode))
	b = appendInt(b, 2, int64(r.Signal))
	b = appendBool(b, 3, r.TimedOut)
	b = appendInt(b, 4, r.DurationUS)
	if r.File != nil {
		b = appendMessage(b, 5, r.File.appendWire)
	}
	for i := range r.Files {
		b = appendMessage(b, 6, r.Files[i].appendWire)
	}
	if r.Stats != nil {
		b = appendMessage(b, 7, r.Stats.appendWire)
	}
	b = appendInt(b, 8, r.GuestUnixNano)
	b = appendBool(b, 9, r.Ordered)
	return appendBool(b, 10, r.Wire)
}

func (f *FileInfo) appendWire(b []byte) []byte {
	b = appendString(b, 1, f.Name)
	b = appendInt(b, 2, f.Size)
	b = appendInt(b, 3, int64(f.Mode))
	b = appendInt(b, 4, f.ModNano)
	return appendBool(b, 5, f.Dir)
}

func (s *Stats) appendWire(b []byte) []byte {
	b = appendInt(b, 1, s.MemTotalKB)
	b = appendInt(b, 2, s.MemAvailableKB)
	if s.Load1 != 0 {
		b = protowire.AppendFixed64(protowire.AppendTag(b, 3, protowire.Fixed64Type), math.Float64bits(s.Load1))
	}
	b = appendInt(b, 4, int64(s.Procs))
	b = appendInt(b, 5, s.DiskTotalKB)
	b = appendInt(b, 6, s.DiskFreeKB)
	return appendInt(b, 7, s.UptimeMS)
}

// wireField is one field read from a message.
type wireField struct {
	num   protowire.Number
	typ   protowire.Type
	v     uint64 // VarintType, Fixed64Type
	bytes []byte // BytesType
}

// forEachField calls fn with each field of msg in order. Fields of other
// wire types than varint, fixed64 and bytes are skipped, as unknown.
func forEachField(msg []byte, fn func(f wireField) error) error {
	for len(msg) > 0 {
		num, typ, n := protowire.ConsumeTag(msg)
		if n < 0 {
			return protowire.ParseError(n)
		}
		msg = msg[n:]
		f := wireField{num: num, typ: typ}
		switch typ {
		case protowire.VarintType:
			f.v, n = protowire.ConsumeVarint(msg)
		case protowire.Fixed64Type:
			f.v, n = protowire.ConsumeFixed64(msg)
		case protowire.BytesType:
			f.bytes, n = protowire.ConsumeBytes(msg)
		default:
			n = protowire.ConsumeFieldValue(num, typ, msg)
			if n < 0 {
				return fmt.Errorf("field %d: %w", num, protowire.ParseError(n))
			}
			msg = msg[n:]
			continue
		}
		if n < 0 {
			return fmt.Errorf("field %d: %w", num, protowire.ParseError(n))
		}
		msg = msg[n:]
		if err := fn(f); err != nil {
			return err
		}
	}
	return nil
}

func (f wireField) want(name string, typ protowire.Type) error {
	if f.typ != typ {
		return fmt.Errorf("%s (field %d): wire type %d, want %d", name, f.num, f.typ, typ)
	}
	return nil
}

func (f wireField) str(name string, dst *string) error {
	if err := f.want(name, protowire.BytesType); err != nil {
		return err
	}
	*dst = string(f.bytes)
	return nil
}

func (f wireField) appendStr(name string, dst *[]string) error {
	var s string
	if err := f.str(name, &s); err != nil {
		return err
	}
	*dst = append(*dst, s)
	return nil
}

func (f wireField) int64(name string, dst *int64) error {
	if err := f.want(name, protowire.VarintType); err != nil {
		return err
	}
	*dst = int64(f.v)
	return nil
}

// int reads a varint that must fit an int32 (pids, exit codes, signals,
// process counts), so it means the same on every platform.
func (f wireField) int(name string, dst *int) error {
	var v int64
	if err := f.int64(name, &v); err != nil {
		return err
	}
	if v < math.MinInt32 || v > math.MaxInt32 {
		return fmt.Errorf("%s: %d is out of range", name, v)
	}
	*dst = int(v)
	return nil
}

func (f wireField) uint32(name string, dst *uint32) error {
	if err := f.want(name, protowire.VarintType); err != nil {
		return err
	}
	if f.v > math.MaxUint32 {
		return fmt.Errorf("%s: %d is out of range", name, f.v)
	}
	*dst = uint32(f.v)
	return nil
}

func (f wireField) bool(name string, dst *bool) error {
	if err := f.want(name, protowire.VarintType); err != nil {
		return err
	}
	*dst = f.v != 0
	return nil
}

// decodeWire reads a Request. Errors name the field.
func (r *Request) decodeWire(msg []byte) error {
	*r = Request{}
	return forEachField(msg, func(f wireField) error {
		switch f.num {
		case 1:
			var op string
			err := f.str("op", &op)
			r.Op = Op(op)
			return err
		case 2:
			return f.appendStr("argv", &r.Argv)
		case 3:
			if err := f.want("env", protowire.BytesType); err != nil {
				return err
			}
			var k, v string
			if err := forEachField(f.bytes, func(e wireField) error {
				switch e.num {
				case 1:
					return e.str("env key", &k)
				case 2:
					return e.str("env value", &v)
				}
				return nil
			}); err != nil {
				return fmt.Errorf("env: %w", err)
			}
			if r.Env == nil {
				r.Env = make(map[string]string)
			}
			r.Env[k] = v
			return nil
		case 4:
			return f.str("dir", &r.Dir)
		case 5:
			return f.int64("timeout_ms", &r.TimeoutMS)
		case 6:
			return f.bool("stdin", &r.Stdin)
		case 7:
			return f.str("path", &r.Path)
		case 8:
			return f.uint32("mode", &r.Mode)
		case 9:
			return f.int64("limit", &r.Limit)
		case 10:
			return f.int64("unix_nano", &r.UnixNano)
		case 11:
			if err := f.want("entropy", protowire.BytesType); err != nil {
				return err
			}
			r.Entropy = append([]byte(nil), f.bytes...)
			return nil
		case 12:
			return f.str("hostname", &r.Hostname)
		case 13:
			return f.int("pids", &r.Pids)
		case 14:
			if err := f.want("net", protowire.BytesType); err != nil {
				return err
			}
			r.Net = new(NetConfig)
			if err := r.Net.decodeWire(f.bytes); err != nil {
				return fmt.Errorf("net: %w", err)
			}
			return nil
		case 15:
			return f.uint32("call", &r.Call)
		case 16:
			return f.bool("mode_set", &r.ModeSet)
		}
		return nil
	})
}

func (c *NetConfig) decodeWire(msg []byte) error {
	*c = NetConfig{}
	return forEachField(msg, func(f wireField) error {
		switch f.num {
		case 1:
			return f.str("iface", &c.Iface)
		case 2:
			return f.appendStr("addrs", &c.Addrs)
		case 3:
			return f.appendStr("gateways", &c.Gateways)
		case 4:
			return f.appendStr("dns", &c.DNS)
		}
		return nil
	})
}

// decodeWire reads a Result. Errors name the field.
func (r *Result) decodeWire(msg []byte) error {
	*r = Result{}
	return forEachField(msg, func(f wireField) error {
		switch f.num {
		case 1:
			return f.int("exit_code", &r.ExitCode)
		case 2:
			return f.int("signal", &r.Signal)
		case 3:
			return f.bool("timed_out", &r.TimedOut)
		case 4:
			return f.int64("duration_us", &r.DurationUS)
		case 5:
			if err := f.want("file", protowire.BytesType); err != nil {
				return err
			}
			r.File = new(FileInfo)
			if err := r.File.decodeWire(f.bytes); err != nil {
				return fmt.Errorf("file: %w", err)
			}
			return nil
		case 6:
			if err := f.want("files", protowire.BytesType); err != nil {
				return err
			}
			var fi FileInfo
			if err := fi.decodeWire(f.bytes); err != nil {
				return fmt.Errorf("files[%d]: %w", len(r.Files), err)
			}
			if fi.Name == "" {
				// Refused here, not after the frame: an empty entry is 2
				// bytes on the wire and a whole FileInfo on the host.
				return fmt.Errorf("files[%d]: an entry without a name", len(r.Files))
			}
			r.Files = append(r.Files, fi)
			return nil
		case 7:
			if err := f.want("stats", protowire.BytesType); err != nil {
				return err
			}
			r.Stats = new(Stats)
			if err := r.Stats.decodeWire(f.bytes); err != nil {
				return fmt.Errorf("stats: %w", err)
			}
			return nil
		case 8:
			return f.int64("guest_unix_nano", &r.GuestUnixNano)
		case 9:
			return f.bool("ordered", &r.Ordered)
		case 10:
			return f.bool("wire", &r.Wire)
		}
		return nil
	})
}

// countWireFiles counts the entries (field 6) of a Result in the wire
// codec without decoding them, so a listing can be charged for them first.
func countWireFiles(msg []byte) (int, error) {
	n := 0
	err := forEachField(msg, func(f wireField) error {
		if f.num == 6 {
			n++
		}
		return nil
	})
	return n, err
}

func (fi *FileInfo) decodeWire(msg []byte) error {
	*fi = FileInfo{}
	return forEachField(msg, func(f wireField) error {
		switch f.num {
		case 1:
			return f.str("name", &fi.Name)
		case 2:
			return f.int64("size", &fi.Size)
		case 3:
			return f.uint32("mode", &fi.Mode)
		case 4:
			return f.int64("mod_nano", &fi.ModNano)
		case 5:
			return f.bool("dir", &fi.Dir)
		}
		return nil
	})
}

func (s *Stats) decodeWire(msg []byte) error {
	*s = Stats{}
	return forEachField(msg, func(f wireField) error {
		switch f.num {
		case 1:
			return f.int64("mem_total_kb", &s.MemTotalKB)
		case 2:
			return f.int64("mem_available_kb", &s.MemAvailableKB)
		case 3:
			if err := f.want("load1", protowire.Fixed64Type); err != nil {
				return err
			}
			s.Load1 = math.Float64frombits(f.v)
			return nil
		case 4:
			return f.int("procs", &s.Procs)
		case 5:
			return f.int64("disk_total_kb", &s.DiskTotalKB)
		case 6:
			return f.int64("disk_free_kb", &s.DiskFreeKB)
		case 7:
			return f.int64("uptime_ms", &s.UptimeMS)
		}
		return nil
	})
}
