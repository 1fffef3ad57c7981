package scheduler

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/warrenhq/warren/api"
	fsmv1 "github.com/warrenhq/warren/api/gen/warren/fsm/v1"
	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
	"github.com/warrenhq/warren/api/gen/warren/v1/warrenv1connect"
)

// poolNode answers ListPools with one pool; every other call is
// unimplemented.
type poolNode struct {
	warrenv1connect.UnimplementedSandboxServiceHandler
	id string
}

func (n poolNode) ListPools(context.Context, *connect.Request[warrenv1.ListPoolsRequest]) (*connect.Response[warrenv1.ListPoolsResponse], error) {
	return connect.NewResponse(&warrenv1.ListPoolsResponse{Pools: []*warrenv1.PoolStatus{{NodeId: n.id, Template: "default", Target: 1}}}), nil
}

// A call to every node reports apart the nodes that answered with an
// error of their own (refused, with their reason) and those that did not
// answer at all: "did not answer" for a node that did was misleading.
func TestFanOutSeparatesRefusedFromUnreachableNodes(t *testing.T) {
	tf := newTestFSM(t)
	serve := func(h warrenv1connect.SandboxServiceHandler) string {
		mux := http.NewServeMux()
		mux.Handle(warrenv1connect.NewSandboxServiceHandler(h))
		hs := httptest.NewServer(mux)
		t.Cleanup(hs.Close)
		return hs.URL
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gone := "http://" + ln.Addr().String()
	ln.Close() // nothing listens there now
	for id, url := range map[string]string{
		"n-ok":      serve(poolNode{id: "n-ok"}),
		"n-refuses": serve(warrenv1connect.UnimplementedSandboxServiceHandler{}),
		"n-gone":    gone,
	} {
		tf.ok(&fsmv1.RegisterNode{Node: &warrenv1.Node{Id: id, Drivers: []string{"microvm"}, SandboxUrl: url,
			Capacity: &warrenv1.Resources{MilliCpu: 1000, MemoryBytes: 1 << 30}}, Time: timestamppb.New(t0)})
	}
	a := newSandboxAPI(&Server{fsm: tf.fsm})
	t.Cleanup(a.http.CloseIdleConnections) // goleak: no keep-alive readers left
	res, err := a.ListPools(context.Background(), connect.NewRequest(&warrenv1.ListPoolsRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	m := res.Msg
	if len(m.GetPools()) != 1 || m.GetPools()[0].GetNodeId() != "n-ok" {
		t.Errorf("pools %v, want n-ok's", m.GetPools())
	}
	if u := m.GetUnreachableNodes(); len(u) != 1 || !strings.HasPrefix(u[0], "n-gone: unavailable") {
		t.Errorf("unreachable %q, want n-gone's", u)
	}
	if r := m.GetRefusedNodes(); len(r) != 1 || !strings.HasPrefix(r[0], "n-refuses: unimplemented") {
		t.Errorf("refused %q, want n-refuses' with its reason", r)
	}
}

// spyNode counts the sandbox calls that reach it.
type spyNode struct {
	warrenv1connect.UnimplementedSandboxServiceHandler
	calls *atomic.Int32
}

func (n spyNode) WriteFile(context.Context, *connect.Request[warrenv1.WriteFileRequest]) (*connect.Response[warrenv1.WriteFileResponse], error) {
	n.calls.Add(1)
	return connect.NewResponse(&warrenv1.WriteFileResponse{}), nil
}

func (n spyNode) Exec(context.Context, *connect.Request[warrenv1.ExecRequest], *connect.ServerStream[warrenv1.ExecResponse]) error {
	n.calls.Add(1)
	return nil
}

// spyOnN1 is a server's sandbox API over a cluster of one node, n1, whose
// sandbox service is a spyNode counting the calls that reach it.
func spyOnN1(t *testing.T) (*testFSM, *sandboxAPI, *atomic.Int32) {
	t.Helper()
	tf := newTestFSM(t)
	calls := new(atomic.Int32)
	mux := http.NewServeMux()
	mux.Handle(warrenv1connect.NewSandboxServiceHandler(spyNode{calls: calls}))
	hs := httptest.NewServer(mux)
	t.Cleanup(hs.Close)
	tf.ok(&fsmv1.RegisterNode{Node: &warrenv1.Node{Id: "n1", Drivers: []string{"microvm"}, SandboxUrl: hs.URL,
		Capacity: &warrenv1.Resources{MilliCpu: 1000, MemoryBytes: 1 << 30}}, Time: timestamppb.New(t0)})
	a := newSandboxAPI(&Server{fsm: tf.fsm})
	t.Cleanup(a.http.CloseIdleConnections)
	return tf, a, calls
}

// A file or stdin over the sandbox API's limits is refused by the server,
// naming the field, and not forwarded: the node would refuse it, and one
// past the node's message limit (which this server's exceeds) with an
// error that names no field.
func TestSandboxCallsOverTheLimitsAreNotForwarded(t *testing.T) {
	_, a, calls := spyOnN1(t)
	ctx := context.Background()
	id := "sb-0000000000-n1"

	// Within the limits, both reach the node.
	if _, err := a.WriteFile(ctx, connect.NewRequest(&warrenv1.WriteFileRequest{SandboxId: id, Path: "/x", Data: []byte("x")})); err != nil {
		t.Fatal(err)
	}
	if got := calls.Load(); got != 1 {
		t.Fatalf("a small write reached the node %d times, want 1", got)
	}

	_, err := a.WriteFile(ctx, connect.NewRequest(&warrenv1.WriteFileRequest{SandboxId: id, Path: "/x", Data: make([]byte, api.MaxSandboxFileBytes+1)}))
	if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "data: 33554433 bytes, over the limit of 33554432") {
		t.Errorf("write over the limit: %v, want invalid_argument naming data", err)
	}
	err = a.Exec(ctx, connect.NewRequest(&warrenv1.ExecRequest{SandboxId: id, Command: []string{"cat"}, Stdin: make([]byte, api.MaxSandboxStdinBytes+1)}), nil)
	if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "stdin: 8388609 bytes, over the limit of 8388608") {
		t.Errorf("exec with stdin over the limit: %v, want invalid_argument naming stdin", err)
	}
	if got := calls.Load(); got != 1 {
		t.Errorf("calls over the limits reached the node: %d calls in all, want 1", got)
	}
}

// A file call with a bad sandbox id, or one naming a node not in the
// cluster, is refused at once for what it is while the gate is full: it
// took its room first, and with the gate busy waited the gate's wait and
// got resource_exhausted, which clients retry. A good call still waits
// for room.
func TestFileCallsAreCheckedBeforeTheBulkGate(t *testing.T) {
	_, a, calls := spyOnN1(t)
	a.bulk = api.NewBulkGate(api.MaxSandboxFileBytes, 100*time.Millisecond)
	ctx := context.Background()
	release, err := a.bulk.Take(ctx, "test", api.MaxSandboxFileBytes)
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	_, err = a.ReadFile(ctx, connect.NewRequest(&warrenv1.ReadFileRequest{SandboxId: "bogus", Path: "/x"}))
	if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "sandbox_id") {
		t.Errorf("read_file of sandbox bogus with the gate full: %v, want invalid_argument naming sandbox_id", err)
	}
	_, err = a.WriteFile(ctx, connect.NewRequest(&warrenv1.WriteFileRequest{SandboxId: "bogus", Path: "/x", Data: []byte("x")}))
	if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "sandbox_id") {
		t.Errorf("write_file to sandbox bogus with the gate full: %v, want invalid_argument naming sandbox_id", err)
	}
	_, err = a.ListFiles(ctx, connect.NewRequest(&warrenv1.ListFilesRequest{SandboxId: "sb-0000000000-nosuchnode", Path: "/"}))
	if connect.CodeOf(err) != connect.CodeNotFound || !strings.Contains(err.Error(), "nosuchnode") {
		t.Errorf("list_files on a node not in the cluster with the gate full: %v, want not_found naming the node", err)
	}
	_, err = a.WriteFile(ctx, connect.NewRequest(&warrenv1.WriteFileRequest{SandboxId: "sb-0000000000-n1", Path: "/x", Data: []byte("x")}))
	if connect.CodeOf(err) != connect.CodeResourceExhausted {
		t.Errorf("a good write_file with the gate full: %v, want resource_exhausted", err)
	}
	if got := calls.Load(); got != 0 {
		t.Errorf("%d calls reached the node", got)
	}
}

