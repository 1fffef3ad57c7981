package guest

import (
	"context"
	"encoding/json"
	"math"
	"reflect"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"pgregory.net/rapid"
)

func genStrings(t *rapid.T, label string) []string {
	return rapid.SliceOfN(rapid.String(), 0, 4).Draw(t, label)
}

func genRequest(t *rapid.T) Request {
	r := Request{
		Op:        Op(rapid.SampledFrom([]string{"", "ping", "exec", "read", "claim", "cancel", "x"}).Draw(t, "op")),
		Argv:      genStrings(t, "argv"),
		Env:       rapid.MapOfN(rapid.String(), rapid.String(), 0, 4).Draw(t, "env"),
		Dir:       rapid.String().Draw(t, "dir"),
		TimeoutMS: rapid.Int64().Draw(t, "timeout"),
		Stdin:     rapid.Bool().Draw(t, "stdin"),
		Path:      rapid.String().Draw(t, "path"),
		Mode:      rapid.Uint32().Draw(t, "mode"),
		ModeSet:   rapid.Bool().Draw(t, "modeset"),
		Limit:     rapid.Int64().Draw(t, "limit"),
		UnixNano:  rapid.Int64().Draw(t, "unix"),
		Entropy:   rapid.SliceOfN(rapid.Byte(), 0, 40).Draw(t, "entropy"),
		Hostname:  rapid.String().Draw(t, "hostname"),
		Pids:      rapid.IntRange(math.MinInt32, math.MaxInt32).Draw(t, "pids"),
		Call:      rapid.Uint32().Draw(t, "call"),
	}
	if rapid.Bool().Draw(t, "net") {
		r.Net = &NetConfig{Iface: rapid.String().Draw(t, "iface"), Addrs: genStrings(t, "addrs"),
			Gateways: genStrings(t, "gateways"), DNS: genStrings(t, "dns")}
	}
	return r
}

func genFileInfo(t *rapid.T) FileInfo {
	return FileInfo{Name: rapid.String().Draw(t, "name"), Size: rapid.Int64().Draw(t, "size"),
		Mode: rapid.Uint32().Draw(t, "fmode"), ModNano: rapid.Int64().Draw(t, "mod"), Dir: rapid.Bool().Draw(t, "dir")}
}

func genResult(t *rapid.T) Result {
	i32 := rapid.IntRange(math.MinInt32, math.MaxInt32)
	r := Result{
		ExitCode:      i32.Draw(t, "exit"),
		Signal:        i32.Draw(t, "signal"),
		TimedOut:      rapid.Bool().Draw(t, "timedout"),
		DurationUS:    rapid.Int64().Draw(t, "duration"),
		GuestUnixNano: rapid.Int64().Draw(t, "guest"),
		Ordered:       rapid.Bool().Draw(t, "ordered"),
		Wire:          rapid.Bool().Draw(t, "wire"),
	}
	if rapid.Bool().Draw(t, "hasfile") {
		fi := genFileInfo(t)
		r.File = &fi
	}
	for range rapid.IntRange(0, 3).Draw(t, "nfiles") {
		fi := genFileInfo(t)
		if fi.Name == "" {
			fi.Name = "a" // a listing's entries have names (the decoder refuses one without)
		}
		r.Files = append(r.Files, fi)
	}
	if rapid.Bool().Draw(t, "hasstats") {
		r.Stats = &Stats{MemTotalKB: rapid.Int64().Draw(t, "mt"), MemAvailableKB: rapid.Int64().Draw(t, "ma"),
			Load1: rapid.Float64().Draw(t, "load"), Procs: i32.Draw(t, "procs"), DiskTotalKB: rapid.Int64().Draw(t, "dt"),
			DiskFreeKB: rapid.Int64().Draw(t, "df"), UptimeMS: rapid.Int64().Draw(t, "up")}
	}
	return r
}

// viaJSON is what the JSON codec makes of v: the reference the wire codec
// must agree with.
func viaJSON[T any](t *rapid.T, v *T) T {
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var out T
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

// The wire codec carries every Request and Result the JSON codec does, to
// the same values.
func TestWireAgreesWithJSON(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		req := genRequest(t)
		var got Request
		if err := got.decodeWire(req.appendWire(nil)); err != nil {
			t.Fatalf("decode: %v", err)
		}
		if want := viaJSON(t, &req); !reflect.DeepEqual(got, want) {
			t.Fatalf("request: wire gave %+v, JSON %+v", got, want)
		}
		res := genResult(t)
		var gotRes Result
		if err := gotRes.decodeWire(res.appendWire(nil)); err != nil {
			t.Fatalf("decode: %v", err)
		}
		if want := viaJSON(t, &res); !reflect.DeepEqual(gotRes, want) {
			t.Fatalf("result: wire gave %+v, JSON %+v", gotRes, want)
		}
	})
}

