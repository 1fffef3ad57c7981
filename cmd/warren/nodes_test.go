package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	"connectrpc.com/connect"

	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
	"github.com/warrenhq/warren/api/gen/warren/v1/warrenv1connect"
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