// A sandbox created on a node named outright is refused there while the
// node is cordoned or draining, as pick would skip it; the node is never
// called.
func TestCreateSandboxOnACordonedOrDrainingNodeIsRefused(t *testing.T) {
	tf, a, calls := spyOnN1(t)
	create := func() error {
		_, err := a.CreateSandbox(context.Background(), connect.NewRequest(&warrenv1.CreateSandboxRequest{NodeId: "n1"}))
		return err
	}
	tf.ok(&fsmv1.NodeOp{Id: "n1", Op: fsmv1.NodeOp_OP_CORDON, Time: timestamppb.New(t0)})
	if err := create(); connect.CodeOf(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), "node n1 is cordoned") {
		t.Errorf("on a cordoned node: %v, want failed_precondition naming it cordoned", err)
	}
	tf.ok(&fsmv1.NodeOp{Id: "n1", Op: fsmv1.NodeOp_OP_DRAIN, DrainDeadline: timestamppb.New(t0), Time: timestamppb.New(t0)})
	if err := create(); connect.CodeOf(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), "node n1 is draining") {
		t.Errorf("on a draining node: %v, want failed_precondition naming it draining", err)
	}
	if got := calls.Load(); got != 0 {
		t.Errorf("the node was called %d times", got)
	}
}

