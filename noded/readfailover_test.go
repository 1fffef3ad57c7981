package noded_test

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"

	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
	"github.com/warrenhq/warren/noded"
	"github.com/warrenhq/warren/noded/driver/sim"
)

// A node's reads move off a server that stopped. Its appends follow the
// leader (a follower names it), so nothing else moved the node off the
// follower it started with: when that follower stopped, every read failed
// against it, and tasks re-placed on the node with resume set stayed
// placed for as long as it was gone (a review found it; its test saw 4 of
// 4 resumed tasks still placed after 30 s).
func TestANodesReadsMoveOffAStoppedServer(t *testing.T) {
	c := startCluster(t, 3, time.Second)
	s1, s2, s3 := c.servers[0], c.servers[1], c.servers[2]
	a := c.startNodeWith("a", sim.New(sim.Config{}), func(cfg *noded.Config) {
		cfg.Servers = []string{s2.url, s1.url, s3.url} // a follower first
	})
	// One task on a, so that its appends learn the leader through s2.
	ctx := context.Background()
	first, err := c.cl.Tasks().CreateTask(ctx, connect.NewRequest(&warrenv1.CreateTaskRequest{
		RequestId: "first", Spec: &warrenv1.TaskSpec{Repo: "https://example.com/r.git", Base: "main",
			IssueTitle: "first", Driver: "sim", Script: &warrenv1.Script{Steps: 3, StepMillis: 10}}}))
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the first task to succeed", 30*time.Second, c.allEnded([]string{first.Msg.GetTask().GetId()}))
	s2.srv.Close()
	s2.hs.Close()

	if _, err := c.cl.Cluster().CordonNode(ctx, connect.NewRequest(&warrenv1.NodeRequest{Id: "a"})); err != nil {
		t.Fatal(err)
	}
	b := c.startNode("b", 0)
	ids := c.submit(4, &warrenv1.Script{Steps: 30, StepMillis: 50})
	waitFor(t, "tasks running on b", 20*time.Second, func() bool { return b.Running() == 4 })
	waitFor(t, "a few steps done", 20*time.Second, func() bool { return c.task(ids[0]).GetNextSeq() > 8 })
	if _, err := c.cl.Cluster().UncordonNode(ctx, connect.NewRequest(&warrenv1.NodeRequest{Id: "a"})); err != nil {
		t.Fatal(err)
	}
	b.Partition(true)
	waitFor(t, "b's tasks resumed on a", 20*time.Second, func() bool { return a.Running() == 4 })
	waitFor(t, "all tasks to succeed on a", 60*time.Second, c.allEnded(ids))
	for _, id := range ids {
		if nodes := checkLog(t, id, c.events(id), 30); !nodes["a"] {
			t.Fatalf("task %s: no effect recorded by a: %v", id, nodes)
		}
	}
}
