package guest

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/hashicorp/yamux"
)

// chunkReader returns r's bytes in reads of the given sizes (cycled).
type chunkReader struct {
	b     []byte
	sizes []byte
	i     int
}

func (c *chunkReader) Read(p []byte) (int, error) {
	if len(c.b) == 0 {
		return 0, io.EOF
	}
	n := 1
	if len(c.sizes) > 0 {
		n = int(c.sizes[c.i%len(c.sizes)])%32 + 1
		c.i++
	}
	n = min(n, len(p), len(c.b))
	copy(p, c.b[:n])
	c.b = c.b[n:]
	return n, nil
}
func (c *chunkReader) Write(p []byte) (int, error) { return len(p), nil }
func (c *chunkReader) Close() error                { return nil }

func guardAll(r io.ReadWriteCloser) (int, error) {
	g := &guardConn{ReadWriteCloser: r}
	buf := make([]byte, 64)
	total := 0
	for {
		n, err := g.Read(buf)
		total += n
		if err != nil {
			if errors.Is(err, io.EOF) {
				return total, nil
			}
			return total, err
		}
	}
}

// FuzzGuardConn: the guard refuses the same streams however the reads
// split them.
func FuzzGuardConn(f *testing.F) {
	f.Add([]byte("\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x03abc\x00\x02\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"), []byte{3, 7})
	f.Add([]byte("\x00\x01\x00\x01\x00\x00\x00\x02\x00\x00\x00\x00"), []byte{0})
	f.Fuzz(func(t *testing.T, in, sizes []byte) {
		_, err1 := guardAll(&chunkReader{b: in})
		_, err2 := guardAll(&chunkReader{b: in, sizes: sizes})
		_, err3 := guardAll(&chunkReader{b: in, sizes: []byte{31}})
		if (err1 == nil) != (err2 == nil) || (err1 == nil) != (err3 == nil) {
			t.Fatalf("one byte at a time: %v; in chunks %v: %v; 32 at a time: %v", err1, sizes, err2, err3)
		}
	})
}

// FuzzHostileGuest: a guest answering a call with arbitrary bytes makes
// the host's call return (an error or a result), never panic or hang.
func FuzzHostileGuest(f *testing.F) {
	res := (&Result{File: &FileInfo{Name: "x", Size: 3}, Stats: &Stats{}, Files: []FileInfo{{Name: "a"}}}).appendWire(nil)
	fr := func(kind byte, p []byte) []byte {
		var b bytes.Buffer
		_ = writeFrame(&b, kind, p)
		return b.Bytes()
	}
	for op := byte(0); op < 6; op++ {
		f.Add(op, append(fr(frameData, []byte("hello world")), fr(frameResultWire, res)...))
		f.Add(op, append(fr(frameStdout, []byte("out")), fr(frameResult, []byte(`{"exit_code":1,"file":{"name":"x"},"stats":{},"files":[{"name":"b"}]}`))...))
		f.Add(op, append(fr(frameFilesWire, res), fr(frameError, []byte("no"))...))
		f.Add(op, fr(frameResult, []byte(`{"files":null,"file":null,"stats":null}`)))
	}
	f.Fuzz(func(t *testing.T, op byte, answer []byte) {
		c := hostileGuest(t, func(st *yamux.Stream) {
			_, _, _ = readFrame(st)
			_, _ = st.Write(answer)
			st.Close()
		})
		c.UseWire()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		start := time.Now()
		var limitedOut bytes.Buffer
		switch op % 6 {
		case 0:
			_, _ = c.Ping(ctx)
		case 1:
			_, _ = c.Stat(ctx, "/x")
		case 2:
			_, _ = c.Stats(ctx)
		case 3:
			_, _ = c.List(ctx, "/x")
		case 4:
			_, _ = c.ReadFile(ctx, "/x", 5, &limitedOut)
			if limitedOut.Len() > 5 {
				t.Fatalf("ReadFile with limit 5 wrote %d bytes", limitedOut.Len())
			}
		case 5:
			_, _ = c.Exec(ctx, ExecRequest{Argv: []string{"true"}, Timeout: time.Second}, io.Discard, io.Discard)
		}
		if time.Since(start) > 4*time.Second {
			t.Fatalf("call took %v on answer %q", time.Since(start), answer)
		}
	})
}