func TestWireErrorsNameTheField(t *testing.T) {
	tag := protowire.AppendTag
	for _, tc := range []struct {
		name string
		msg  []byte
		want string
	}{
		{"op as a number", protowire.AppendVarint(tag(nil, 1, protowire.VarintType), 7), "op (field 1): wire type 0, want 2"},
		{"pids out of range", protowire.AppendVarint(tag(nil, 13, protowire.VarintType), 1<<40), "pids: 1099511627776 is out of range"},
		{"mode out of range", protowire.AppendVarint(tag(nil, 8, protowire.VarintType), 1<<33), "mode: 8589934592 is out of range"},
		{"call out of range", protowire.AppendVarint(tag(nil, 15, protowire.VarintType), 1<<32), "call: 4294967296 is out of range"},
		{"mode_set as bytes", protowire.AppendString(tag(nil, 16, protowire.BytesType), "y"), "mode_set (field 16)"},
		{"truncated string", append(tag(nil, 7, protowire.BytesType), 5, 'a'), "field 7"},
		{"bad net", protowire.AppendBytes(tag(nil, 14, protowire.BytesType), protowire.AppendVarint(tag(nil, 1, protowire.VarintType), 1)), "net: iface"},
		{"bad env", protowire.AppendBytes(tag(nil, 3, protowire.BytesType), protowire.AppendVarint(tag(nil, 2, protowire.VarintType), 1)), "env: env value"},
		{"bad tag", []byte{0x80}, "unexpected EOF"},
	} {
		var r Request
		err := r.decodeWire(tc.msg)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err %v, want it to mention %q", tc.name, err, tc.want)
		}
	}
	// Fields it does not know are skipped, of any wire type.
	msg := protowire.AppendVarint(tag(nil, 99, protowire.VarintType), 1)
	msg = protowire.AppendFixed32(tag(msg, 98, protowire.Fixed32Type), 1)
	msg = protowire.AppendString(tag(msg, 1, protowire.BytesType), "ping")
	var r Request
	if err := r.decodeWire(msg); err != nil || r.Op != OpPing {
		t.Fatalf("unknown fields: %+v, %v", r, err)
	}
}

// FuzzWire decodes arbitrary bytes as a Request and as a Result: no panic,
// and what decodes encodes back to the same value.
func FuzzWire(f *testing.F) {
	f.Add((&Request{Op: OpExec, Argv: []string{"sh", "-c", "true"}, Env: map[string]string{"A": "b"}, Net: &NetConfig{Iface: "eth0", Addrs: []string{"10.0.0.2/30"}}}).appendWire(nil))
	f.Add((&Request{Op: OpWrite, Path: "/work/f", ModeSet: true}).appendWire(nil))
	f.Add((&Result{ExitCode: -1, Files: []FileInfo{{Name: "a", Dir: true}}, Stats: &Stats{Load1: 0.5}}).appendWire(nil))
	f.Add([]byte{0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Fuzz(func(t *testing.T, in []byte) {
		var r Request
		if r.decodeWire(in) == nil {
			var again Request
			if err := again.decodeWire(r.appendWire(nil)); err != nil || !reflect.DeepEqual(normReq(r), normReq(again)) {
				t.Fatalf("request %+v encoded and decoded again: %+v, %v", r, again, err)
			}
		}
		var res Result
		if res.decodeWire(in) == nil {
			var again Result
			if err := again.decodeWire(res.appendWire(nil)); err != nil || !reflect.DeepEqual(normRes(res), normRes(again)) {
				t.Fatalf("result %+v encoded and decoded again: %+v, %v", res, again, err)
			}
		}
	})
}

// normReq and normRes forget the difference between empty and nil, which
// neither codec keeps, and NaN's inequality to itself.
func normReq(r Request) Request {
	if len(r.Entropy) == 0 {
		r.Entropy = nil
	}
	return r
}

func normRes(r Result) Result {
	if r.Stats != nil && math.IsNaN(r.Stats.Load1) {
		s := *r.Stats
		s.Load1 = -1
		r.Stats = &s
	}
	return r
}

// A Client speaks JSON until the agent says it reads the wire codec, then
// the wire codec; the agent answers each call in its request's codec.
func TestClientLearnsTheWireCodec(t *testing.T) {
	c := pairJSON(t, &fakeSys{})
	ctx := context.Background()
	run := func() {
		t.Helper()
		out, res, err := c.Output(ctx, "sh", "-c", "echo $((6*7)); exit 4")
		if err != nil || res.ExitCode != 4 || string(out) != "42\n" {
			t.Fatalf("exec (wire %v): %q %+v %v", c.Wire(), out, res, err)
		}
		if st, err := c.Stats(ctx); err != nil || st.Procs != 7 {
			t.Fatalf("stats (wire %v): %+v %v", c.Wire(), st, err)
		}
		if ls, err := c.List(ctx, t.TempDir()); err != nil || len(ls) != 0 {
			t.Fatalf("list (wire %v): %+v %v", c.Wire(), ls, err)
		}
	}
	if c.Wire() {
		t.Fatal("a new Client uses the wire codec before the agent said it reads it")
	}
	run()
	if _, err := c.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	if !c.Wire() {
		t.Fatal("the agent's answer to a ping did not switch the Client to the wire codec")
	}
	run()
	// What goes over the stream: a wire request gets a wire result.
	st, err := c.sess.OpenStream()
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := writeFrame(st, frameRequestWire, (&Request{Op: OpPing}).appendWire(nil)); err != nil {
		t.Fatal(err)
	}
	kind, p, err := readFrame(st)
	var res Result
	if err != nil || kind != frameResultWire || res.decodeWire(p) != nil || !res.Wire {
		t.Fatalf("answer to a wire ping: %q %x %v", kind, p, err)
	}
}
