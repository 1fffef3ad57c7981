package noded_test

import (
	"context"
	"encoding/json"
	"path/filepath"
	"testing"
	"time"

	"connectrpc.com/connect"

	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
	"github.com/warrenhq/warren/netpolicy"
	"github.com/warrenhq/warren/netpolicy/netpolicytest"
	"github.com/warrenhq/warren/noded"
	"github.com/warrenhq/warren/noded/driver"
	"github.com/warrenhq/warren/noded/driver/container"
)

// startEgressNode starts a one-server cluster and node "n1" whose sandboxes
// are real containers (namespace ns) on the node's egress policy, in the
// test's own network world (netpolicytest); tweak changes the policy's
// config.
func startEgressNode(t *testing.T, ns string, tweak func(*netpolicy.Config)) (*cluster, *noded.Daemon) {
	t.Helper()
	return startEgressNodeWith(t, ns, tweak, nil)
}

// startEgressNodeWith is startEgressNode with the node's driver wrap(the
// container driver) when wrap is set.
func startEgressNodeWith(t *testing.T, ns string, tweak func(*netpolicy.Config), wrap func(*container.Driver) driver.Driver) (*cluster, *noded.Daemon) {
	t.Helper()
	imageDir := needContainers(t)
	netpolicytest.NeedRoot(t)
	agent := buildGuest(t)

	tp := netpolicytest.New(t)
	cfg := tp.Config(1, nil)
	if tweak != nil {
		tweak(&cfg)
	}
	eg, err := noded.NewEgress(cfg)
	if err != nil {
		t.Fatal(err)
	}
	drv, err := container.New(container.Config{ImageDir: imageDir, StateDir: t.TempDir(), Namespace: ns, Agent: agent, Networks: eg})
	if err != nil {
		eg.Close()
		t.Fatal(err)
	}
	var nd driver.Driver = drv
	if wrap != nil {
		nd = wrap(drv)
	}
	c := startCluster(t, 1, 0)
	d, err := noded.Start(noded.Config{ID: "n1", DataDir: filepath.Join(c.dir, "node-n1"), Servers: c.urls(), Driver: nd, Egress: eg,
		Capacity: &warrenv1.Resources{MilliCpu: 100 * 1000, MemoryBytes: 1 << 40}})
	if err != nil {
		drv.Close()
		eg.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	waitFor(t, "node ready", 10*time.Second, func() bool {
		n, err := c.node("n1")
		return err == nil && n.GetStatus() == warrenv1.NodeStatus_NODE_STATUS_READY
	})
	return c, d
}

// A task's sandbox attempts reach its log as egress events, allowed and
// denied, before the task ends (issue 6, acceptance 3). The sandbox is a
// real container on the node's egress policy, in the test's own network
// world (netpolicytest).
func TestTaskEgressEvents(t *testing.T) {
	c, _ := startEgressNode(t, "warren-test-egress", nil)

	// Each step connects to the allowed web host by name and to a host
	// it may not reach.
	cmd := `python3 -c '
import socket
for target in (("allowed.test", 80), ("198.51.100.20", 80)):
    try:
        socket.create_connection(target, timeout=3).close(); print(target[0], "ok")
    except Exception as e:
        print(target[0], type(e).__name__)
'`
	resp, err := c.cl.Tasks().CreateTask(context.Background(), connect.NewRequest(&warrenv1.CreateTaskRequest{
		RequestId: "egress-1", Spec: &warrenv1.TaskSpec{Repo: "https://example.com/r.git", Base: "main", IssueTitle: "egress audit",
			Driver: "container", Script: &warrenv1.Script{Steps: 2, Command: cmd}}}))
	if err != nil {
		t.Fatal(err)
	}
	id := resp.Msg.GetTask().GetId()
	waitFor(t, "the task to succeed", 2*time.Minute, c.allEnded([]string{id}))

	var allowed, denied bool
	var results []string
	for _, e := range c.events(id) {
		switch e.GetKind() {
		case "tool_result":
			var p struct{ Output string }
			json.Unmarshal(e.GetPayload(), &p)
			results = append(results, p.Output)
		case "egress":
			_, a, d := webAttempts(t, e)
			allowed, denied = allowed || a, denied || d
		}
	}
	t.Logf("step outputs: %q", results)
	if !allowed || !denied {
		t.Fatalf("egress events: allowed %v, denied %v; want both on the task's log", allowed, denied)
	}
}

// A task that stops before it ends (cancelled, or given back by a drain)
// still records what its sandbox's egress audit holds, before its last
// event: the sandbox goes with the actor. The audit's periodic report is
// made too rare to run here, so only that flush can record them.
func TestTaskEgressRecordedWhenItStops(t *testing.T) {
	// The audit's periodic report never comes during the test.
	c, d := startEgressNode(t, "warren-test-egress-stop", func(cfg *netpolicy.Config) { cfg.AuditInterval = time.Hour })
	ctx := context.Background()
	// logged lists a task's log as it is now (the task need not have
	// ended, as c.events needs).
	logged := func(id string) []*warrenv1.Event {
		var out []*warrenv1.Event
		for {
			resp, err := c.cl.Tasks().ListEvents(ctx, connect.NewRequest(&warrenv1.ListEventsRequest{TaskId: id, AfterSeq: uint64(len(out)), Limit: 1000}))
			if err != nil {
				t.Fatal(err)
			}
			if len(resp.Msg.GetEvents()) == 0 {
				return out
			}
			out = append(out, resp.Msg.GetEvents()...)
		}
	}
	// Every step tries a host it may not reach, then waits a little.
	cmd := `python3 -c '
import socket
try:
    socket.create_connection(("198.51.100.20", 80), timeout=1).close()
except Exception:
    pass
'; sleep 1`
	start := func(reqID string) string {
		resp, err := c.cl.Tasks().CreateTask(ctx, connect.NewRequest(&warrenv1.CreateTaskRequest{
			RequestId: reqID, Spec: &warrenv1.TaskSpec{Repo: "https://example.com/r.git", Base: "main", IssueTitle: "egress when stopped",
				Driver: "container", Script: &warrenv1.Script{Steps: 100, Command: cmd}}}))
		if err != nil {
			t.Fatal(err)
		}
		id := resp.Msg.GetTask().GetId()
		waitFor(t, "a step's result", time.Minute, func() bool {
			for _, e := range logged(id) {
				if e.GetKind() == "tool_result" {
					return true
				}
			}
			return false
		})
		return id
	}
	// denied reports whether the log has the denied attempt before its
	// state_changed to want.
	denied := func(id, want string) bool {
		seen := false
		for _, e := range logged(id) {
			switch e.GetKind() {
			case "egress":
				var p struct {
					Events []struct{ Verdict, Addr string }
				}
				if err := json.Unmarshal(e.GetPayload(), &p); err != nil {
					t.Fatal(err)
				}
				for _, ev := range p.Events {
					seen = seen || ev.Verdict == "deny" && ev.Addr == netpolicytest.Other.String()
				}
			case "state_changed":
				var p struct{ To string }
				json.Unmarshal(e.GetPayload(), &p)
				if p.To == want {
					return seen
				}
			}
		}
		t.Fatalf("task %s: no state_changed to %s", id, want)
		return false
	}

	cancelled := start("egress-stop-cancel")
	if _, err := c.cl.Tasks().CancelTask(ctx, connect.NewRequest(&warrenv1.CancelTaskRequest{TaskId: cancelled, Reason: "test"})); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the task to be cancelled", time.Minute, func() bool {
		return c.task(cancelled).GetState() == warrenv1.TaskState_TASK_STATE_CANCELLED
	})
	if !denied(cancelled, "cancelled") {
		t.Error("cancelled task: its denied attempts are not on its log")
	}

	yielded := start("egress-stop-drain")
	if _, err := c.cl.Cluster().DrainNode(ctx, connect.NewRequest(&warrenv1.DrainNodeRequest{Id: "n1"})); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the task to be given back", time.Minute, func() bool { return d.Stats().Yielded == 1 })
	if !denied(yielded, "pending") {
		t.Error("task given back: its denied attempts are not on its log")
	}
}

