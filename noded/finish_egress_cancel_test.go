package noded_test

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
	"github.com/warrenhq/warren/netpolicy/netpolicytest"
	"github.com/warrenhq/warren/noded"
	"github.com/warrenhq/warren/noded/driver"
	"github.com/warrenhq/warren/noded/driver/container"
)

// The verification sandbox's egress audit reaches the task's log however
// the test run ends, not only when it returns a result: the test code is
// the model's, and a cancel (or a Run error) once dropped its attempts.
// docs/egress.md: every attempt the task made is on its log before it
// ends. Here the test command connects to an allowed and a denied host,
// then hangs; the task is cancelled.
func TestFinishCancelKeepsTheVerificationSandboxsEgress(t *testing.T) {
	imageDir := needContainers(t)
	netpolicytest.NeedRoot(t)
	agentBin := buildGuest(t)
	tp := netpolicytest.New(t)
	eg, err := noded.NewEgress(tp.Config(1, nil))
	if err != nil {
		t.Fatal(err)
	}
	cdrv, err := container.New(container.Config{ImageDir: imageDir, StateDir: t.TempDir(), Namespace: "warren-test-verify-egress-cancel", Agent: agentBin, Networks: eg})
	if err != nil {
		eg.Close()
		t.Fatal(err)
	}
	drv := &claimLog{Driver: cdrv}
	c := startCluster(t, 1, 0)
	d, err := noded.Start(noded.Config{ID: "n1", DataDir: filepath.Join(c.dir, "node-n1"), Servers: c.urls(), Driver: drv, Egress: eg,
		Capacity: &warrenv1.Resources{MilliCpu: 100 * 1000, MemoryBytes: 1 << 40}})
	if err != nil {
		cdrv.Close()
		eg.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	waitFor(t, "node ready", 10*time.Second, func() bool {
		n, err := c.node("n1")
		return err == nil && n.GetStatus() == warrenv1.NodeStatus_NODE_STATUS_READY
	})

	repo := buggyRepo(t)
	script := strings.Join([]string{
		`{"content":[{"type":"tool_use","name":"edit_file","input":{"path":"calc/calc.go","old_string":"return a - b","new_string":"return a + b"}}]}`,
		`{"content":[{"type":"tool_use","name":"finish","input":{"summary":"Add adds now."}}]}`,
	}, "\n")
	probe := `python3 -c '
import socket
for target in (("allowed.test", 80), ("198.51.100.20", 80)):
    try:
        socket.create_connection(target, timeout=3).close(); print(target[0], "ok")
    except Exception as e:
        print(target[0], type(e).__name__)
' ; touch /tmp/probed; sleep 600`
	ctx := context.Background()
	resp, err := c.cl.Tasks().CreateTask(ctx, connect.NewRequest(&warrenv1.CreateTaskRequest{
		RequestId: "verify-egress-cancel", Spec: &warrenv1.TaskSpec{Repo: repo, Base: "HEAD", IssueTitle: "Add is wrong",
			TestCommand: probe, Driver: "container", Model: "scripted", ModelScript: script}}))
	if err != nil {
		t.Fatal(err)
	}
	id := resp.Msg.GetTask().GetId()
	waitFor(t, "the test command to have made its connection attempts", 3*time.Minute, func() bool {
		ids := drv.verifyClaims()
		if len(ids) == 0 {
			return false
		}
		sb, ok := drv.Get(ids[0])
		if !ok {
			return false
		}
		var b strings.Builder
		_, err := sb.(driver.Interactive).ReadFile(ctx, "/tmp/probed", 10, &b)
		return err == nil
	})
	if _, err := c.cl.Tasks().CancelTask(ctx, connect.NewRequest(&warrenv1.CancelTaskRequest{TaskId: id, Reason: "test cancel"})); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the task to be cancelled", time.Minute, func() bool {
		return c.task(id).GetState() == warrenv1.TaskState_TASK_STATE_CANCELLED
	})
	var allowed, denied bool
	for _, e := range c.events(id) {
		if e.GetKind() != "egress" {
			continue
		}
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
		if !strings.Contains(p.Sandbox, "-verify-") {
			continue
		}
		for _, ev := range p.Events {
			if ev.Kind == "connect" && ev.Proto == "tcp" && ev.Port == 80 {
				allowed = allowed || ev.Verdict == "allow" && ev.Addr == netpolicytest.Web.String()
				denied = denied || ev.Verdict == "deny" && ev.Addr == netpolicytest.Other.String()
			}
		}
	}
	if !allowed || !denied {
		t.Fatalf("the task ended cancelled without the verification sandbox's egress attempts on its log (allowed seen %v, denied seen %v): "+
			"the test command's network attempts were audited, then dropped", allowed, denied)
	}
}
