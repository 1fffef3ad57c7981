package api

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"

	"pgregory.net/rapid"

	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
)

// fataler is what join and sameJSON need of a *testing.T or *rapid.T.
type fataler interface {
	Helper()
	Fatal(...any)
	Fatalf(string, ...any)
}

// join runs events through a PartJoiner and returns the events it gives
// back, failing the test on an error.
func join(t fataler, evs []*warrenv1.EventInput) []*warrenv1.EventInput {
	t.Helper()
	var j PartJoiner
	var out []*warrenv1.EventInput
	for _, e := range evs {
		p, ok, err := j.Add(e.GetKind(), e.GetPayload())
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			out = append(out, &warrenv1.EventInput{Kind: e.GetKind(), Payload: p})
		}
	}
	if j.Pending() != 0 {
		t.Fatalf("%d parts held at the end", j.Pending())
	}
	return out
}

func sameJSON(t fataler, got, want []byte) {
	t.Helper()
	var g, w any
	if err := json.Unmarshal(got, &g); err != nil {
		t.Fatalf("%v: %.200s", err, got)
	}
	if err := json.Unmarshal(want, &w); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(g, w) {
		t.Fatalf("joined payload differs:\n got %.300s\nwant %.300s", got, want)
	}
}

// A model turn of 300 KB splits into parts of at most 64 KiB each and the
// event, which keeps the small fields the servers read (usage, the step);
// joined, it is the payload it was.
func TestSplitPayloadRoundTrip(t *testing.T) {
	code := strings.Repeat("if a < b && c > d { s := \"x\\n\" }\n", 300<<10/36)
	turn := map[string]any{
		"step": 7, "usage": map[string]int{"input_tokens": 10, "output_tokens": 20000}, "cost_micro_usd": 42,
		"response": map[string]any{"id": "msg_1", "stop_reason": "tool_use", "content": []any{
			map[string]any{"type": "tool_use", "id": "toolu_1", "name": "write_file", "input": map[string]string{"path": "a.go", "content": code}}}},
	}
	payload, err := MarshalPlain(turn)
	if err != nil {
		t.Fatal(err)
	}
	evs, err := SplitPayload("model_call", payload)
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) < 6 {
		t.Fatalf("%d events for %d bytes", len(evs), len(payload))
	}
	for i, e := range evs {
		if n := len(e.GetPayload()); n > MaxEventPayloadBytes {
			t.Errorf("event %d (%s): %d bytes", i, e.GetKind(), n)
		}
		if want := KindPayloadPart; i < len(evs)-1 && e.GetKind() != want {
			t.Errorf("event %d is a %s, want %s", i, e.GetKind(), want)
		}
	}
	last := evs[len(evs)-1]
	var rest struct {
		Step  int            `json:"step"`
		Usage map[string]int `json:"usage"`
		Parts Parts          `json:"payload_parts"`
		Resp  any            `json:"response"`
	}
	if err := json.Unmarshal(last.GetPayload(), &rest); err != nil {
		t.Fatal(err)
	}
	if last.GetKind() != "model_call" || rest.Step != 7 || rest.Usage["output_tokens"] != 20000 || rest.Resp != nil ||
		!reflect.DeepEqual(rest.Parts.Fields, []string{"response"}) || rest.Parts.Parts != len(evs)-1 {
		t.Fatalf("the event after its parts: %s", last.GetPayload())
	}
	got := join(t, evs)
	if len(got) != 1 || got[0].GetKind() != "model_call" {
		t.Fatalf("joined into %d events", len(got))
	}
	sameJSON(t, got[0].GetPayload(), payload)
}

// A payload that fits is one event, unchanged, and passes the joiner
// unchanged, even when a value mentions payload_parts.
func TestSplitPayloadThatFitsIsUnchanged(t *testing.T) {
	payload := []byte(`{"text":"\"payload_parts\" is a key","n":1}`)
	evs, err := SplitPayload("message", payload)
	if err != nil || len(evs) != 1 || string(evs[0].GetPayload()) != string(payload) {
		t.Fatalf("%v %v", evs, err)
	}
	if got := join(t, evs); string(got[0].GetPayload()) != string(payload) {
		t.Fatalf("joined: %s", got[0].GetPayload())
	}
}

