package api

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
)

// MaxEventPayloadBytes is the largest payload one event holds.
const MaxEventPayloadBytes = 64 << 10

// KindPayloadPart is the kind of the events that carry, in order, what an
// event too large for the log left out of its own payload. They come just
// before that event, in the same append.
const KindPayloadPart = "payload_part"

// PartsKey is the key, in an event split by SplitPayload, that says which
// of its fields its parts hold.
const PartsKey = "payload_parts"

// partRawBytes is how much of the moved fields one part carries: base64
// makes it 60 KiB, and the part's other fields fit in the rest.
const partRawBytes = 45 << 10

// maxParts bounds the parts of one event so that all of them and the
// event fit in one page of ListEvents (4 MiB; a part is about 61 KB): a
// node reading its task's new events a page at a time keeps its mark off
// a page that would hold only parts. 60 parts carry 2.6 MiB.
const maxParts = 60

// Parts describes, in a split event, the fields its payload_part events
// hold: a JSON object of them, Bytes long, with the SHA-256 given, cut
// into Parts pieces.
type Parts struct {
	Fields []string `json:"fields"`
	Parts  int      `json:"parts"`
	Bytes  int      `json:"bytes"`
	SHA256 string   `json:"sha256"`
}

// part is a payload_part event's payload.
type part struct {
	Of    string `json:"of"`    // the kind of the event it belongs to
	Part  int    `json:"part"`  // 1..Parts
	Parts int    `json:"parts"` // how many the event has
	Data  []byte `json:"data_base64"`
}

