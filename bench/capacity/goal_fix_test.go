package capacity

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
	"github.com/warrenhq/warren/bench/internal/cluster"
)

// The appends goal counts failed and timed-out appends: the latency
// histogram holds only the ones that succeeded.
func TestAppendsGoalNeedsNoFailedAppend(t *testing.T) {
	for _, tc := range []struct {
		name   string
		errors uint64
		met    bool
	}{
		{"none failed", 0, true},
		{"one failed", 1, false},
		{"a fifth failed", 50000, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &run{o: Options{Tasks: 100}, cl: &cluster.Cluster{}, peakRSS: map[string]int64{},
				rep: &Report{Steady: Window{Seconds: 10, Events: 250000, EventsPerSec: 25000, Appends: 200000, AppendsPerSec: 20000,
					P50Ms: 5, P99Ms: 50, Errors: tc.errors}}}
			r.finish()
			for _, g := range r.rep.Goals {
				if g.Name != "appends" {
					continue
				}
				if g.Met != tc.met {
					t.Fatalf("appends goal met=%v (%q) with %d failed appends, want %v", g.Met, g.Measured, tc.errors, tc.met)
				}
				if !strings.Contains(g.Measured, "failed") {
					t.Fatalf("measured %q does not show the failed appends", g.Measured)
				}
				return
			}
			t.Fatal("no appends goal")
		})
	}
}

func TestFalseDownsCountsNodesDownAndRegisteredAgain(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	killed := t0.Add(time.Minute)
	at := func(d time.Duration) *timestamppb.Timestamp { return timestamppb.New(t0.Add(d)) }
	node := func(id string, st warrenv1.NodeStatus, changed *timestamppb.Timestamp, reason string) *warrenv1.Node {
		return &warrenv1.Node{Id: id, Status: st, StatusChangedAt: changed, StatusReason: reason}
	}
	ready, down := warrenv1.NodeStatus_NODE_STATUS_READY, warrenv1.NodeStatus_NODE_STATUS_DOWN
	before := []*warrenv1.Node{
		node("steady", ready, at(0), ""),
		node("flapped", ready, at(0), ""),
		node("still-down", ready, at(0), ""),
		node("was-down", down, at(10*time.Second), "no heartbeat for 5s"),
		node("drained", ready, at(0), ""),
		node("changed-before-kill", ready, at(0), ""),
	}
	after := []*warrenv1.Node{
		node("steady", ready, at(0), ""),
		// Declared down 2 s after the kill and registered again a second later:
		// READY once more by the time the bench looks.
		node("flapped", ready, at(time.Minute+3*time.Second), "registered again"),
		node("still-down", down, at(time.Minute+2*time.Second), "gossip: dead"),
		node("was-down", ready, at(time.Minute+time.Second), "registered again"),
		node("drained", warrenv1.NodeStatus_NODE_STATUS_DRAINING, at(time.Minute+time.Second), "operator"),
		node("changed-before-kill", ready, at(30*time.Second), "registered again"),
		node("new", ready, at(time.Minute+time.Second), ""),
	}
	if got := falseDowns(before, after, killed); got != 2 {
		t.Fatalf("falseDowns = %d, want 2 (flapped and still-down)", got)
	}
}