// A manifest whose checksum is shorter than 12 characters (empty, cut
// short) gives Verify's error, not a panic.
func TestVerifyShortChecksum(t *testing.T) {
	root := writeTemplate(t, false)
	tpl, err := LoadTemplate(root, "default")
	if err != nil {
		t.Fatal(err)
	}
	tpl.Kernel.SHA256 = "abc"
	defer func() {
		if r := recover(); r != nil {
			t.Fatalf("Verify panicked on a 3-character checksum: %v", r)
		}
	}()
	if err := tpl.Verify(); err == nil {
		t.Fatal("Verify accepted a wrong checksum")
	}
}

// What the host holds of a listing stays near what the guest sent: empty
// entries (2 bytes each in the wire codec, a 48-byte FileInfo each on the
// host) are refused as they are decoded. Before, 8 MiB from the guest
// became hundreds of MiB on the host, and the 64 MiB maxListBytes allows,
// gigabytes (noded holds the listings of every sandbox it runs).
func TestListAmplificationBounded(t *testing.T) {
	const frames = 8
	part := bytes.Repeat([]byte{0x32, 0x00}, MaxFrame/2) // field 6 (files), empty
	c := hostileGuest(t, func(st *yamux.Stream) {
		_, _, _ = readFrame(st)
		for i := 0; i < frames; i++ {
			if writeFrame(st, frameFilesWire, part) != nil {
				break
			}
		}
		_ = writeFrame(st, frameResultWire, nil)
		st.Close()
	})
	c.UseWire()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	files, err := c.List(context.Background(), "/x")
	runtime.ReadMemStats(&after)
	sent := frames * len(part)
	alloc := after.TotalAlloc - before.TotalAlloc
	t.Logf("guest sent %d MiB; host decoded %d entries, allocated %d MiB (err %v)", sent>>20, len(files), alloc>>20, err)
	if err == nil {
		t.Error("a listing of entries without names was accepted")
	}
	if alloc > 4*uint64(sent) {
		t.Errorf("the host allocated %d MiB for %d MiB of listing (%dx): maxListBytes (%d MiB) does not bound the host's memory",
			alloc>>20, sent>>20, alloc/uint64(sent), maxListBytes>>20)
	}
}

// A guest that answers each call with a frame header announcing MaxFrame
// bytes and then sends nothing holds little of the host's memory: the
// payload's buffer grows as bytes arrive. (Before, each such call pinned
// 1 MiB from its header on, for as long as its caller waited.)
func TestAnnouncedFrameDoesNotPinMemory(t *testing.T) {
	const calls = 200
	release := make(chan struct{})
	var announced sync.WaitGroup
	announced.Add(calls)
	c := hostileGuest(t, func(st *yamux.Stream) {
		defer st.Close()
		if _, _, err := readFrame(st); err != nil {
			announced.Done()
			return
		}
		var h [5]byte
		h[0] = frameResultWire
		binary.BigEndian.PutUint32(h[1:], MaxFrame)
		_, _ = st.Write(h[:])
		announced.Done()
		<-release
	})
	c.UseWire()
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range calls {
		wg.Add(1)
		go func() { defer wg.Done(); _, _ = c.Stat(ctx, "/x") }()
	}
	defer func() { cancel(); close(release); wg.Wait() }()
	announced.Wait()
	// The host reads each header a moment after the guest wrote it: the
	// heap is watched for a while.
	var grown uint64
	for range 50 {
		var now runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&now)
		grown = max(grown, now.HeapAlloc-min(now.HeapAlloc, before.HeapAlloc))
		if grown > 40<<20 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("%d calls answered with a %d-byte header each: the host's heap grew %d MiB", calls, MaxFrame, grown>>20)
	if grown > 40<<20 {
		t.Errorf("the host's heap grew %d MiB for %d calls whose guest announced %d bytes and sent none", grown>>20, calls, MaxFrame)
	}
}