func TestSplitPayloadRefuses(t *testing.T) {
	big := strings.Repeat("x", MaxEventPayloadBytes)
	for _, c := range []struct {
		name, payload, want string
	}{
		{"not an object", `"` + big + `"`, "not a JSON object"},
		{"the key taken", `{"payload_parts":1,"x":"` + big + `"}`, `already has "payload_parts"`},
		{"over 60 parts", `{"x":"` + strings.Repeat("y", 61*partRawBytes) + `"}`, "over the limit"},
	} {
		if _, err := SplitPayload("tool_call", []byte(c.payload)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.name, err, c.want)
		}
	}
}

// Parts that do not make up the event after them are an error, never a
// wrong payload: one missing, one changed, out of order, or followed by an
// event that was not split.
func TestPartJoinerRefusesBrokenParts(t *testing.T) {
	payload, _ := MarshalPlain(map[string]string{"a": strings.Repeat("a", 100<<10), "b": strings.Repeat("b", 100<<10)})
	evs, err := SplitPayload("tool_call", payload)
	if err != nil || len(evs) < 4 {
		t.Fatalf("%d events, %v", len(evs), err)
	}
	changed := func(i int, f func(p *part)) []*warrenv1.EventInput {
		out := append([]*warrenv1.EventInput(nil), evs...)
		var p part
		if err := json.Unmarshal(out[i].GetPayload(), &p); err != nil {
			t.Fatal(err)
		}
		f(&p)
		b, _ := json.Marshal(p)
		out[i] = &warrenv1.EventInput{Kind: KindPayloadPart, Payload: b}
		return out
	}
	for name, bad := range map[string][]*warrenv1.EventInput{
		"a part missing":        evs[1:],
		"the last missing":      append(append([]*warrenv1.EventInput(nil), evs[:len(evs)-2]...), evs[len(evs)-1]),
		"a byte changed":        changed(1, func(p *part) { p.Data[10] ^= 1 }),
		"parts swapped":         append([]*warrenv1.EventInput{evs[1], evs[0]}, evs[2:]...),
		"another kind":          changed(0, func(p *part) { p.Of = "model_call" }),
		"not a part":            append([]*warrenv1.EventInput{{Kind: KindPayloadPart, Payload: []byte(`[1]`)}}, evs...),
		"no split after":        append(append([]*warrenv1.EventInput(nil), evs[:len(evs)-1]...), &warrenv1.EventInput{Kind: "tool_call", Payload: []byte(`{}`)}),
		"a part past its count": changed(1, func(p *part) { p.Part = p.Parts + 1 }),
		"too many parts":        changed(0, func(p *part) { p.Parts = maxParts + 1 }),
		"a bad description":     append(append([]*warrenv1.EventInput(nil), evs[:len(evs)-1]...), &warrenv1.EventInput{Kind: "tool_call", Payload: []byte(`{"payload_parts":"x"}`)}),
	} {
		var j PartJoiner
		var failed error
		for _, e := range bad {
			if _, _, err := j.Add(e.GetKind(), e.GetPayload()); err != nil {
				failed = err
				break
			}
		}
		if !errors.Is(failed, ErrParts) {
			t.Errorf("%s: %v, want an ErrParts error", name, failed)
		}
	}
}

// Any object splits into events that fit and joins back into itself.
func TestSplitPayloadProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		fields := rapid.MapOfN(rapid.StringMatching(`[a-z_]{1,12}`), rapid.OneOf(
			rapid.StringN(0, 2000, -1).AsAny(),
			rapid.Custom(func(t *rapid.T) any {
				return strings.Repeat(rapid.StringN(1, 8, -1).Draw(t, "unit"), rapid.IntRange(1, 40000).Draw(t, "times"))
			}),
			rapid.Int().AsAny(),
		), 0, 12).Draw(t, "fields")
		delete(fields, PartsKey)
		payload, err := MarshalPlain(fields)
		if err != nil {
			t.Fatal(err)
		}
		evs, err := SplitPayload("tool_call", payload)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range evs {
			if len(e.GetPayload()) > MaxEventPayloadBytes {
				t.Fatalf("a %s of %d bytes", e.GetKind(), len(e.GetPayload()))
			}
		}
		got := join(t, evs)
		if len(got) != 1 {
			t.Fatalf("%d events", len(got))
		}
		sameJSON(t, got[0].GetPayload(), payload)
	})
}

