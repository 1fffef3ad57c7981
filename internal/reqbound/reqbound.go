// Package reqbound counts a request's repeated and map fields before it is
// decoded. Decoding costs about 60 times the wire size for a list of empty
// entries (an empty event is 2 bytes on the wire and over 100 in memory),
// so one AppendEvents of 1 MiB holding half a million empty events took 65
// MB to decode before validation refused it; at the 33 MiB request limit,
// a few GB. A list longer than validation allows is refused here, naming
// the field, before anything is allocated for it. The servers' handlers
// and the nodes' sandbox API use its codecs (Codecs).
package reqbound

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// ScanAbove: smaller messages are decoded without counting (a 64 KiB
// message of empty entries decodes to a few MB).
const ScanAbove = 64 << 10

// DefaultMaxEntries bounds a repeated or map field that validation sets no
// lower limit for.
const DefaultMaxEntries = 1 << 16

// Limits is the limit of each repeated or map field that validation
// bounds below DefaultMaxEntries, by the field's full name (the same
// limits as validation, so that no request it would take is refused).
type Limits map[protoreflect.FullName]int

// Sandbox are the limits of the sandbox API (SandboxService), on the
// servers and on the nodes: an exec's command may have as many arguments
// as fit guest.MaxCommandBytes (128 KiB), an empty one a byte each.
var Sandbox = Limits{
	"warren.v1.ExecRequest.command": 128 << 10,
}

// bounds is a Limits with the least of its limits.
type bounds struct {
	max   Limits
	least int
}

func newBounds(l Limits) *bounds {
	b := &bounds{max: l, least: DefaultMaxEntries}
	for _, n := range l {
		b.least = min(b.least, n)
	}
	return b
}

func (b *bounds) limit(fd protoreflect.FieldDescriptor) int {
	if n, ok := b.max[fd.FullName()]; ok {
		return n
	}
	return DefaultMaxEntries
}

// CheckEntries is the check Codecs(l) makes of a binary message of type md
// before decoding it.
func CheckEntries(l Limits, b []byte, md protoreflect.MessageDescriptor) error {
	return newBounds(l).checkEntries(b, md)
}

// CheckJSONEntries is the same for a message in JSON.
func CheckJSONEntries(l Limits, b []byte, md protoreflect.MessageDescriptor) error {
	return newBounds(l).checkJSONEntries(b, md)
}

// checkEntries walks the wire encoding b of a message of type md and
// returns an error naming the first repeated or map field with more
// entries than its limit. Malformed input is left to proto.Unmarshal,
// which refuses it with its own error; fields md does not know are not
// looked into.
func (bd *bounds) checkEntries(b []byte, md protoreflect.MessageDescriptor) error {
	if err := bd.walkEntries(b, md, 0); err != nil {
		return errors.New(err.field + ": " + err.issue)
	}
	return nil
}

// maxDepth is how deep a request's messages (binary) or values (JSON)
// may nest: far deeper than any of the API's. Counting stops there, so
// what is deeper is refused rather than decoded uncounted.
const maxDepth = 64

// entriesError is walkEntries' finding: the field's path is built on the
// way back up, so that a request within its limits costs no strings.
type entriesError struct{ field, issue string }

func (bd *bounds) walkEntries(b []byte, md protoreflect.MessageDescriptor, depth int) *entriesError {
	if depth > maxDepth { // deeper than any message of the API
		return &entriesError{string(md.Name()), fmt.Sprintf("nested deeper than %d messages", maxDepth)}
	}
	var low [16]int // counts of fields 1..15; others in counts
	var counts map[protowire.Number]int
	var once map[protowire.Number]bool // singular message fields seen
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil
		}
		b = b[n:]
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			return nil
		}
		v := b[:n]
		b = b[n:]
		fd := md.Fields().ByNumber(num)
		if fd == nil {
			continue
		}
		c := 0
		if fd.IsList() || fd.IsMap() {
			if num < protowire.Number(len(low)) {
				low[num]++
				c = low[num]
			} else {
				if counts == nil {
					counts = map[protowire.Number]int{}
				}
				counts[num]++
				c = counts[num]
			}
			if c > bd.least { // else within every limit: no look-up
				if limit := bd.limit(fd); c > limit {
					return &entriesError{string(fd.Name()), fmt.Sprintf("over the limit of %d entries", limit)}
				}
			}
		}
		if fd.Message() == nil || fd.IsMap() || typ != protowire.BytesType || !holdsLists(fd.Message()) {
			continue
		}
		if !fd.IsList() {
			// proto.Unmarshal merges the occurrences of a singular message
			// field, lists and all, so each would be counted apart from
			// the others and N of them pass with N times the limit. No
			// client of the API sends one twice.
			if once[num] {
				return &entriesError{string(fd.Name()), "given more than once"}
			}
			if once == nil {
				once = map[protowire.Number]bool{}
			}
			once[num] = true
		}
		inner, _ := protowire.ConsumeBytes(v)
		if err := bd.walkEntries(inner, fd.Message(), depth+1); err != nil {
			at := string(fd.Name())
			if fd.IsList() {
				at += fmt.Sprintf("[%d]", c-1)
			}
			err.field = at + "." + err.field
			return err
		}
	}
	return nil
}

