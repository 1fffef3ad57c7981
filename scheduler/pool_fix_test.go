package scheduler

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"connectrpc.com/connect"

	"github.com/warrenhq/warren/api"
	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
	"github.com/warrenhq/warren/api/gen/warren/v1/warrenv1connect"
)

// oneTemplateNode takes pool targets for its one template and refuses any
// other as the microvm node does (not_found).
type oneTemplateNode struct {
	warrenv1connect.UnimplementedSandboxServiceHandler
	id, template string
}

func (n oneTemplateNode) SetPoolTarget(_ context.Context, req *connect.Request[warrenv1.SetPoolTargetRequest]) (*connect.Response[warrenv1.SetPoolTargetResponse], error) {
	if req.Msg.GetTemplate() != n.template {
		return nil, connect.NewError(connect.CodeNotFound, errors.New("template "+req.Msg.GetTemplate()+": not in the store"))
	}
	return connect.NewResponse(&warrenv1.SetPoolTargetResponse{Pools: []*warrenv1.PoolStatus{{NodeId: n.id, Template: n.template, Target: req.Msg.GetTarget()}}}), nil
}

func clusterPools(t *testing.T, n *node) map[string]uint32 {
	t.Helper()
	pools, err := n.srv.fsm.Pools()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]uint32{}
	for _, p := range pools {
		out[p.GetTemplate()] = p.GetTarget()
	}
	return out
}

// A cluster pool target every node refuses (a typo'd template) is refused
// with failed_precondition naming the template, and the cluster keeps the
// targets it had; one a node takes is kept.
func TestPoolTargetEveryNodeRefusesIsNotKept(t *testing.T) {
	n := startSingle(t)
	sc := warrenv1connect.NewSandboxServiceClient(http.DefaultClient, n.url)
	set := func(tpl string, target uint32) error {
		_, err := sc.SetPoolTarget(context.Background(), connect.NewRequest(&warrenv1.SetPoolTargetRequest{Template: tpl, Target: target}))
		return err
	}

	// No node yet: the target is kept for the nodes that join later.
	if err := set("default", 2); err != nil {
		t.Fatal(err)
	}
	if got := clusterPools(t, n); got["default"] != 2 {
		t.Fatalf("cluster pools %v, want default=2 kept with no node registered", got)
	}

	mux := http.NewServeMux()
	mux.Handle(warrenv1connect.NewSandboxServiceHandler(oneTemplateNode{id: "n1", template: "default"}))
	hs := httptest.NewServer(mux)
	defer hs.Close()
	cc := warrenv1connect.NewClusterServiceClient(http.DefaultClient, n.url)
	if _, err := cc.RegisterNode(context.Background(), connect.NewRequest(&warrenv1.RegisterNodeRequest{Node: &warrenv1.Node{
		Id: "n1", Drivers: []string{"microvm"}, Templates: []string{"default"}, SandboxUrl: hs.URL,
		Capacity: &warrenv1.Resources{MilliCpu: 4000, MemoryBytes: 8 << 30}}})); err != nil {
		t.Fatal(err)
	}

	err := set("defualt", 4)
	if connect.CodeOf(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), `"defualt"`) || !strings.Contains(err.Error(), "n1") {
		t.Fatalf("set defualt 4: %v, want failed_precondition naming the template and the node", err)
	}
	if got := clusterPools(t, n); len(got) != 1 || got["default"] != 2 {
		t.Fatalf("cluster pools %v after a refused target, want only default=2", got)
	}

	if err := set("default", 3); err != nil {
		t.Fatal(err)
	}
	if got := clusterPools(t, n); got["default"] != 3 {
		t.Fatalf("cluster pools %v, want default=3", got)
	}
	// A target of 0 removes the record whatever the nodes answer.
	if err := set("default", 0); err != nil {
		t.Fatal(err)
	}
	if got := clusterPools(t, n); len(got) != 0 {
		t.Fatalf("cluster pools %v after set 0, want none", got)
	}
}

// A sandbox request over what a node reads (64 MiB) is refused by the
// server, naming its largest field, not forwarded to be refused whole by
// the node's transport with no field named.
func TestSandboxRequestOverANodesLimitNamesTheField(t *testing.T) {
	n := startSingle(t)
	sc := warrenv1connect.NewSandboxServiceClient(http.DefaultClient, n.url)
	ctx := context.Background()
	huge := "/" + strings.Repeat("a", api.MaxSandboxRequestBytes)
	_, err := sc.ReadFile(ctx, connect.NewRequest(&warrenv1.ReadFileRequest{SandboxId: "sb-0123456789-n1", Path: huge}))
	if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "path: ") {
		t.Errorf("ReadFile with a 64 MiB path: %v; want invalid_argument naming path", err)
	}
	st, err := sc.Exec(ctx, connect.NewRequest(&warrenv1.ExecRequest{SandboxId: "sb-0123456789-n1", Command: []string{"echo", huge}}))
	if err == nil {
		for st.Receive() {
		}
		err = st.Err()
		st.Close()
	}
	if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "command: ") {
		t.Errorf("Exec with a 64 MiB argument: %v; want invalid_argument naming command", err)
	}
	_, err = sc.CreateSandbox(ctx, connect.NewRequest(&warrenv1.CreateSandboxRequest{Env: map[string]string{"BIG": huge}}))
	if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "env: ") {
		t.Errorf("CreateSandbox with a 64 MiB env: %v; want invalid_argument naming env", err)
	}
}
