package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
	"github.com/warrenhq/warren/api/gen/warren/v1/warrenv1connect"
	"github.com/warrenhq/warren/scheduler"
)

// fakeDrains is a fake ClusterService (not a warren server) that records
// the deadlines of the drains it is asked for.
type fakeDrains struct {
	warrenv1connect.UnimplementedClusterServiceHandler
	mu   sync.Mutex
	secs []int64
}

func (d *fakeDrains) DrainNode(_ context.Context, req *connect.Request[warrenv1.DrainNodeRequest]) (*connect.Response[warrenv1.NodeResponse], error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.secs = append(d.secs, req.Msg.GetDeadlineSeconds())
	return connect.NewResponse(&warrenv1.NodeResponse{Node: &warrenv1.Node{Id: req.Msg.GetId()}}), nil
}

// `nodes drain --deadline` goes in whole seconds, rounded up: 500ms was
// sent as 0, which the server takes for its default of an hour.
func TestDrainDeadlineRoundsUp(t *testing.T) {
	fake := &fakeDrains{}
	_, h := warrenv1connect.NewClusterServiceHandler(fake)
	srv := httptest.NewServer(h)
	defer srv.Close()
	for _, d := range []string{"500ms", "1s", "1.2s", "2m"} {
		var out, errb bytes.Buffer
		if err := run([]string{"nodes", "drain", "n1", "--deadline", d, "--server", srv.URL}, &out, &errb); err != nil {
			t.Fatalf("--deadline %s: %v", d, err)
		}
	}
	fake.mu.Lock()
	defer fake.mu.Unlock()
	if want := []int64{1, 1, 2, 120}; !slices.Equal(fake.secs, want) {
		t.Fatalf("deadline_seconds sent: %v, want %v", fake.secs, want)
	}
}

// fakeNodes is a fake ClusterService (not a warren server) whose drain
// leaves 2 tasks on a sim node and whose node list is others.
type fakeNodes struct {
	warrenv1connect.UnimplementedClusterServiceHandler
	others []*warrenv1.Node
}

func (f *fakeNodes) DrainNode(_ context.Context, req *connect.Request[warrenv1.DrainNodeRequest]) (*connect.Response[warrenv1.NodeResponse], error) {
	return connect.NewResponse(&warrenv1.NodeResponse{Node: &warrenv1.Node{Id: req.Msg.GetId(), Drivers: []string{"sim"},
		Status: warrenv1.NodeStatus_NODE_STATUS_DRAINING, TaskCount: 2}}), nil
}

func (f *fakeNodes) ListNodes(context.Context, *connect.Request[warrenv1.ListNodesRequest]) (*connect.Response[warrenv1.ListNodesResponse], error) {
	return connect.NewResponse(&warrenv1.ListNodesResponse{Nodes: append([]*warrenv1.Node{{Id: "n1", Drivers: []string{"sim"}}}, f.others...)}), nil
}

// drainSandboxes is a fake SandboxService (not a warren server) whose node
// n1 runs a sandbox of the sandbox API and a task's.
type drainSandboxes struct {
	warrenv1connect.UnimplementedSandboxServiceHandler
}

func (drainSandboxes) ListSandboxes(_ context.Context, req *connect.Request[warrenv1.ListSandboxesRequest]) (*connect.Response[warrenv1.ListSandboxesResponse], error) {
	if req.Msg.GetNodeId() != "n1" {
		return connect.NewResponse(&warrenv1.ListSandboxesResponse{}), nil
	}
	return connect.NewResponse(&warrenv1.ListSandboxesResponse{Sandboxes: []*warrenv1.Sandbox{
		{Id: "sb-0000000001-n1"}, {Id: "01J00000000000000000000000-e1", TaskId: "01J00000000000000000000000"}}}), nil
}

// A drain of a node that runs sandboxes made with the sandbox API warns
// that it does not move or end them (it said "0 tasks", and an operator
// who then stopped the node ended the users' sandboxes unwarned); a
// task's own sandbox is not counted, and a server without the list says
// nothing.
func TestDrainWarnsOfSandboxesItLeaves(t *testing.T) {
	for _, withList := range []bool{true, false} {
		mux := http.NewServeMux()
		mux.Handle(warrenv1connect.NewClusterServiceHandler(&fakeNodes{}))
		if withList {
			mux.Handle(warrenv1connect.NewSandboxServiceHandler(drainSandboxes{}))
		}
		srv := httptest.NewServer(mux)
		var out, errb bytes.Buffer
		err := run([]string{"nodes", "drain", "n1", "--server", srv.URL}, &out, &errb)
		srv.Close()
		if err != nil {
			t.Fatal(err)
		}
		want := "warning: node n1 runs 1 sandboxes made with the sandbox API (sb-0000000001-n1): a drain does not move or end them"
		if got := strings.Contains(errb.String(), want); got != withList {
			t.Errorf("with the list %v: warned %v: %q", withList, got, errb.String())
		}
	}
}

