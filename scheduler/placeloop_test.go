package scheduler

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/hashicorp/raft"

	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
	"github.com/warrenhq/warren/api/gen/warren/v1/warrenv1connect"
)

// Pending tasks that no node can take (here a selector no node matches)
// do not hold back the tasks created after them. Placement looked only at
// the first MaxStarting pending tasks, so when that many fit no node,
// every later task stayed pending for good although a node had room.
func TestUnfitTasksDoNotBlockPlacement(t *testing.T) {
	nodes := startCluster(t, 0, func(c *Config) { c.MaxStarting = 3 })
	ctx := context.Background()
	cc := warrenv1connect.NewClusterServiceClient(http.DefaultClient, nodes[1].url)
	if _, err := cc.RegisterNode(ctx, connect.NewRequest(&warrenv1.RegisterNodeRequest{Node: &warrenv1.Node{
		Id: "n1", Drivers: []string{"sim"}, Capacity: &warrenv1.Resources{MilliCpu: 100 * DefaultTaskMilliCPU, MemoryBytes: 100 * DefaultTaskMemoryBytes},
	}})); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ { // no node has gpu=yes
		if _, err := nodes[0].tasks.CreateTask(ctx, connect.NewRequest(&warrenv1.CreateTaskRequest{Spec: &warrenv1.TaskSpec{
			Repo: "https://example.com/r.git", Base: "main", IssueTitle: fmt.Sprint("gpu", i), Driver: "sim",
			NodeSelector: map[string]string{"gpu": "yes"}}})); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(5 * time.Millisecond) // a later ULID
	r, err := nodes[0].tasks.CreateTask(ctx, connect.NewRequest(&warrenv1.CreateTaskRequest{Spec: &warrenv1.TaskSpec{
		Repo: "https://example.com/r.git", Base: "main", IssueTitle: "plain", Driver: "sim"}}))
	if err != nil {
		t.Fatal(err)
	}
	id := r.Msg.GetTask().GetId()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		tk, err := nodes[0].srv.FSM().Task(id)
		if err == nil && tk.GetState() == warrenv1.TaskState_TASK_STATE_PLACED {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	tk, _ := nodes[0].srv.FSM().Task(id)
	t.Errorf("task %s that fits node n1 is still %s after 10 s, behind 3 tasks no node can take", id, StateName(tk.GetState()))
}

// Tasks waiting for room in one pool do not hold back the tasks of
// another pool with room. Placement looked at the oldest MaxStarting
// pending tasks only and widened its window only when none of them fit
// any node even empty; a full pool's backlog then kept every later task of
// an idle pool pending until the full pool had room again.
func TestABacklogInOnePoolDoesNotHoldBackAnother(t *testing.T) {
	nodes := startCluster(t, 0, func(c *Config) { c.MaxStarting = 4 })
	ctx := context.Background()
	cc := warrenv1connect.NewClusterServiceClient(http.DefaultClient, nodes[1].url)
	for _, n := range []struct {
		id, pool string
		tasks    int64
	}{{"n1", "a", 1}, {"n2", "b", 10}} {
		if _, err := cc.RegisterNode(ctx, connect.NewRequest(&warrenv1.RegisterNodeRequest{Node: &warrenv1.Node{
			Id: n.id, Drivers: []string{"sim"}, Labels: map[string]string{"pool": n.pool},
			Capacity: &warrenv1.Resources{MilliCpu: n.tasks * DefaultTaskMilliCPU, MemoryBytes: n.tasks * DefaultTaskMemoryBytes},
		}})); err != nil {
			t.Fatal(err)
		}
	}
	create := func(title, pool string) string {
		t.Helper()
		r, err := nodes[0].tasks.CreateTask(ctx, connect.NewRequest(&warrenv1.CreateTaskRequest{Spec: &warrenv1.TaskSpec{
			Repo: "https://example.com/r.git", Base: "main", IssueTitle: title, Driver: "sim",
			NodeSelector: map[string]string{"pool": pool}}}))
		if err != nil {
			t.Fatal(err)
		}
		return r.Msg.GetTask().GetId()
	}
	state := func(id string) warrenv1.TaskState {
		tk, err := nodes[0].srv.FSM().Task(id)
		if err != nil {
			return warrenv1.TaskState_TASK_STATE_UNSPECIFIED
		}
		return tk.GetState()
	}
	// Pool a has room for one: one of these is placed (and, with no
	// daemon to start it, stays placed), the rest wait for room.
	var backlog []string
	for i := range 5 {
		backlog = append(backlog, create(fmt.Sprint("a", i), "a"))
	}
	waitFor(t, "one task of pool a placed", 10*time.Second, func() bool {
		placed := 0
		for _, id := range backlog {
			if state(id) == warrenv1.TaskState_TASK_STATE_PLACED {
				placed++
			}
		}
		return placed == 1
	})
	time.Sleep(5 * time.Millisecond) // a later ULID
	id := create("b", "b")
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if state(id) == warrenv1.TaskState_TASK_STATE_PLACED {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Errorf("task %s of pool b is still %s after 10 s, behind pool a's backlog, with node n2 empty", id, StateName(state(id)))
}

// More pending tasks than a round reads (maxPendingPerRound, 20,000; 8
// here) that no node can take do not hold back a later task that fits:
// the next round reads the tasks after them. Rounds always began at the
// oldest, so one tenant's 20,000 tasks with an impossible selector kept
// every later task of the cluster pending.
func TestMoreUnfitTasksThanARoundReadsDoNotBlockPlacement(t *testing.T) {
	nodes := startCluster(t, 0, func(c *Config) { c.MaxStarting = 2; c.maxPendingPerRound = 8 })
	ctx := context.Background()
	cc := warrenv1connect.NewClusterServiceClient(http.DefaultClient, nodes[1].url)
	if _, err := cc.RegisterNode(ctx, connect.NewRequest(&warrenv1.RegisterNodeRequest{Node: &warrenv1.Node{
		Id: "n1", Drivers: []string{"sim"}, Capacity: &warrenv1.Resources{MilliCpu: 100 * DefaultTaskMilliCPU, MemoryBytes: 100 * DefaultTaskMemoryBytes},
	}})); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 20; i++ { // no node has gpu=yes: two and a half rounds' worth
		if _, err := nodes[0].tasks.CreateTask(ctx, connect.NewRequest(&warrenv1.CreateTaskRequest{Spec: &warrenv1.TaskSpec{
			Repo: "https://example.com/r.git", Base: "main", IssueTitle: fmt.Sprint("gpu", i), Driver: "sim",
			NodeSelector: map[string]string{"gpu": "yes"}}})); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(5 * time.Millisecond) // a later ULID
	r, err := nodes[0].tasks.CreateTask(ctx, connect.NewRequest(&warrenv1.CreateTaskRequest{Spec: &warrenv1.TaskSpec{
		Repo: "https://example.com/r.git", Base: "main", IssueTitle: "plain", Driver: "sim"}}))
	if err != nil {
		t.Fatal(err)
	}
	id := r.Msg.GetTask().GetId()
	waitFor(t, "the plain task placed behind 20 unfit ones", 10*time.Second, func() bool {
		tk, err := nodes[0].srv.FSM().Task(id)
		return err == nil && tk.GetState() == warrenv1.TaskState_TASK_STATE_PLACED
	})
}

// A leader places no task before it is ready (its barrier done): until
// then its FSM may lag (tasks placed in the last term but not yet applied
// here would not count against MaxStarting) and no node has reported its
// verification sandboxes to it.
func TestPlacementWaitsForTheLeaderToBeReady(t *testing.T) {
	n := startNode(t, t.TempDir(), "s1", true, "", 0)
	waitFor(t, "s1 to lead and be ready", 10*time.Second, func() bool {
		return n.srv.Raft().State() == raft.Leader && n.srv.readyTerm.Load() == n.srv.Raft().CurrentTerm()
	})
	term := n.srv.readyTerm.Load()
	n.srv.readyTerm.Store(0) // as while its barrier runs
	ctx := context.Background()
	cc := warrenv1connect.NewClusterServiceClient(http.DefaultClient, n.url)
	if _, err := cc.RegisterNode(ctx, connect.NewRequest(&warrenv1.RegisterNodeRequest{Node: &warrenv1.Node{
		Id: "n1", Drivers: []string{"sim"}, Capacity: &warrenv1.Resources{MilliCpu: 10 * DefaultTaskMilliCPU, MemoryBytes: 10 * DefaultTaskMemoryBytes},
	}})); err != nil {
		t.Fatal(err)
	}
	id := createTask(t, n, "t", "")
	time.Sleep(500 * time.Millisecond) // rounds run every 20 ms
	if tk, _ := n.srv.FSM().Task(id); tk.GetState() != warrenv1.TaskState_TASK_STATE_PENDING {
		t.Fatalf("before the leader was ready, the task became %s", StateName(tk.GetState()))
	}
	n.srv.readyTerm.Store(term)
	placedOn(t, n, id)
}
