package scheduler

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"connectrpc.com/connect"

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