// A call other than an exec whose caller set no deadline (an API client
// without one) is not held for good by a guest that never answers: it
// ends at callWait, saying so. (Before, it waited as long as the caller,
// holding its stream and what the guest had sent.)
func TestSilentGuestEndsNonExecCallsAtCallWait(t *testing.T) {
	defer func(w time.Duration) { callWait = w }(callWait)
	callWait = 100 * time.Millisecond
	c := hostileGuest(t, func(st *yamux.Stream) {
		_, _, _ = readFrame(st) // and say nothing
	})
	c.UseWire()
	calls := map[string]func(ctx context.Context) error{
		"stat": func(ctx context.Context) error { _, err := c.Stat(ctx, "/x"); return err },
		"list": func(ctx context.Context) error { _, err := c.List(ctx, "/x"); return err },
		"read": func(ctx context.Context) error { _, err := c.ReadFile(ctx, "/x", 0, io.Discard); return err },
		"write": func(ctx context.Context) error {
			_, err := c.WriteFile(ctx, "/x", nil, bytes.NewReader([]byte("x")))
			return err
		},
		"sync": func(ctx context.Context) error { return c.Sync(ctx) },
	}
	for name, call := range calls {
		ret := make(chan error, 1)
		go func() { ret <- call(context.Background()) }()
		select {
		case err := <-ret:
			if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "did not answer") {
				t.Errorf("%s: err %v, want the guest did not answer in time", name, err)
			}
		case <-time.After(10 * time.Second):
			c.Close()
			<-ret
			t.Fatalf("%s: still waiting for a silent guest after 10s, with callWait %v", name, callWait)
		}
	}
}

// Entries with one-byte names are 5 bytes on the wire and a FileInfo of
// 48 on the host (and more in what a caller makes of each): the host
// charges each entry its own cost and counts a frame's entries before it
// decodes them, so a listing of a million of them is refused having held
// little, and one it accepts is bounded by maxListEntries. Before, five
// wire frames of them (a million entries, under the old maxListEntries
// and far under maxListBytes) were accepted: over 100 MiB allocated for
// 5 MiB sent, and noded then made an API message of each.
func TestListOfTinyEntriesBounded(t *testing.T) {
	entry := []byte{0x32, 0x03, 0x0a, 0x01, 'a'} // field 6 (files): {name: "a"}
	wirePart := bytes.Repeat(entry, MaxFrame/len(entry))
	jsonEntry := []byte(`{"name":"a"},`)
	jsonPart := append(append([]byte(`{"files":[`), bytes.Repeat(jsonEntry, (MaxFrame-64)/len(jsonEntry))...), `{"name":"a"}]}`...)
	for _, tc := range []struct {
		name       string
		wire       bool
		kind, last byte
		part       []byte
		frames     int
		refused    bool
	}{
		{"wire parts", true, frameFilesWire, frameResultWire, wirePart, 5, true},
		{"wire result", true, frameResultWire, 0, wirePart, 1, true},
		{"json parts", false, frameFiles, frameResult, jsonPart, 5, true},
		{"json result", false, frameResult, 0, jsonPart, 1, false}, // 80,655 entries
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := hostileGuest(t, func(st *yamux.Stream) {
				defer st.Close()
				_, _, _ = readFrame(st)
				for range tc.frames {
					if writeFrame(st, tc.kind, tc.part) != nil {
						return
					}
				}
				switch tc.last {
				case frameResultWire:
					_ = writeFrame(st, tc.last, nil)
				case frameResult:
					_ = writeFrame(st, tc.last, []byte("{}"))
				}
			})
			if tc.wire {
				c.UseWire()
			}
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			files, err := c.List(context.Background(), "/x")
			runtime.ReadMemStats(&after)
			sent := tc.frames * len(tc.part)
			alloc := after.TotalAlloc - before.TotalAlloc
			t.Logf("guest sent %d KiB; host decoded %d entries, allocated %d MiB (err %v)", sent>>10, len(files), alloc>>20, err)
			switch {
			case tc.refused && !errors.Is(err, ErrListTooLarge):
				t.Errorf("%d entries: err %v, want ErrListTooLarge", len(files), err)
			case !tc.refused && err != nil:
				t.Errorf("err %v", err)
			}
			if alloc > 24<<20 {
				t.Errorf("the host allocated %d MiB for a listing of %d KiB", alloc>>20, sent>>10)
			}
		})
	}
}