// Draining the only node of its driver warns that its tasks will wait
// pending: the drain reported success, and they waited with no word.
func TestDrainWarnsWhenNoOtherNodeCanTakeTheTasks(t *testing.T) {
	ready := warrenv1.NodeStatus_NODE_STATUS_READY
	for _, c := range []struct {
		name   string
		others []*warrenv1.Node
		warn   bool
	}{
		{"no other node", nil, true},
		{"another sim node, cordoned", []*warrenv1.Node{{Id: "n2", Drivers: []string{"sim"}, Status: ready}}, true},
		{"another node of another driver", []*warrenv1.Node{{Id: "n2", Drivers: []string{"microvm"}, Status: ready, Eligible: true}}, true},
		{"another sim node", []*warrenv1.Node{{Id: "n2", Drivers: []string{"sim"}, Status: ready, Eligible: true}}, false},
	} {
		// -o json warns too (on stderr; stdout stays the node's JSON).
		for _, output := range []string{"text", "json"} {
			_, h := warrenv1connect.NewClusterServiceHandler(&fakeNodes{others: c.others})
			srv := httptest.NewServer(h)
			var out, errb bytes.Buffer
			if err := run([]string{"nodes", "drain", "n1", "--server", srv.URL, "-o", output}, &out, &errb); err != nil {
				t.Fatalf("%s, -o %s: %v", c.name, output, err)
			}
			srv.Close()
			if got := strings.Contains(errb.String(), "warning: no other ready, eligible node runs sim: node n1's 2 tasks will wait pending"); got != c.warn {
				t.Errorf("%s, -o %s: warned %v, want %v: %q", c.name, output, got, c.warn, errb.String())
			}
			if output == "json" && !json.Valid(out.Bytes()) {
				t.Errorf("%s, -o json: stdout is not JSON: %q", c.name, out.String())
			}
		}
	}
}

// `warren nodes rm ID` against a real server. A ready node is refused,
// saying what to do; a down one is removed and leaves `nodes list`; -o
// json prints the record as it was removed; `remove` and `warren node
// rm` are the same verb; a second removal is not_found; and the id
// registers again as a new node, eligible although the old one was
// cordoned. (Before, rm was an unknown verb: nothing removed a node.)
func TestNodesRm(t *testing.T) {
	url := inProcessServer(t, func(c *scheduler.Config) {
		// A node without a session is down 2 TTLs after the leader is
		// ready: time enough for the refusal below, not long to wait.
		c.NodeTTL, c.NodeHeartbeat = 1500*time.Millisecond, 300*time.Millisecond
	})
	cc := warrenv1connect.NewClusterServiceClient(http.DefaultClient, url)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	register := func(id string) *warrenv1.Node {
		t.Helper()
		resp, err := cc.RegisterNode(ctx, connect.NewRequest(&warrenv1.RegisterNodeRequest{Node: &warrenv1.Node{
			Id: id, Drivers: []string{"sim"}, Capacity: &warrenv1.Resources{MilliCpu: 2000, MemoryBytes: 1 << 30}}}))
		if err != nil {
			t.Fatal(err)
		}
		return resp.Msg.GetNode()
	}
	warren := func(args ...string) (string, error) {
		var out, errb bytes.Buffer
		err := run(append(args, "--server", url), &out, &errb)
		return out.String(), err
	}
	for _, id := range []string{"n1", "n2", "n3"} {
		register(id)
	}
	if _, err := warren("nodes", "cordon", "n1"); err != nil {
		t.Fatal(err)
	}
	_, err := warren("nodes", "rm", "n1")
	if err == nil || !strings.Contains(err.Error(), "failed_precondition: node n1 is ready: only a down node can be removed; drain it and stop it first") {
		t.Fatalf("rm of a ready node: %v, want failed_precondition saying to drain and stop it", err)
	}

	deadline := time.Now().Add(15 * time.Second)
	for {
		out, err := warren("nodes", "list", "-o", "json")
		if err != nil {
			t.Fatal(err)
		}
		if strings.Count(out, `"status":"NODE_STATUS_DOWN"`) == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the nodes, which have no session, were not declared down: %s", out)
		}
		time.Sleep(50 * time.Millisecond)
	}

	out, err := warren("nodes", "rm", "n1")
	if err != nil || out != "node n1: removed (it was down); its id may register again as a new node\n" {
		t.Fatalf("rm n1: %q, %v", out, err)
	}
	out, err = warren("nodes", "remove", "n2", "-o", "json")
	var got struct{ ID, Status string }
	if err != nil || json.Unmarshal([]byte(out), &got) != nil || got.ID != "n2" || got.Status != "NODE_STATUS_DOWN" {
		t.Fatalf("remove n2 -o json: %q, %v; want n2's record, down", out, err)
	}
	if _, err := warren("node", "rm", "n3"); err != nil {
		t.Fatalf("warren node rm n3: %v", err)
	}
	if _, err := warren("nodes", "rm", "n1"); err == nil || !strings.Contains(err.Error(), `not_found: node "n1" not found`) {
		t.Fatalf("second rm of n1: %v, want not_found", err)
	}
	if out, err := warren("nodes", "list", "-o", "json"); err != nil || out != "" {
		t.Fatalf("nodes list after removing every node: %q, %v; want none", out, err)
	}
	if n := register("n1"); n.GetStatus() != warrenv1.NodeStatus_NODE_STATUS_READY || !n.GetEligible() {
		t.Fatalf("n1 registered again: %v, want a new node, ready and eligible", n)
	}
	var help bytes.Buffer
	if run([]string{"nodes"}, &help, &help); !strings.Contains(help.String(), "warren nodes cordon ID | uncordon ID | drain ID [--deadline DUR] | rm ID") {
		t.Fatalf("`warren nodes` usage does not name rm:\n%s", help.String())
	}
}