// The joiner reads what is in a task's log, which any writer may append:
// no input panics it, and what it gives back is the payload it was given
// unless parts came first.
func FuzzPartJoiner(f *testing.F) {
	// Small seeds (the fuzzer is slow on 64 KiB ones): a one-part event,
	// made as SplitPayload makes them.
	moved := []byte(`{"input":{"content":"a<&>"}}`)
	sum := sha256.Sum256(moved)
	partOf, _ := json.Marshal(part{Of: "tool_call", Part: 1, Parts: 1, Data: moved})
	event, _ := json.Marshal(map[string]any{"tool_call_id": "t", PartsKey: Parts{Fields: []string{"input"}, Parts: 1, Bytes: len(moved), SHA256: hex.EncodeToString(sum[:])}})
	var j PartJoiner
	j.Add(KindPayloadPart, partOf)
	if out, _, err := j.Add("tool_call", event); err != nil || !strings.Contains(string(out), `"input":{"content":"a<&>"}`) {
		f.Fatalf("the seed does not join: %s, %v", out, err)
	}
	f.Add(KindPayloadPart, partOf, event)
	f.Add("tool_call", []byte(`{"tool_call_id":"t"}`), event)
	f.Add("model_call", []byte(`{"payload_parts":{}}`), []byte(`{}`))
	f.Fuzz(func(t *testing.T, kind string, first, second []byte) {
		var j PartJoiner
		p, ok, err := j.Add(kind, first)
		if kind != KindPayloadPart && (!ok || (err == nil && !strings.Contains(string(first), PartsKey) && string(p) != string(first))) {
			t.Fatalf("a %s event came back as %q, %v, %v", kind, p, ok, err)
		}
		out, ok, err := j.Add("tool_call", second)
		if !ok {
			t.Fatal("a tool_call was held")
		}
		if err == nil && out != nil && !json.Valid(out) && json.Valid(second) {
			t.Fatalf("joined into JSON that is not valid: %q", out)
		}
	})
}

// Parts that name another field than their description, or one the event
// kept, are refused, even with a matching size and hash (the writer
// declares both): an approval_requested event that kept tool_call_id "a"
// could have its parts make it "b" for every reader that joined them.
func TestPartJoinerRefusesPartsThatReplaceAKeptField(t *testing.T) {
	big := strings.Repeat("i", 100<<10)
	payload, _ := MarshalPlain(map[string]string{"tool_call_id": "a", "input": big})
	evs, err := SplitPayload("approval_requested", payload)
	if err != nil || len(evs) < 2 {
		t.Fatalf("%d events, %v", len(evs), err)
	}
	forge := func(moved map[string]string, fields []string) []*warrenv1.EventInput {
		blob, _ := MarshalPlain(moved)
		sum := sha256.Sum256(blob)
		var rest map[string]json.RawMessage
		if err := json.Unmarshal(evs[len(evs)-1].GetPayload(), &rest); err != nil {
			t.Fatal(err)
		}
		desc, _ := json.Marshal(Parts{Fields: fields, Parts: 1, Bytes: len(blob), SHA256: hex.EncodeToString(sum[:])})
		rest[PartsKey] = desc
		last, _ := MarshalPlain(rest)
		p, _ := json.Marshal(part{Of: "approval_requested", Part: 1, Parts: 1, Data: blob})
		return []*warrenv1.EventInput{{Kind: KindPayloadPart, Payload: p}, {Kind: "approval_requested", Payload: last}}
	}
	for name, bad := range map[string][]*warrenv1.EventInput{
		"a kept field":     forge(map[string]string{"input": "x", "tool_call_id": "b"}, []string{"input", "tool_call_id"}),
		"an unnamed field": forge(map[string]string{"input": "x", "other": "y"}, []string{"input"}),
	} {
		var j PartJoiner
		var failed error
		for _, e := range bad {
			if _, _, err := j.Add(e.GetKind(), e.GetPayload()); err != nil {
				failed = err
			}
		}
		if !errors.Is(failed, ErrParts) {
			t.Errorf("%s: %v, want an ErrParts error", name, failed)
		}
	}
}