func TestCountJSONElems(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int
	}{
		{`[]`, 0}, {` [ ] `, 0}, {`null`, 0}, {`{"a":[1,2]}`, 0}, {`"x,y"`, 0},
		{`[1]`, 1}, {`[{}]`, 1}, {`[ {"name":"a,]"} , 2 ]`, 2},
		{`["\"", ",", "\\"]`, 3}, {`[[1,2],{"a":[3,4]},[]]`, 3},
	} {
		if got := countJSONElems([]byte(tc.in)); got != tc.want {
			t.Errorf("countJSONElems(%s) = %d, want %d", tc.in, got, tc.want)
		}
	}
}

// A guest's error message is kept to its head, valid UTF-8, however much
// the guest sent: the host logs it at every retry of a task's step and
// sends it to API clients. (Before, a whole frame was kept: 1 MiB of
// whatever the guest chose, in every log line.)
func TestRemoteErrorIsCut(t *testing.T) {
	for _, tc := range []struct {
		name string
		msg  []byte
	}{
		{"long", bytes.Repeat([]byte("e"), MaxFrame)},
		{"invalid", bytes.Repeat([]byte("\xffa"), MaxFrame/2)},
		{"short invalid", []byte("no such file\xff")},
	} {
		c := hostileGuest(t, func(st *yamux.Stream) {
			defer st.Close()
			_, _, _ = readFrame(st)
			_ = writeFrame(st, frameError, tc.msg)
		})
		c.UseWire()
		_, err := c.Stat(context.Background(), "/x")
		var re *RemoteError
		if !errors.As(err, &re) {
			t.Fatalf("%s: err %v, want a RemoteError", tc.name, err)
		}
		if n := len(err.Error()); n > 8<<10 {
			t.Errorf("%s: the guest's error of %d bytes kept as %d bytes", tc.name, len(tc.msg), n)
		}
		if !utf8.ValidString(re.Msg) {
			t.Errorf("%s: the message is not valid UTF-8: %q", tc.name, re.Msg[:min(len(re.Msg), 64)])
		}
		if !strings.HasPrefix(re.Msg, strings.ToValidUTF8(string(tc.msg[:10]), "\uFFFD")) {
			t.Errorf("%s: the message's head is lost: %q", tc.name, re.Msg[:min(len(re.Msg), 64)])
		}
	}
	c := hostileGuest(t, func(st *yamux.Stream) {
		defer st.Close()
		_, _, _ = readFrame(st)
		_ = writeFrame(st, frameError, []byte("stat /x: no such file or directory"))
	})
	if _, err := c.Stat(context.Background(), "/x"); err == nil || err.Error() != "guest: stat /x: no such file or directory" {
		t.Errorf("a short message: %v, want it whole", err)
	}
}

