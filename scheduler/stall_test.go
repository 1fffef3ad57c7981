package scheduler

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/api/apitest"
	fsmv1 "github.com/warrenhq/warren/api/gen/warren/fsm/v1"
	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
	"github.com/warrenhq/warren/api/gen/warren/v1/warrenv1connect"
)

// A client that keeps its connection open but stops reading does not hold
// an event stream for good: past streamWriteTimeout a write fails and the
// stream ends, releasing its goroutine, its watch of the task and the page
// of events it held. Before, it stayed blocked in the write (no deadline),
// over SSE and over StreamEvents alike.
func TestAStalledStreamEnds(t *testing.T) {
	old := streamWriteTimeout
	streamWriteTimeout = time.Second
	defer func() { streamWriteTimeout = old }()
	n := startSingle(t)
	task := createVia(t, n, 1)
	ctx := context.Background()
	// About 20 MiB of events: more than the socket buffers between the
	// server and a client that reads nothing hold.
	text := strings.Repeat("x", 30<<10)
	for i := range 700 {
		if _, err := n.tasks.SendMessage(ctx, connect.NewRequest(&warrenv1.SendMessageRequest{TaskId: task.GetId(), Text: text, RequestId: fmt.Sprint("m", i)})); err != nil {
			t.Fatal(err)
		}
	}
	addr := strings.TrimPrefix(n.url, "http://")
	body := []byte(fmt.Sprintf(`{"taskId":%q}`, task.GetId()))
	env := binary.BigEndian.AppendUint32([]byte{0}, uint32(len(body)))
	for _, c := range []struct{ name, req string }{
		{"SSE", "GET /v1/tasks/" + task.GetId() + "/events HTTP/1.1\r\nHost: x\r\n\r\n"},
		{"StreamEvents", fmt.Sprintf("POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/connect+json\r\nConnect-Protocol-Version: 1\r\nContent-Length: %d\r\n\r\n%s%s",
			warrenv1connect.TaskServiceStreamEventsProcedure, len(env)+len(body), env, body)},
	} {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		conn.(*net.TCPConn).SetReadBuffer(4096)
		if _, err := conn.Write([]byte(c.req)); err != nil {
			t.Fatal(err)
		}
		waitFor(t, c.name+" stream to start", 10*time.Second, func() bool { return n.srv.fsm.watch.watched() > 0 })
		// It reads nothing: the stream's write blocks, then times out.
		waitFor(t, c.name+" stream stalled by its client to end", 20*time.Second, func() bool { return n.srv.fsm.watch.watched() == 0 })
	}
}

// A stream that waits for its next event longer than the write timeout
// is not ended by it: the deadline holds only while a write runs (an
// HTTP/2 stream whose deadline passes is reset even while idle), over
// HTTP/1.1 and over cleartext HTTP/2 alike.
func TestAnIdleStreamOutlivesTheWriteTimeout(t *testing.T) {
	old := streamWriteTimeout
	streamWriteTimeout = 200 * time.Millisecond
	defer func() { streamWriteTimeout = old }()
	n := startSingle(t)
	task := createVia(t, n, 1)
	h2url, h2 := serveH2C(t, n)
	for name, cl := range map[string]warrenv1connect.TaskServiceClient{
		"HTTP/1.1": n.tasks,
		"h2c":      warrenv1connect.NewTaskServiceClient(h2, h2url),
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		st, err := cl.StreamEvents(ctx, connect.NewRequest(&warrenv1.StreamEventsRequest{TaskId: task.GetId()}))
		if err != nil {
			t.Fatal(err)
		}
		var last uint64
		got := make(chan uint64, 100)
		go func() {
			for st.Receive() {
				got <- st.Msg().GetEvent().GetSeq()
			}
			close(got)
		}()
		for last < task.GetNextSeq()-1 {
			seq, ok := <-got
			if !ok {
				t.Fatalf("%s: stream ended before the task's events: %v", name, st.Err())
			}
			last = seq
		}
		time.Sleep(4 * streamWriteTimeout) // idle past the timeout
		if _, err := n.tasks.SendMessage(ctx, connect.NewRequest(&warrenv1.SendMessageRequest{TaskId: task.GetId(), Text: "after the idle", RequestId: "idle-" + name})); err != nil {
			t.Fatal(err)
		}
		select {
		case seq, ok := <-got:
			if !ok || seq != last+1 {
				t.Fatalf("%s: after an idle spell the stream gave %d (open %v), want %d: %v", name, seq, ok, last+1, st.Err())
			}
		case <-ctx.Done():
			t.Fatalf("%s: no event after the idle spell", name)
		}
		cancel()
		st.Close()
	}
}

// chattyNode is a node's sandbox service whose Exec streams output until
// a send fails; ended is closed then.
type chattyNode struct {
	warrenv1connect.UnimplementedSandboxServiceHandler
	ended chan struct{}
}

