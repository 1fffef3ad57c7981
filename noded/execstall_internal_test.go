package noded

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/api/gen/warren/v1/warrenv1connect"
	"github.com/warrenhq/warren/guest"
	"github.com/warrenhq/warren/noded/driver"
)

// chattyBox is a sandbox whose command prints without end until its
// output can no longer be written; ended is closed then.
type chattyBox struct {
	driver.Interactive // nil: only ID and Run are called
	id                 string
	ended              chan struct{}
}

func (b *chattyBox) ID() string { return b.id }

func (b *chattyBox) Run(ctx context.Context, req guest.ExecRequest, stdout, stderr io.Writer) (guest.ExecResult, error) {
	defer close(b.ended)
	chunk := bytes.Repeat([]byte("y\n"), 32<<10)
	for {
		if _, err := stdout.Write(chunk); err != nil {
			return guest.ExecResult{}, err
		}
		if ctx.Err() != nil {
			return guest.ExecResult{}, ctx.Err()
		}
	}
}

// A client that starts an Exec and then reads nothing (its connection
// open, its receive window shut) does not hold the call for good: a write
// of the output that cannot go out within sandboxWriteTimeout fails and the
// call ends, with the command's call to its guest. It used to block in
// the write for as long as the connection stayed open.
func TestAStalledExecEnds(t *testing.T) {
	old := sandboxWriteTimeout
	sandboxWriteTimeout = time.Second
	defer func() { sandboxWriteTimeout = old }()
	id := api.NewSandboxID(testNode)
	box := &chattyBox{id: id, ended: make(chan struct{})}
	hs := httptest.NewServer(sandboxHandler(NewSandboxAPI(testNode, t.TempDir(), &listDriver{name: "microvm", live: map[string]driver.Sandbox{id: box}}, nil)))
	defer hs.Close()
	conn, err := net.Dial("tcp", strings.TrimPrefix(hs.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.(*net.TCPConn).SetReadBuffer(4096)
	body := []byte(fmt.Sprintf(`{"sandboxId":%q,"command":["yes"]}`, id))
	env := binary.BigEndian.AppendUint32([]byte{0}, uint32(len(body)))
	req := fmt.Sprintf("POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/connect+json\r\nConnect-Protocol-Version: 1\r\nContent-Length: %d\r\n\r\n%s%s",
		warrenv1connect.SandboxServiceExecProcedure, len(env)+len(body), env, body)
	if _, err := conn.Write([]byte(req)); err != nil {
		t.Fatal(err)
	}
	// It reads nothing: the output's write blocks, then times out.
	select {
	case <-box.ended:
	case <-time.After(20 * time.Second):
		t.Fatal("an Exec whose client reads nothing is still writing 20 s on (write timeout 1 s)")
	}
}