// A guest that answers each call and then keeps sending on the call's
// stream, never closing it, does not grow the host's memory call after
// call: the host drops a stream it is done with, and what comes on it
// after. (Before, yamux kept a stream the host had closed until the guest
// closed it too, or StreamCloseTimeout (a minute) passed, with up to its
// window (256 KiB) of the guest's data: 300 pings held about 60 MiB.)
func TestJunkAfterTheAnswerIsDropped(t *testing.T) {
	const pings = 300
	junk := make([]byte, 200<<10)
	c := hostileGuest(t, func(st *yamux.Stream) {
		if _, _, err := readFrame(st); err != nil {
			return
		}
		if writeJSON(st, frameResult, &Result{GuestUnixNano: 1}) != nil {
			return
		}
		_, _ = st.Write(junk) // and never close the stream
	})
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for i := range pings {
		if _, err := c.Ping(ctx); err != nil {
			t.Fatalf("ping %d: %v", i, err)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	grown := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("%d pings, each followed by %d KiB the host never asked for: the host's heap grew %d MiB; %d streams open",
		pings, len(junk)>>10, grown>>20, c.sess.NumStreams())
	if grown > 16<<20 {
		t.Errorf("the host's heap grew %d MiB over %d pings whose guest sent %d KiB after each answer", grown>>20, pings, len(junk)>>10)
	}
}

// The guest hears of a stream the host dropped: an agent still writing on
// it (a read whose host stopped taking the data) gets an error at once,
// as it did from yamux after StreamCloseTimeout (a minute), and does not
// wait for a window the host will never open.
func TestDroppedStreamIsResetForTheGuest(t *testing.T) {
	wrote := make(chan error, 1)
	c := hostileGuest(t, func(st *yamux.Stream) {
		if _, _, err := readFrame(st); err != nil {
			return
		}
		_ = writeJSON(st, frameResult, &Result{GuestUnixNano: 1})
		_, err := st.Write(make([]byte, 1<<20)) // over the window: waits for the host
		wrote <- err
	})
	if _, err := c.Ping(context.Background()); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-wrote:
		if err == nil {
			t.Fatal("the guest wrote 1 MiB on a stream the host was done with")
		}
	case <-time.After(10 * time.Second):
		c.Close()
		<-wrote
		t.Fatal("the guest's write on a stream the host dropped still waits after 10s")
	}
}

// Only a list's answer has entries: an answer to another call that has
// some is refused before they are decoded, in either codec. (Before, they
// were decoded for every call, uncharged and unchecked: a 1 MiB JSON
// answer to an exec of {"files":[{},{},…]} became 350,000 FileInfos,
// about 40 times its bytes.)
func TestFilesOutsideAListAreRefused(t *testing.T) {
	jsonPart := append(append([]byte(`{"files":[`), bytes.Repeat([]byte(`{},`), (MaxFrame-64)/3)...), `{}]}`...)
	entry := []byte{0x32, 0x03, 0x0a, 0x01, 'a'} // field 6 (files): {name: "a"}
	wirePart := bytes.Repeat(entry, MaxFrame/len(entry))
	for _, tc := range []struct {
		name string
		wire bool
		kind byte
		part []byte
	}{
		{"json", false, frameResult, jsonPart},
		{"wire", true, frameResultWire, wirePart},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := hostileGuest(t, func(st *yamux.Stream) {
				defer st.Close()
				_, _, _ = readFrame(st)
				_ = writeFrame(st, tc.kind, tc.part)
			})
			if tc.wire {
				c.UseWire()
			}
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			_, err := c.Exec(context.Background(), ExecRequest{Argv: []string{"true"}}, io.Discard, io.Discard)
			runtime.ReadMemStats(&after)
			alloc := after.TotalAlloc - before.TotalAlloc
			t.Logf("guest sent %d KiB; host allocated %d MiB (err %v)", len(tc.part)>>10, alloc>>20, err)
			if err == nil || !strings.Contains(err.Error(), "files") {
				t.Errorf("an exec's answer with entries: err %v, want it refused naming files", err)
			}
			if alloc > 8<<20 {
				t.Errorf("the host allocated %d MiB for an exec's answer of %d KiB", alloc>>20, len(tc.part)>>10)
			}
		})
	}
}