// SplitPayload returns the events that record one event of kind with
// payload, a JSON object: the event alone when its payload fits in
// MaxEventPayloadBytes; otherwise payload_part events, then the event with
// its largest top-level fields moved into them and a payload_parts field
// naming those. They go in one append, in order, so that the log holds
// them all or none. JoinParts puts the fields back. Every field the log's
// servers read (a tool call's id, a model call's usage) is small, and
// stays in the event.
func SplitPayload(kind string, payload []byte) ([]*warrenv1.EventInput, error) {
	if len(payload) <= MaxEventPayloadBytes {
		return []*warrenv1.EventInput{{Kind: kind, Payload: payload}}, nil
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(payload, &fields); err != nil {
		return nil, fmt.Errorf("split a %s event: its payload is not a JSON object: %w", kind, err)
	}
	if _, ok := fields[PartsKey]; ok {
		return nil, fmt.Errorf("split a %s event: its payload already has %q", kind, PartsKey)
	}
	keys := make([]string, 0, len(fields))
	for k := range fields {
		keys = append(keys, k)
	}
	// Largest first (then by name, so the same payload splits the same
	// way): as few fields move as will make the rest fit.
	slices.SortFunc(keys, func(a, b string) int {
		return cmp.Or(cmp.Compare(len(fields[b]), len(fields[a])), cmp.Compare(a, b))
	})
	moved := map[string]json.RawMessage{}
	for _, k := range keys {
		moved[k] = fields[k]
		delete(fields, k)
		blob, err := MarshalPlain(moved)
		if err != nil {
			return nil, err
		}
		sum := sha256.Sum256(blob)
		n := (len(blob) + partRawBytes - 1) / partRawBytes
		if n > maxParts {
			return nil, fmt.Errorf("a %s event of %d bytes is over the limit of %d bytes (%d parts of %d)", kind, len(payload), maxParts*partRawBytes, maxParts, partRawBytes)
		}
		names := make([]string, 0, len(moved))
		for m := range moved {
			names = append(names, m)
		}
		slices.Sort(names)
		desc, err := json.Marshal(Parts{Fields: names, Parts: n, Bytes: len(blob), SHA256: hex.EncodeToString(sum[:])})
		if err != nil {
			return nil, err
		}
		fields[PartsKey] = desc
		rest, err := MarshalPlain(fields)
		if err != nil {
			return nil, err
		}
		delete(fields, PartsKey)
		if len(rest) > MaxEventPayloadBytes {
			continue
		}
		out := make([]*warrenv1.EventInput, 0, n+1)
		for i := range n {
			chunk := blob[i*partRawBytes : min(len(blob), (i+1)*partRawBytes)]
			p, err := json.Marshal(part{Of: kind, Part: i + 1, Parts: n, Data: chunk})
			if err != nil {
				return nil, err
			}
			out = append(out, &warrenv1.EventInput{Kind: KindPayloadPart, Payload: p})
		}
		return append(out, &warrenv1.EventInput{Kind: kind, Payload: rest}), nil
	}
	// Unreachable: with every field moved, the rest is the description.
	return nil, fmt.Errorf("split a %s event: it does not fit", kind)
}

// ErrParts is returned for payload_part events that do not make up the
// event that follows them.
var ErrParts = errors.New("payload parts")

// PartJoiner puts split events back together, reading a task's events in
// log order: it holds payload_part events until the event they belong to.
type PartJoiner struct {
	held []part
	kind string
}

// Add takes the next event. A payload_part is held (ok false); any other
// event comes back (ok true) with the fields its parts held put back into
// its payload. Parts that do not make up the event after them are an
// ErrParts error, and are dropped.
func (j *PartJoiner) Add(kind string, payload []byte) (joined []byte, ok bool, err error) {
	if kind == KindPayloadPart {
		var p part
		if err := json.Unmarshal(payload, &p); err != nil {
			j.held = nil
			return nil, false, fmt.Errorf("%w: a payload_part that is not one: %v", ErrParts, err)
		}
		if p.Parts < 1 || p.Parts > maxParts || p.Part > p.Parts {
			j.held = nil
			return nil, false, fmt.Errorf("%w: part %d of %d of a %s event: an event has 1 to %d parts", ErrParts, p.Part, p.Parts, p.Of, maxParts)
		}
		if p.Part != len(j.held)+1 || (len(j.held) > 0 && (p.Parts != j.held[0].Parts || p.Of != j.held[0].Of)) {
			j.held = nil
			return nil, false, fmt.Errorf("%w: part %d of %d of a %s event is out of order", ErrParts, p.Part, p.Parts, p.Of)
		}
		j.held = append(j.held, p)
		return nil, false, nil
	}
	held := j.held
	j.held = nil
	if !bytes.Contains(payload, []byte(`"`+PartsKey+`"`)) {
		if len(held) > 0 {
			return payload, true, fmt.Errorf("%w: %d parts of a %s event came before a %s event that has none", ErrParts, len(held), held[0].Of, kind)
		}
		return payload, true, nil
	}
	var fields map[string]json.RawMessage
	if json.Unmarshal(payload, &fields) != nil || fields[PartsKey] == nil {
		return payload, true, nil // not split: the key is only in a value
	}
	var desc Parts
	if err := json.Unmarshal(fields[PartsKey], &desc); err != nil {
		return payload, true, fmt.Errorf("%w: a %s event's %s: %v", ErrParts, kind, PartsKey, err)
	}
	if len(held) != desc.Parts || (len(held) > 0 && held[0].Of != kind) {
		return payload, true, fmt.Errorf("%w: a %s event of %d parts came after %d", ErrParts, kind, desc.Parts, len(held))
	}
	var blob []byte
	for _, p := range held {
		blob = append(blob, p.Data...)
	}
	sum := sha256.Sum256(blob)
	if len(blob) != desc.Bytes || hex.EncodeToString(sum[:]) != desc.SHA256 {
		return payload, true, fmt.Errorf("%w: a %s event's parts hold %d bytes that do not match its %s", ErrParts, kind, len(blob), PartsKey)
	}
	var moved map[string]json.RawMessage
	if err := json.Unmarshal(blob, &moved); err != nil {
		return payload, true, fmt.Errorf("%w: a %s event's parts: %v", ErrParts, kind, err)
	}
	delete(fields, PartsKey)
	// The parts put back what the description names, and nothing the
	// event kept: a writer could otherwise have its parts replace a
	// field the cluster read from the event (an approval's tool call id).
	names := make([]string, 0, len(moved))
	for k := range moved {
		if _, kept := fields[k]; kept {
			return payload, true, fmt.Errorf("%w: a %s event's parts hold %q, a field the event kept", ErrParts, kind, k)
		}
		names = append(names, k)
	}
	slices.Sort(names)
	if !slices.Equal(names, desc.Fields) {
		return payload, true, fmt.Errorf("%w: a %s event's parts hold fields %q, not the %q its %s names", ErrParts, kind, names, desc.Fields, PartsKey)
	}
	for k, v := range moved {
		fields[k] = v
	}
	out, err := MarshalPlain(fields)
	if err != nil {
		return payload, true, err
	}
	return out, true, nil
}

// Pending reports whether parts are held for an event not yet added.
func (j *PartJoiner) Pending() int { return len(j.held) }

// MarshalPlain is json.Marshal without HTML escaping: code is full of <,
// > and &, which it would write as six bytes each, and an event holds at
// most 64 KiB. The node's agent events and SplitPayload's rest both use it.
func MarshalPlain(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}