// A node id that no node could have, given as node_id or as a sandbox
// id's node part, is refused as invalid_argument naming the field, and
// is not echoed whole (an id of megabytes would be).
func TestSandboxCallsRefuseImpossibleNodeIDs(t *testing.T) {
	tf := newTestFSM(t)
	a := newSandboxAPI(&Server{fsm: tf.fsm})
	ctx := context.Background()
	long := strings.Repeat("N", 1<<20)
	_, err := a.ListSandboxes(ctx, connect.NewRequest(&warrenv1.ListSandboxesRequest{NodeId: long}))
	if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "node_id") || len(err.Error()) > 1000 {
		t.Errorf("list on node %d×N: code %v, %d bytes of error", len(long), connect.CodeOf(err), len(err.Error()))
	}
	_, err = a.ListPools(ctx, connect.NewRequest(&warrenv1.ListPoolsRequest{NodeId: "Bad Node"}))
	if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), `node_id: "Bad Node"`) {
		t.Errorf("pools of node %q: %v", "Bad Node", err)
	}
	_, err = a.GetSandbox(ctx, connect.NewRequest(&warrenv1.GetSandboxRequest{SandboxId: "sb-0000000000-" + long}))
	if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "sandbox_id") || len(err.Error()) > 1000 {
		t.Errorf("get of a sandbox on node %d×N: code %v, %d bytes of error", len(long), connect.CodeOf(err), len(err.Error()))
	}
}

// A node marked down is not asked for its sandboxes, but the list names
// it, since one only cut off from the servers still runs them. Before,
// its sandboxes were left out without a word.
func TestListSandboxesNamesDownNodes(t *testing.T) {
	tf := newTestFSM(t)
	tf.ok(&fsmv1.RegisterNode{Node: &warrenv1.Node{Id: "n-down", Drivers: []string{"microvm"}, SandboxUrl: "http://127.0.0.1:1",
		Capacity: &warrenv1.Resources{MilliCpu: 1000, MemoryBytes: 1 << 30}}, Time: timestamppb.New(t0)})
	tf.ok(&fsmv1.NodeOp{Id: "n-down", Op: fsmv1.NodeOp_OP_DOWN, Time: timestamppb.New(t0)})
	a := newSandboxAPI(&Server{fsm: tf.fsm})
	t.Cleanup(a.http.CloseIdleConnections)
	res, err := a.ListSandboxes(context.Background(), connect.NewRequest(&warrenv1.ListSandboxesRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if u := res.Msg.GetUnreachableNodes(); len(u) != 1 || !strings.HasPrefix(u[0], "n-down: marked down") {
		t.Fatalf("unreachable nodes %q, want the down node named", u)
	}
}