// An error made from a guest's answer is cut short, as a guest's own
// message is (TestRemoteErrorIsCut): encoding/json puts a whole literal
// into its error. (Before, an answer of {"exit_code":<1 MiB of digits>}
// gave an error of 1 MiB, which the host logs and sends to API clients.)
func TestAnswerErrorsAreCut(t *testing.T) {
	digits := func(prefix, suffix string) []byte {
		return append(append([]byte(prefix), bytes.Repeat([]byte("9"), MaxFrame-len(prefix)-len(suffix))...), suffix...)
	}
	for _, tc := range []struct {
		name   string
		answer []byte
		call   func(c *Client) error
	}{
		{"exec", digits(`{"exit_code":`, `}`), func(c *Client) error {
			_, err := c.Exec(context.Background(), ExecRequest{Argv: []string{"true"}}, io.Discard, io.Discard)
			return err
		}},
		{"stat", digits(`{"file":{"name":"x","size":`, `}}`), func(c *Client) error {
			_, err := c.Stat(context.Background(), "/x")
			return err
		}},
		{"list", digits(`{"files":[{"name":"x","size":`, `}]}`), func(c *Client) error {
			_, err := c.List(context.Background(), "/x")
			return err
		}},
	} {
		c := hostileGuest(t, func(st *yamux.Stream) {
			defer st.Close()
			_, _, _ = readFrame(st)
			_ = writeFrame(st, frameResult, tc.answer)
		})
		err := tc.call(c)
		if err == nil {
			t.Errorf("%s: an answer with a number of %d digits was accepted", tc.name, len(tc.answer))
			continue
		}
		if n := len(err.Error()); n > 8<<10 {
			t.Errorf("%s: an error of %d bytes for an answer of %d: %.200s…", tc.name, n, len(tc.answer), err)
		}
		if !utf8.ValidString(err.Error()) {
			t.Errorf("%s: the error is not valid UTF-8", tc.name)
		}
	}
}

// An exec's answer with an exit code no process can have is refused, in
// either codec: narrowed by the node (int32) or the CLI (a process's exit
// status is a byte), 256 or 1<<32 read as 0, a success.
func TestExitCodeOutsideAByteIsRefused(t *testing.T) {
	for _, code := range []int{256, -1, 1 << 32, -256} {
		for _, wire := range []bool{false, true} {
			kind, answer := frameResult, []byte(fmt.Sprintf(`{"exit_code":%d}`, code))
			if wire {
				kind, answer = frameResultWire, (&Result{ExitCode: code}).appendWire(nil)
			}
			c := hostileGuest(t, func(st *yamux.Stream) {
				defer st.Close()
				_, _, _ = readFrame(st)
				_ = writeFrame(st, kind, answer)
			})
			if wire {
				c.UseWire()
			}
			res, err := c.Exec(context.Background(), ExecRequest{Argv: []string{"true"}}, io.Discard, io.Discard)
			if err == nil || !strings.Contains(err.Error(), "exit_code") {
				t.Errorf("exit code %d (wire %v): %+v, %v; want it refused naming exit_code", code, wire, res, err)
			}
		}
	}
	for _, code := range []int{0, 1, 255} {
		c := hostileGuest(t, func(st *yamux.Stream) {
			defer st.Close()
			_, _, _ = readFrame(st)
			_ = writeFrame(st, frameResultWire, (&Result{ExitCode: code}).appendWire(nil))
		})
		c.UseWire()
		res, err := c.Exec(context.Background(), ExecRequest{Argv: []string{"true"}}, io.Discard, io.Discard)
		if err != nil || res.ExitCode != code {
			t.Errorf("exit code %d: %+v, %v", code, res, err)
		}
	}
}
