package noded

import (
	"context"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
	"github.com/warrenhq/warren/internal/freeaddr"
	"github.com/warrenhq/warren/netpolicy"
	"github.com/warrenhq/warren/noded/driver/sim"
	"github.com/warrenhq/warren/scheduler"
)

// A task's sandbox went away (sandboxGone) while egress batches were still
// queued: its own audit's and a verification sandbox's. The actor has no
// sandbox until the next claim; when the task ends first (a cancel read
// before the claim, or a claim refused for good), the batches still land
// before its last event (docs/egress.md: every attempt is on the log
// before the task's last event), each naming its sandbox.
func TestQueuedEgressIsRecordedWhenTheSandboxIsGone(t *testing.T) {
	dir := t.TempDir()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + ln.Addr().String()
	srv, err := scheduler.Open(scheduler.Config{ID: "s1", DataDir: filepath.Join(dir, "s1"), RaftAddr: freeaddr.Loopback(t), APIURL: url,
		Bootstrap: true, SnapshotInterval: time.Hour, RaftLevel: "error", RaftLogTo: io.Discard})
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: srv.Handler()}
	hs.Protocols = new(http.Protocols)
	hs.Protocols.SetHTTP1(true)
	hs.Protocols.SetUnencryptedHTTP2(true)
	go hs.Serve(ln)
	t.Cleanup(func() { srv.Close(); hs.Close() })
	deadline := time.Now().Add(10 * time.Second)
	for srv.Raft().State().String() != "Leader" {
		if time.Now().After(deadline) {
			t.Fatal("no leader")
		}
		time.Sleep(20 * time.Millisecond)
	}
	d, err := Start(Config{ID: "n1", DataDir: filepath.Join(dir, "n1"), Servers: []string{url}, Driver: sim.New(sim.Config{}),
		Capacity: &warrenv1.Resources{MilliCpu: 1000, MemoryBytes: 1 << 30}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	ctx := context.Background()
	var id string
	for {
		resp, err := d.cl.Tasks().CreateTask(ctx, connect.NewRequest(&warrenv1.CreateTaskRequest{RequestId: "egress-no-sandbox",
			Spec: &warrenv1.TaskSpec{Repo: "https://example.com/r.git", Base: "main", IssueTitle: "egress", Driver: "microvm",
				Script: &warrenv1.Script{Steps: 1}}}))
		if err == nil {
			id = resp.Msg.GetTask().GetId()
			break
		}
		if time.Now().After(deadline) {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	batch := func(addr string) netpolicy.AuditBatch {
		return netpolicy.AuditBatch{Events: []netpolicy.AuditEvent{{Verdict: "deny", Kind: "connect", Addr: addr, Proto: "tcp", Port: 443, Count: 1}}}
	}
	// After sandboxGone: Stopped set a.sb to nil; the gone sandbox's
	// batch and a verification sandbox's are still queued.
	a := &taskActor{d: d, id: id, epoch: 0, ctx: ctx, sb: nil}
	a.egressQ = []egressBatch{{b: batch("198.51.100.1"), sandbox: id + "-e0"}, {b: batch("198.51.100.2"), sandbox: id + "-e0-verify-0"}}
	if err := a.flushBeforeLast(); err != nil {
		t.Fatal(err)
	}
	// What stopAtBoundary appends next: the task's last event.
	if _, err := a.append(ctx, "cancelled", ev("state_changed", map[string]any{"to": "cancelled", "reason": "cancel requested"})); err != nil {
		t.Fatal(err)
	}
	resp, err := d.cl.Tasks().ListEvents(ctx, connect.NewRequest(&warrenv1.ListEventsRequest{TaskId: id, Limit: 100}))
	if err != nil {
		t.Fatal(err)
	}
	var egress []string
	for _, e := range resp.Msg.GetEvents() {
		if e.GetKind() == "egress" {
			egress = append(egress, string(e.GetPayload()))
		}
	}
	if len(egress) != 2 {
		t.Errorf("flushBeforeLast returned nil (lastFlushed %v) and the task's last event went on the log with %d of its 2 queued egress batches (%d still queued, %d pending): %s",
			a.lastFlushed, len(egress), len(a.egressQ), len(a.egressPending), strings.Join(egress, "; "))
	}
}