func (n chattyNode) Exec(ctx context.Context, _ *connect.Request[warrenv1.ExecRequest], st *connect.ServerStream[warrenv1.ExecResponse]) error {
	defer close(n.ended)
	out := &warrenv1.ExecResponse{Event: &warrenv1.ExecResponse_Stdout{Stdout: make([]byte, 64<<10)}}
	for ctx.Err() == nil {
		if err := st.Send(out); err != nil {
			return err
		}
	}
	return ctx.Err()
}

// A client that starts a sandbox Exec through a server and then reads
// nothing does not hold the server's relay (and the node's call behind
// it) for good: past streamWriteTimeout the server's write fails, and its
// call to the node ends. Before, the server blocked in the write, stopped
// reading from the node, and the node blocked in turn.
func TestAStalledSandboxExecEnds(t *testing.T) {
	old := streamWriteTimeout
	streamWriteTimeout = time.Second
	defer func() { streamWriteTimeout = old }()
	node := chattyNode{ended: make(chan struct{})}
	mux := http.NewServeMux()
	mux.Handle(warrenv1connect.NewSandboxServiceHandler(node))
	spy := httptest.NewServer(mux)
	defer spy.Close()
	n := startSingle(t)
	cc := warrenv1connect.NewClusterServiceClient(http.DefaultClient, n.url)
	if _, err := cc.RegisterNode(context.Background(), connect.NewRequest(&warrenv1.RegisterNodeRequest{Node: &warrenv1.Node{
		Id: "n1", Drivers: []string{"microvm"}, SandboxUrl: spy.URL, Capacity: &warrenv1.Resources{MilliCpu: 1000, MemoryBytes: 1 << 30}}})); err != nil {
		t.Fatal(err)
	}
	conn, err := net.Dial("tcp", strings.TrimPrefix(n.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.(*net.TCPConn).SetReadBuffer(4096)
	body := []byte(fmt.Sprintf(`{"sandboxId":%q,"command":["yes"]}`, api.NewSandboxID("n1")))
	env := binary.BigEndian.AppendUint32([]byte{0}, uint32(len(body)))
	if _, err := fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/connect+json\r\nConnect-Protocol-Version: 1\r\nContent-Length: %d\r\n\r\n%s%s",
		warrenv1connect.SandboxServiceExecProcedure, len(env)+len(body), env, body); err != nil {
		t.Fatal(err)
	}
	select {
	case <-node.ended:
	case <-time.After(20 * time.Second):
		t.Fatal("a sandbox Exec whose client reads nothing still holds the node's call 20 s on (write timeout 1 s)")
	}
}

// bigFileNode is a node's sandbox service whose every file holds 16 MiB.
type bigFileNode struct {
	warrenv1connect.UnimplementedSandboxServiceHandler
}

func (bigFileNode) ReadFile(context.Context, *connect.Request[warrenv1.ReadFileRequest]) (*connect.Response[warrenv1.ReadFileResponse], error) {
	return connect.NewResponse(&warrenv1.ReadFileResponse{Data: make([]byte, 16<<20)}), nil
}

// A ReadFile through a server holds its room in the server's gate until
// its answer is written, and a client that reads nothing holds it only
// until a write of the answer times out. The room was given back when the
// handler returned, before connect-go marshaled and wrote the answer,
// with no deadline on the write: each call whose client read nothing kept
// the node's answer and its marshaled copy on the server for as long as
// the connection stayed open, while the gate let more in.
func TestAFileAnswerHoldsItsRoomUntilSent(t *testing.T) {
	old := streamWriteTimeout
	streamWriteTimeout = 2 * time.Second
	defer func() { streamWriteTimeout = old }()
	nmux := http.NewServeMux()
	nmux.Handle(warrenv1connect.NewSandboxServiceHandler(bigFileNode{}))
	nhs := httptest.NewServer(nmux)
	defer nhs.Close()
	tf := newTestFSM(t)
	tf.ok(&fsmv1.RegisterNode{Node: &warrenv1.Node{Id: "n1", Drivers: []string{"microvm"}, SandboxUrl: nhs.URL,
		Capacity: &warrenv1.Resources{MilliCpu: 1000, MemoryBytes: 1 << 30}}, Time: timestamppb.New(t0)})
	a := newSandboxAPI(&Server{fsm: tf.fsm})
	defer a.http.CloseIdleConnections()
	a.bulk = api.NewBulkGate(api.MaxSandboxFileBytes, 300*time.Millisecond)
	mux := http.NewServeMux()
	mux.Handle(sandboxHandler(a))
	hs := httptest.NewServer(mux)
	defer hs.Close()
	apitest.FileAnswerHoldsItsRoom(t, hs.Client(), hs.URL, api.NewSandboxID("n1"), 16<<20)
}
