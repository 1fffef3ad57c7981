package main

import (
	"bytes"
	"context"
	"net/http/httptest"
	"slices"
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