// webAttempts reads an egress event: the sandbox it names, and whether it
// holds an allowed connection to the test's web host and a denied one to
// its other host (netpolicytest), both TCP port 80.
func webAttempts(t *testing.T, e *warrenv1.Event) (sandbox string, allowed, denied bool) {
	t.Helper()
	var p struct {
		Sandbox string
		Events  []struct {
			Verdict, Kind, Addr, Proto string
			Port                       int
		}
	}
	if err := json.Unmarshal(e.GetPayload(), &p); err != nil {
		t.Fatal(err)
	}
	for _, ev := range p.Events {
		if ev.Kind == "connect" && ev.Proto == "tcp" && ev.Port == 80 {
			allowed = allowed || ev.Verdict == "allow" && ev.Addr == netpolicytest.Web.String()
			denied = denied || ev.Verdict == "deny" && ev.Addr == netpolicytest.Other.String()
		}
	}
	return p.Sandbox, allowed, denied
}

// A step during which the sandbox's audit reports more often than the
// actor's mailbox holds messages (16) still ends, and the task goes on:
// each report used to queue a message of its own, so a step that tried a
// denied host for a while (a test suite retrying a download) filled the
// mailbox, the step's own "next step" message was dropped, and the task
// stayed running for good, with nothing left to wake its actor.
func TestManyEgressReportsDuringAStepDoNotStallTheTask(t *testing.T) {
	c, d := startEgressNode(t, "warren-test-egress-many", func(cfg *netpolicy.Config) { cfg.AuditInterval = 20 * time.Millisecond })
	// About 3 s of denied attempts, one every 50 ms: some 100 reports.
	cmd := `python3 -c '
import socket, time
for _ in range(60):
    try:
        socket.create_connection(("198.51.100.20", 80), timeout=0.05).close()
    except Exception:
        pass
    time.sleep(0.05)
'`
	resp, err := c.cl.Tasks().CreateTask(context.Background(), connect.NewRequest(&warrenv1.CreateTaskRequest{
		RequestId: "egress-many", Spec: &warrenv1.TaskSpec{Repo: "https://example.com/r.git", Base: "main", IssueTitle: "many egress reports",
			Driver: "container", Script: &warrenv1.Script{Steps: 2, Command: cmd}}}))
	if err != nil {
		t.Fatal(err)
	}
	id := resp.Msg.GetTask().GetId()
	waitFor(t, "the task to end", 2*time.Minute, c.allEnded([]string{id}))
	if st := c.task(id).GetState(); st != warrenv1.TaskState_TASK_STATE_SUCCEEDED {
		t.Fatalf("task %s ended %v, want succeeded", id, st)
	}
	reports := 0
	for _, e := range c.events(id) {
		if e.GetKind() == "egress" {
			reports++
		}
	}
	t.Logf("%d egress events on the log; node: %+v", reports, d.Stats())
	if reports <= 16 {
		t.Errorf("%d egress events: the test needs more reports during a step than the actor's mailbox holds (16)", reports)
	}
}
