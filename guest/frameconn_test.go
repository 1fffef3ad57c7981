package guest

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
)

// wireLog records every write made on a connection.
type wireLog struct {
	io.ReadWriteCloser
	mu     sync.Mutex
	writes [][]byte
}

func (w *wireLog) Write(p []byte) (int, error) {
	w.mu.Lock()
	w.writes = append(w.writes, bytes.Clone(p))
	w.mu.Unlock()
	return w.ReadWriteCloser.Write(p)
}

// wholeFrames checks that each write is exactly one yamux frame (a header
// and, for a data frame, the body its length announces), except that a data
// frame over frameConnMax may come as its header and then its body.
func (w *wireLog) wholeFrames() (frames, small, large int, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	body := 0 // a large frame's body still to come
	for i, p := range w.writes {
		if body > 0 {
			if len(p) != body {
				return frames, small, large, fmt.Errorf("write %d: %d bytes, want the %d-byte body of the frame before", i, len(p), body)
			}
			body = 0
			continue
		}
		if len(p) < yamuxHeaderSize {
			return frames, small, large, fmt.Errorf("write %d: %d bytes, shorter than a header", i, len(p))
		}
		frames++
		n := 0
		if p[1] == yamuxTypeData {
			n = int(binary.BigEndian.Uint32(p[8:]))
		}
		switch {
		case n > frameConnMax-yamuxHeaderSize && len(p) == yamuxHeaderSize:
			body = n
			large++
			continue
		case n > 0:
			small++
		}
		if len(p) != yamuxHeaderSize+n {
			return frames, small, large, fmt.Errorf("write %d: %d bytes, the frame it starts is %d (type %d)", i, len(p), yamuxHeaderSize+n, p[1])
		}
	}
	if body > 0 {
		return frames, small, large, fmt.Errorf("the last frame's %d-byte body never came", body)
	}
	return frames, small, large, nil
}

// Both sides, through real calls: no write splits a frame or carries two,
// and calls still work.
func TestEveryWriteIsOneWholeFrame(t *testing.T) {
	a, b := net.Pipe()
	hostWire, guestWire := &wireLog{ReadWriteCloser: a}, &wireLog{ReadWriteCloser: b}
	srv := &Server{Sys: &fakeSys{}}
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(guestWire) }()
	c, err := NewClient(hostWire)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { c.Close(); <-done }()

	ctx := context.Background()
	if _, err := c.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	res, err := c.Exec(ctx, ExecRequest{Argv: []string{"sh", "-c", "head -c 300000 /dev/zero | tr '\\0' x; echo; exit 4"}}, &out, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode != 4 || out.Len() != 300001 {
		t.Fatalf("exit %d, %d bytes of output", res.ExitCode, out.Len())
	}
	big := bytes.Repeat([]byte("y"), 400_000) // over yamux's 256 KiB window
	path := t.TempDir() + "/f"
	if _, err := c.WriteFile(ctx, path, 0o600, bytes.NewReader(big)); err != nil {
		t.Fatal(err)
	}
	var got bytes.Buffer
	if _, err := c.ReadFile(ctx, path, 1<<20, &got); err != nil || !bytes.Equal(got.Bytes(), big) {
		t.Fatalf("read back %d bytes, err %v", got.Len(), err)
	}
	for name, w := range map[string]*wireLog{"host": hostWire, "guest": guestWire} {
		frames, small, large, err := w.wholeFrames()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if small == 0 || large == 0 {
			t.Fatalf("%s: %d frames, %d small and %d large data frames; the test needs both kinds", name, frames, small, large)
		}
		t.Logf("%s: %d frames, %d of them small data frames sent whole, %d large ones", name, frames, small, large)
	}
}

// A data header waits for its body; other headers, data headers of an
// empty frame (a close) and of a large one go out at once.
func TestFrameConnHoldsOnlyDataHeaders(t *testing.T) {
	var rec wireLog
	rec.ReadWriteCloser = nopRWC{}
	c := newFrameConn(&rec)
	hdr := func(typ byte, length uint32) []byte {
		h := make([]byte, yamuxHeaderSize)
		h[1] = typ
		binary.BigEndian.PutUint32(h[8:], length)
		return h
	}
	steps := []struct {
		p      []byte
		writes int // on the wire after this write
	}{
		{hdr(yamuxTypeData, 5), 0},
		{[]byte("hello"), 1},
		{hdr(1, 262144), 2}, // a window update
		{hdr(yamuxTypeData, 0), 3},
		{hdr(2, 0), 4}, // a ping
		{hdr(yamuxTypeData, 12), 4},
		{hdr(yamuxTypeData, 7), 5},            // a 12-byte body that looks like a header
		{hdr(yamuxTypeData, frameConnMax), 6}, // too large to merge
		{make([]byte, frameConnMax), 7},
	}
	for i, s := range steps {
		n, err := c.Write(s.p)
		if err != nil || n != len(s.p) {
			t.Fatalf("step %d: wrote %d of %d: %v", i, n, len(s.p), err)
		}
		if len(rec.writes) != s.writes {
			t.Fatalf("step %d: %d writes on the wire, want %d", i, len(rec.writes), s.writes)
		}
	}
	if w := rec.writes[0]; len(w) != 17 || string(w[12:]) != "hello" {
		t.Fatalf("first write %q, want the header and its body", w)
	}
	if w := rec.writes[4]; len(w) != 24 || binary.BigEndian.Uint32(w[8:]) != 12 {
		t.Fatalf("fifth write %d bytes, want the 12-byte frame whole", len(w))
	}
}

type nopRWC struct{}

func (nopRWC) Read([]byte) (int, error)    { return 0, io.EOF }
func (nopRWC) Write(p []byte) (int, error) { return len(p), nil }
func (nopRWC) Close() error                { return nil }
