// Package apitest holds checks that the tests of both sandbox APIs (a
// node's and the servers' public one) share.
package apitest

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
	"github.com/warrenhq/warren/api/gen/warren/v1/warrenv1connect"
)

// FileAnswerHoldsItsRoom checks that a ReadFile's room in the bulk gate is
// held until its answer is written, and only until a write of it times
// out. url serves a SandboxService (hc its client) whose ReadFile answers
// size bytes for any path of sandbox id, with a gate that has room for one
// such answer and a write timeout of 2 s: a ReadFile whose client reads
// nothing past the answer's first line holds the room, so a second one is
// refused resource_exhausted; once the stalled write times out, a
// ReadFile gets its size bytes again.
func FileAnswerHoldsItsRoom(t testing.TB, hc *http.Client, url, id string, size int) {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.(*net.TCPConn).SetReadBuffer(4096)
	body := fmt.Sprintf(`{"sandboxId":%q,"path":"/big"}`, id)
	if _, err := fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
		warrenv1connect.SandboxServiceReadFileProcedure, len(body), body); err != nil {
		t.Fatal(err)
	}
	// The answer's first line comes: the handler has returned, and the
	// answer is being written to a client that reads no more.
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	if line, err := bufio.NewReader(conn).ReadString('\n'); err != nil || !strings.HasPrefix(line, "HTTP/1.1 200") {
		t.Fatalf("the first ReadFile's answer: %q, %v", line, err)
	}
	c := warrenv1connect.NewSandboxServiceClient(hc, url)
	defer hc.CloseIdleConnections()
	read := func() error {
		res, err := c.ReadFile(context.Background(), connect.NewRequest(&warrenv1.ReadFileRequest{SandboxId: id, Path: "/other"}))
		if err == nil && len(res.Msg.GetData()) != size {
			t.Fatalf("read %d bytes, want %d", len(res.Msg.GetData()), size)
		}
		return err
	}
	if err := read(); connect.CodeOf(err) != connect.CodeResourceExhausted {
		t.Fatalf("a ReadFile while another's answer is unsent: %v, want resource_exhausted", err)
	}
	// Past the write timeout the stalled answer's write fails, and its
	// room comes back.
	end := time.Now().Add(20 * time.Second)
	for {
		err := read()
		if err == nil {
			return
		}
		if connect.CodeOf(err) != connect.CodeResourceExhausted || time.Now().After(end) {
			t.Fatalf("a ReadFile after the stalled answer's write timeout (2 s): %v", err)
		}
	}
}
