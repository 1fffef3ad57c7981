package noded_test

import (
	"context"
	"encoding/json"
	"path/filepath"
	"testing"
	"time"

	"connectrpc.com/connect"

	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
	"github.com/warrenhq/warren/netpolicy/netpolicytest"
	"github.com/warrenhq/warren/noded"
	"github.com/warrenhq/warren/noded/driver/container"
)

// A task's sandbox attempts reach its log as egress events, allowed and
// denied, before the task ends (issue 6, acceptance 3). The sandbox is a
// real container on the node's egress policy, in the test's own network
// world (netpolicytest).
func TestTaskEgressEvents(t *testing.T) {
	imageDir := needContainers(t)
	netpolicytest.NeedRoot(t)
	agent := buildGuest(t)

	tp := netpolicytest.New(t)
	eg, err := noded.NewEgress(tp.Config(1, nil))
	if err != nil {
		t.Fatal(err)
	}
	drv, err := container.New(container.Config{ImageDir: imageDir, StateDir: t.TempDir(), Namespace: "warren-test-egress", Agent: agent, Networks: eg})
	if err != nil {
		eg.Close()
		t.Fatal(err)
	}
	c := startCluster(t, 1, 0)
	d, err := noded.Start(noded.Config{ID: "n1", DataDir: filepath.Join(c.dir, "node-n1"), Servers: c.urls(), Driver: drv, Egress: eg,
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
		}
	}
	t.Logf("step outputs: %q", results)
	if !allowed || !denied {
		t.Fatalf("egress events: allowed %v, denied %v; want both on the task's log", allowed, denied)
	}
}