// listHolders caches holdsLists by message type.
var listHolders sync.Map // protoreflect.FullName -> bool

// holdsLists reports whether a message of type md can hold a list or a
// map, itself or in a message it holds: a walk need not look into one
// that cannot (an event, say, of which a batch holds thousands).
func holdsLists(md protoreflect.MessageDescriptor) bool {
	if v, ok := listHolders.Load(md.FullName()); ok {
		return v.(bool)
	}
	v := lookForLists(md, map[protoreflect.FullName]bool{})
	listHolders.Store(md.FullName(), v)
	return v
}

func lookForLists(md protoreflect.MessageDescriptor, seen map[protoreflect.FullName]bool) bool {
	if seen[md.FullName()] {
		return false // a cycle: what it holds is looked at where it began
	}
	seen[md.FullName()] = true
	fs := md.Fields()
	for i := range fs.Len() {
		fd := fs.Get(i)
		if fd.IsList() || fd.IsMap() || fd.Message() != nil && lookForLists(fd.Message(), seen) {
			return true
		}
	}
	return false
}

// asProto is m as a protobuf message, as the codecs need it.
func asProto(m any) (proto.Message, error) {
	if pm, ok := m.(proto.Message); ok {
		return pm, nil
	}
	return nil, fmt.Errorf("%T is not a protobuf message", m)
}

// boundedCodec is connect's binary protobuf codec with checkEntries before
// each decode of a large message.
type boundedCodec struct{ bd *bounds }

var _ connect.Codec = boundedCodec{}

func (boundedCodec) Name() string { return "proto" }

func (boundedCodec) Marshal(m any) ([]byte, error) {
	pm, err := asProto(m)
	if err != nil {
		return nil, err
	}
	return proto.Marshal(pm)
}

func (boundedCodec) MarshalAppend(dst []byte, m any) ([]byte, error) {
	pm, err := asProto(m)
	if err != nil {
		return nil, err
	}
	return proto.MarshalOptions{}.MarshalAppend(dst, pm)
}

func (boundedCodec) MarshalStable(m any) ([]byte, error) {
	pm, err := asProto(m)
	if err != nil {
		return nil, err
	}
	return proto.MarshalOptions{Deterministic: true}.Marshal(pm)
}

func (boundedCodec) IsBinary() bool { return true }

func (c boundedCodec) Unmarshal(b []byte, m any) error {
	pm, err := asProto(m)
	if err != nil {
		return err
	}
	if len(b) > ScanAbove {
		if err := c.bd.checkEntries(b, pm.ProtoReflect().Descriptor()); err != nil {
			return err
		}
	}
	return proto.Unmarshal(b, pm)
}

// checkJSONEntries is checkEntries for the JSON form of a message of type
// md: arrays and the members of map fields are counted, field by field.
// Malformed JSON is left to protojson.
func (bd *bounds) checkJSONEntries(b []byte, md protoreflect.MessageDescriptor) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	err := bd.walkJSON(dec, md, "", 0)
	if errors.Is(err, errJSONMalformed) {
		return nil
	}
	return err
}

var errJSONMalformed = errors.New("malformed JSON")

// walkJSON reads one value from dec. md is the message type it holds, or
// nil when it is not a message (or not one known here).
func (bd *bounds) walkJSON(dec *json.Decoder, md protoreflect.MessageDescriptor, path string, depth int) error {
	tok, err := dec.Token()
	if err != nil {
		return errJSONMalformed
	}
	d, ok := tok.(json.Delim)
	if !ok {
		return nil // a scalar
	}
	if depth > maxDepth {
		// Not a message of the API; but protojson skips unknown values
		// nested far deeper, and what follows them would go uncounted.
		at := strings.TrimSuffix(path, ".")
		if at == "" {
			at = "request"
		}
		return fmt.Errorf("%s: nested deeper than %d levels", at, maxDepth)
	}
	switch d {
	case '[':
		return bd.walkJSONArray(dec, nil, path, depth, DefaultMaxEntries)
	case '{':
		for dec.More() {
			kt, err := dec.Token()
			if err != nil {
				return errJSONMalformed
			}
			key, _ := kt.(string)
			var fd protoreflect.FieldDescriptor
			if md != nil {
				if fd = md.Fields().ByJSONName(key); fd == nil {
					fd = md.Fields().ByTextName(key)
				}
			}
			if err := bd.walkJSONField(dec, fd, path, depth); err != nil {
				return err
			}
		}
		if _, err := dec.Token(); err != nil { // '}'
			return errJSONMalformed
		}
	}
	return nil
}

