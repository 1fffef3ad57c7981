package scheduler

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

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
