package driver

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/yamux"
	"pgregory.net/rapid"

	"github.com/warrenhq/warren/guest"
)

// CappedOutput keeps everything up to its size, then the head and the
// tail of what was written, and says how much it left out.
func TestCappedOutputKeepsTheHeadAndTheTail(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		max := rapid.IntRange(4, 256).Draw(t, "max")
		writes := rapid.SliceOf(rapid.SliceOfN(rapid.Byte(), 0, 600)).Draw(t, "writes")
		c := NewCappedOutput(max)
		var all []byte
		for _, w := range writes {
			if n, err := c.Write(w); n != len(w) || err != nil {
				t.Fatalf("write: %d %v", n, err)
			}
			all = append(all, w...)
		}
		if c.Len() != int64(len(all)) {
			t.Fatalf("len %d, want %d", c.Len(), len(all))
		}
		got := c.Bytes()
		if len(all) <= max {
			if !bytes.Equal(got, all) || c.Dropped() != 0 {
				t.Fatalf("under the cap: got %q, want %q", got, all)
			}
			return
		}
		head, keep := max/4, max-max/4
		dropped := len(all) - head - keep
		want := append(append(append([]byte(nil), all[:head]...), fmt.Sprintf("\n[... %d bytes of output left out ...]\n", dropped)...), all[len(all)-keep:]...)
		if c.Dropped() != int64(dropped) || !bytes.Equal(got, want) {
			t.Fatalf("dropped %d (want %d), got %q, want %q", c.Dropped(), dropped, got, want)
		}
	})
}

// A command that prints for its whole timeout leaves the node about the
// cap's worth, not what it printed.
func TestCappedOutputHoldsItsSize(t *testing.T) {
	c := NewCappedOutput(1 << 20)
	chunk := []byte(strings.Repeat("y\n", 32<<10))
	for range 1024 { // 64 MiB
		c.Write(chunk)
	}
	if n := cap(c.head) + cap(c.tail); n > 4<<20 {
		t.Errorf("holds %d bytes for a cap of 1 MiB", n)
	}
	if c.Dropped() != 64<<20-1<<20 {
		t.Errorf("dropped %d", c.Dropped())
	}
}

// guestFrame is one frame of the guest agent's call stream.
func guestFrame(kind byte, p []byte) []byte {
	b := make([]byte, 5, 5+len(p))
	b[0] = kind
	binary.BigEndian.PutUint32(b[1:], uint32(len(p)))
	return append(b, p...)
}

// AgentCalls.Exec keeps at most MaxExecOutput of a command's output (it
// kept all of it: a command that prints for its whole timeout, `yes` or a
// guest that just sends frames, grew the node's memory without bound).
// Here a FAKE guest on a pipe sends 48 MiB.
func TestExecOutputIsBoundedOnTheHost(t *testing.T) {
	const sent = 48 << 20
	a, b := net.Pipe()
	c, err := guest.NewClient(a)
	if err != nil {
		t.Fatal(err)
	}
	sess, err := yamux.Server(b, guest.YamuxConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	defer c.Close()
	go func() {
		st, err := sess.AcceptStream()
		if err != nil {
			return
		}
		defer st.Close()
		var h [5]byte
		if _, err := st.Read(h[:]); err != nil {
			return
		}
		chunk := guestFrame('o', make([]byte, 1<<20))
		for range sent >> 20 {
			if _, err := st.Write(chunk); err != nil {
				return
			}
		}
		_, _ = st.Write(guestFrame('r', []byte(`{"exit_code":0}`)))
	}()
	ac := AgentCalls{Agent: func() (*guest.Client, error) { return c, nil }}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	res, err := ac.Exec(ctx, ExecRequest{Command: "yes", Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Output) > MaxExecOutput+100 || !bytes.Contains(res.Output, []byte(fmt.Sprintf("[... %d bytes of output left out ...]", sent-MaxExecOutput))) {
		t.Fatalf("the host kept %d bytes of one command's output", len(res.Output))
	}
}