// walkJSONField reads the value of field fd (nil: not known here).
func (bd *bounds) walkJSONField(dec *json.Decoder, fd protoreflect.FieldDescriptor, path string, depth int) error {
	if fd == nil {
		return bd.walkJSON(dec, nil, path, depth+1)
	}
	limit := bd.limit(fd)
	name := path + string(fd.Name())
	switch {
	case fd.IsMap():
		tok, err := dec.Token()
		if err != nil {
			return errJSONMalformed
		}
		if d, ok := tok.(json.Delim); !ok || d != '{' {
			return nil // null, or protojson refuses it
		}
		for n := 0; dec.More(); n++ {
			if n == limit {
				return fmt.Errorf("%s: over the limit of %d entries", name, limit)
			}
			if _, err := dec.Token(); err != nil { // the key
				return errJSONMalformed
			}
			if err := bd.walkJSON(dec, nil, name+".", depth+1); err != nil {
				return err
			}
		}
		if _, err := dec.Token(); err != nil {
			return errJSONMalformed
		}
		return nil
	case fd.IsList():
		tok, err := dec.Token()
		if err != nil {
			return errJSONMalformed
		}
		if d, ok := tok.(json.Delim); !ok || d != '[' {
			return nil
		}
		return bd.walkJSONArray(dec, fd.Message(), name, depth, limit)
	default:
		return bd.walkJSON(dec, fd.Message(), name+".", depth+1)
	}
}

// walkJSONArray reads the elements of an array whose '[' was read, each a
// message of type md (or nil), at most limit of them.
func (bd *bounds) walkJSONArray(dec *json.Decoder, md protoreflect.MessageDescriptor, name string, depth, limit int) error {
	for n := 0; dec.More(); n++ {
		if n == limit {
			return fmt.Errorf("%s: over the limit of %d entries", name, limit)
		}
		if err := bd.walkJSON(dec, md, fmt.Sprintf("%s[%d].", name, n), depth+1); err != nil {
			return err
		}
	}
	if _, err := dec.Token(); err != nil { // ']'
		return errJSONMalformed
	}
	return nil
}

// boundedJSONCodec is connect's JSON codec with checkJSONEntries before
// each decode of a large message.
type boundedJSONCodec struct {
	name string
	bd   *bounds
}

var _ connect.Codec = boundedJSONCodec{}

func (c boundedJSONCodec) Name() string { return c.name }

func (boundedJSONCodec) Marshal(m any) ([]byte, error) {
	pm, err := asProto(m)
	if err != nil {
		return nil, err
	}
	return protojson.MarshalOptions{}.Marshal(pm)
}

func (boundedJSONCodec) MarshalAppend(dst []byte, m any) ([]byte, error) {
	pm, err := asProto(m)
	if err != nil {
		return nil, err
	}
	return protojson.MarshalOptions{}.MarshalAppend(dst, pm)
}

func (c boundedJSONCodec) MarshalStable(m any) ([]byte, error) {
	b, err := c.Marshal(m)
	if err != nil {
		return nil, err
	}
	var out bytes.Buffer
	if err := json.Compact(&out, b); err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}

func (boundedJSONCodec) IsBinary() bool { return false }

func (c boundedJSONCodec) Unmarshal(b []byte, m any) error {
	pm, err := asProto(m)
	if err != nil {
		return err
	}
	if len(b) == 0 {
		return errors.New("zero-length payload is not a valid JSON object")
	}
	if len(b) > ScanAbove {
		if err := c.bd.checkJSONEntries(b, pm.ProtoReflect().Descriptor()); err != nil {
			return err
		}
	}
	return protojson.UnmarshalOptions{DiscardUnknown: true}.Unmarshal(b, pm)
}

// Codecs are the codecs of a handler whose requests are counted against l
// before they are decoded (they replace connect's own "proto", "json" and
// "json; charset=utf-8").
func Codecs(l Limits) connect.Option {
	bd := newBounds(l)
	return connect.WithOptions(connect.WithCodec(boundedCodec{bd}),
		connect.WithCodec(boundedJSONCodec{"json", bd}), connect.WithCodec(boundedJSONCodec{"json; charset=utf-8", bd}))
}
