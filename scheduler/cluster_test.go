package scheduler

import (
	"context"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/cockroachdb/pebble/v2"
	"github.com/hashicorp/raft"
	"github.com/oklog/ulid/v2"
	"go.uber.org/goleak"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	fsmv1 "github.com/warrenhq/warren/api/gen/warren/fsm/v1"
	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
	"github.com/warrenhq/warren/api/gen/warren/v1/warrenv1connect"
	"github.com/warrenhq/warren/internal/freeaddr"
)

// node is one in-process server with its HTTP listener.
type node struct {
	srv   *Server
	http  *http.Server
	url   string
	tasks warrenv1connect.TaskServiceClient
}

func startNode(t *testing.T, dir, id string, bootstrap bool, join string, trailing uint64, tweak ...func(*Config)) *node {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + ln.Addr().String()
	cfg := Config{
		ID: id, DataDir: filepath.Join(dir, id), RaftAddr: freeaddr.Loopback(t), APIURL: url,
		Bootstrap: bootstrap, JoinURL: join, TrailingLogs: trailing, SnapshotThreshold: 1 << 30,
		SnapshotInterval: time.Hour, RaftLevel: "error",
	}
	for _, f := range tweak {
		f(&cfg)
	}
	srv, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: srv.Handler()}
	go hs.Serve(ln)
	n := &node{srv: srv, http: hs, url: url, tasks: warrenv1connect.NewTaskServiceClient(http.DefaultClient, url)}
	t.Cleanup(n.stop)
	return n
}

func (n *node) stop() {
	n.srv.Close()
	n.http.Close()
}

func waitFor(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func leaderOf(nodes []*node) *node {
	for _, n := range nodes {
		if n.srv.Raft().State() == raft.Leader {
			return n
		}
	}
	return nil
}

func startCluster(t *testing.T, trailing uint64, tweak ...func(*Config)) []*node {
	dir := t.TempDir()
	a := startNode(t, dir, "s1", true, "", trailing, tweak...)
	waitFor(t, "s1 to lead", 10*time.Second, func() bool { return leaderOf([]*node{a}) != nil })
	b := startNode(t, dir, "s2", false, a.url, trailing, tweak...)
	c := startNode(t, dir, "s3", false, a.url, trailing, tweak...)
	nodes := []*node{a, b, c}
	waitFor(t, "3 voters", 15*time.Second, func() bool { return len(a.srv.Status().GetPeers()) == 3 })
	return nodes
}

// followerOf returns a server that is not the leader.
func followerOf(nodes []*node) *node {
	var follower *node
	for _, n := range nodes {
		if n.srv.Raft().State() != raft.Leader {
			follower = n
		}
	}
	return follower
}

func createVia(t *testing.T, n *node, i int) *warrenv1.Task {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := n.tasks.CreateTask(ctx, connect.NewRequest(&warrenv1.CreateTaskRequest{
		RequestId: fmt.Sprintf("create-%d", i), Spec: testSpec(),
	}))
	if err != nil {
		t.Fatalf("create via %s: %v", n.srv.ID(), err)
	}
	return resp.Msg.GetTask()
}

func TestClusterForwardsWritesAndReadsLocally(t *testing.T) {
	nodes := startCluster(t, 0)
	follower := followerOf(nodes)
	task := createVia(t, follower, 1)
	// Read-your-writes on the follower that forwarded the create.
	if _, err := follower.srv.FSM().Task(task.GetId()); err != nil {
		t.Fatalf("follower cannot read its own write: %v", err)
	}
	ctx := context.Background()
	if _, err := follower.tasks.SendMessage(ctx, connect.NewRequest(&warrenv1.SendMessageRequest{TaskId: task.GetId(), Text: "hi"})); err != nil {
		t.Fatal(err)
	}
	// A bad request gets invalid_argument naming the field, on any server.
	_, err := follower.tasks.SendMessage(ctx, connect.NewRequest(&warrenv1.SendMessageRequest{TaskId: task.GetId()}))
	if connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("empty text: %v", err)
	}
	_, err = follower.tasks.GetTask(ctx, connect.NewRequest(&warrenv1.GetTaskRequest{Id: "01J00000000000000000000000"}))
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("missing task: %v", err)
	}
	// The same request id on another server returns the same task.
	again := createVia(t, nodes[0], 1)
	if again.GetId() != task.GetId() {
		t.Fatalf("idempotent create made %s, want %s", again.GetId(), task.GetId())
	}
}

func TestLeaderLossKeepsAcknowledgedWrites(t *testing.T) {
	nodes := startCluster(t, 0)
	task := createVia(t, nodes[1], 1)
	ctx := context.Background()
	for i := 0; i < 20; i++ {
		if _, err := nodes[i%3].tasks.SendMessage(ctx, connect.NewRequest(&warrenv1.SendMessageRequest{TaskId: task.GetId(), Text: fmt.Sprint(i), RequestId: fmt.Sprint("m", i)})); err != nil {
			t.Fatal(err)
		}
	}
	old := leaderOf(nodes)
	old.stop()
	var rest []*node
	for _, n := range nodes {
		if n != old {
			rest = append(rest, n)
		}
	}
	waitFor(t, "a new leader", 10*time.Second, func() bool { return leaderOf(rest) != nil })
	for i := 20; i < 30; i++ {
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := rest[i%2].tasks.SendMessage(wctx, connect.NewRequest(&warrenv1.SendMessageRequest{TaskId: task.GetId(), Text: fmt.Sprint(i), RequestId: fmt.Sprint("m", i)}))
		cancel()
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range rest {
		waitFor(t, "replication", 5*time.Second, func() bool {
			tk, err := n.srv.FSM().Task(task.GetId())
			return err == nil && tk.GetNextSeq() == 32
		})
		evs, _ := n.srv.FSM().Events(task.GetId(), 0, 100)
		for i, ev := range evs {
			if ev.GetSeq() != uint64(i+1) {
				t.Fatalf("%s: event %d has seq %d", n.srv.ID(), i, ev.GetSeq())
			}
		}
	}
}

func TestLateFollowerGetsSnapshot(t *testing.T) {
	nodes := startCluster(t, 8) // keep only 8 entries after a snapshot
	var ids []string
	for i := 0; i < 40; i++ {
		ids = append(ids, createVia(t, nodes[i%3], i).GetId())
	}
	ctx := context.Background()
	// Events beyond each task's first, written through every server.
	for i, id := range ids {
		for j := 0; j < 3; j++ {
			if _, err := nodes[(i+j)%3].tasks.SendMessage(ctx, connect.NewRequest(&warrenv1.SendMessageRequest{TaskId: id, Text: fmt.Sprint("m", i, "-", j)})); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, n := range nodes {
		if err := n.srv.Raft().Snapshot().Error(); err != nil {
			t.Fatalf("snapshot on %s: %v", n.srv.ID(), err)
		}
	}
	leader := leaderOf(nodes)
	first, err := leader.srv.store.FirstIndex()
	if err != nil || first <= 1 {
		t.Fatalf("leader log not compacted: first index %d, %v", first, err)
	}
	late := startNode(t, t.TempDir(), "s4", false, nodes[2].url, 8)
	waitFor(t, "s4 to catch up", 20*time.Second, func() bool {
		return late.srv.FSM().Applied() >= leader.srv.FSM().Applied()
	})
	if idx := late.srv.Raft().Stats()["last_snapshot_index"]; idx == "0" {
		t.Fatal("s4 caught up without installing a snapshot")
	}
	for _, id := range ids {
		want, _ := leader.srv.FSM().Task(id)
		got, err := late.tasks.GetTask(ctx, connect.NewRequest(&warrenv1.GetTaskRequest{Id: id}))
		if err != nil || !proto.Equal(want, got.Msg.GetTask()) {
			t.Fatalf("s4 serves a different task %s: %v", id, err)
		}
		// Its events too, each one as the leader has it.
		wantEv, err1 := leader.srv.FSM().Events(id, 0, 1000)
		gotEv, err2 := late.srv.FSM().Events(id, 0, 1000)
		if err1 != nil || err2 != nil || len(wantEv) != 4 || len(gotEv) != len(wantEv) {
			t.Fatalf("task %s: leader has %d events (%v), s4 %d (%v); want 4 each", id, len(wantEv), err1, len(gotEv), err2)
		}
		for i := range wantEv {
			if !proto.Equal(wantEv[i], gotEv[i]) {
				t.Fatalf("task %s event %d: s4 has %v, the leader %v", id, i+1, gotEv[i], wantEv[i])
			}
		}
	}
	want, err := leader.tasks.ListTasks(ctx, connect.NewRequest(&warrenv1.ListTasksRequest{PageSize: 1000}))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := late.tasks.ListTasks(ctx, connect.NewRequest(&warrenv1.ListTasksRequest{PageSize: 1000}))
	if err != nil || len(resp.Msg.GetTasks()) != len(ids) || len(want.Msg.GetTasks()) != len(ids) {
		t.Fatalf("s4 lists %d tasks, the leader %d, want %d (%v)", len(resp.Msg.GetTasks()), len(want.Msg.GetTasks()), len(ids), err)
	}
	for i := range ids {
		if !proto.Equal(resp.Msg.GetTasks()[i], want.Msg.GetTasks()[i]) {
			t.Fatalf("s4 lists task %d as %v, the leader as %v", i, resp.Msg.GetTasks()[i], want.Msg.GetTasks()[i])
		}
	}
	// And it keeps up with new writes.
	task := createVia(t, late, 1000)
	if _, err := leader.srv.FSM().Task(task.GetId()); err != nil {
		waitFor(t, "leader to apply", 5*time.Second, func() bool { _, err := leader.srv.FSM().Task(task.GetId()); return err == nil })
	}
}

func countStates(t *testing.T, n *node) map[warrenv1.TaskState]int {
	t.Helper()
	tasks, _, err := n.srv.FSM().ListTasks(warrenv1.TaskState_TASK_STATE_UNSPECIFIED, "", 1000, 0)
	if err != nil {
		t.Fatal(err)
	}
	out := map[warrenv1.TaskState]int{}
	for _, tk := range tasks {
		out[tk.GetState()]++
	}
	return out
}

func TestLeaderPlacesPendingTasks(t *testing.T) {
	nodes := startCluster(t, 0)
	ctx := context.Background()
	cc := warrenv1connect.NewClusterServiceClient(http.DefaultClient, nodes[1].url)
	register := func(id, zone string) {
		t.Helper()
		_, err := cc.RegisterNode(ctx, connect.NewRequest(&warrenv1.RegisterNodeRequest{Node: &warrenv1.Node{
			Id: id, Drivers: []string{"sim"}, Labels: map[string]string{"zone": zone},
			Capacity: &warrenv1.Resources{MilliCpu: 2 * DefaultTaskMilliCPU, MemoryBytes: 2 * DefaultTaskMemoryBytes},
		}}))
		if err != nil {
			t.Fatal(err)
		}
	}
	register("n1", "a")
	register("n2", "b")
	for i := 0; i < 5; i++ {
		_, err := nodes[i%3].tasks.CreateTask(ctx, connect.NewRequest(&warrenv1.CreateTaskRequest{Spec: &warrenv1.TaskSpec{
			Repo: "https://example.com/r.git", Base: "main", IssueTitle: fmt.Sprint("t", i), Driver: "sim"}}))
		if err != nil {
			t.Fatal(err)
		}
	}
	placed := func(n int) func() bool {
		return func() bool { return countStates(t, nodes[2])[warrenv1.TaskState_TASK_STATE_PLACED] == n }
	}
	waitFor(t, "4 of 5 tasks placed (capacity 4)", 10*time.Second, placed(4))
	for _, id := range []string{"n1", "n2"} {
		n, _ := nodes[2].srv.FSM().Node(id)
		if n.GetTaskCount() != 2 {
			t.Fatalf("%s holds %d tasks, want 2 (spread and capacity)", id, n.GetTaskCount())
		}
	}
	// n1 goes down: its 2 tasks are requeued; only a new node takes them.
	leader := leaderOf(nodes)
	if _, _, err := leader.srv.proposeLocal(ctx, &fsmv1.NodeOp{Id: "n1", Op: fsmv1.NodeOp_OP_DOWN, Reason: "test"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "n1's tasks requeued", 10*time.Second, func() bool {
		return countStates(t, nodes[2])[warrenv1.TaskState_TASK_STATE_PENDING] == 3
	})
	register("n3", "a")
	waitFor(t, "n3 to take two tasks", 10*time.Second, placed(4))
	tasks, _, _ := nodes[2].srv.FSM().ListTasks(warrenv1.TaskState_TASK_STATE_PLACED, "", 100, 0)
	for _, tk := range tasks {
		if tk.GetLease().GetNode() == "n1" {
			t.Fatalf("task %s placed on the down node", tk.GetId())
		}
		if tk.GetResume() && tk.GetLease().GetEpoch() != 3 { // placed 1, down 2, placed again 3
			t.Fatalf("requeued task %s re-placed under epoch %d, want 3", tk.GetId(), tk.GetLease().GetEpoch())
		}
	}
}

func TestCreateTasksBatch(t *testing.T) {
	nodes := startCluster(t, 0)
	follower := followerOf(nodes)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	batch := func(n int) []*warrenv1.CreateTaskRequest {
		out := make([]*warrenv1.CreateTaskRequest, n)
		for i := range out {
			out[i] = &warrenv1.CreateTaskRequest{RequestId: fmt.Sprint("b-", i), Spec: testSpec()}
		}
		return out
	}
	resp, err := follower.tasks.CreateTasks(ctx, connect.NewRequest(&warrenv1.CreateTasksRequest{Tasks: batch(300)}))
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]bool{}
	for i, r := range resp.Msg.GetResults() {
		if r.GetErrorCode() != "" || !r.GetCreated() || r.GetTask().GetId() == "" {
			t.Fatalf("result %d: %v", i, r)
		}
		ids[r.GetTask().GetId()] = true
	}
	if len(resp.Msg.GetResults()) != 300 || len(ids) != 300 {
		t.Fatalf("%d results, %d distinct tasks; want 300 of each", len(resp.Msg.GetResults()), len(ids))
	}
	// The same request ids again, through another server: the same tasks.
	again, err := nodes[0].tasks.CreateTasks(ctx, connect.NewRequest(&warrenv1.CreateTasksRequest{Tasks: batch(300)}))
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range again.Msg.GetResults() {
		if r.GetCreated() || r.GetTask().GetId() != resp.Msg.GetResults()[i].GetTask().GetId() {
			t.Fatalf("retried item %d: created=%v id %s, want the first id", i, r.GetCreated(), r.GetTask().GetId())
		}
	}
	// Each is a task like any other.
	if got := countStates(t, follower)[warrenv1.TaskState_TASK_STATE_PENDING]; got != 300 {
		t.Fatalf("%d pending tasks, want 300", got)
	}
	// A malformed item fails the call, naming it; so do empty and oversized calls.
	bad := batch(3)
	bad[2].Spec = nil
	for _, c := range []struct {
		tasks []*warrenv1.CreateTaskRequest
		want  string
	}{
		{bad, "tasks[2]: spec"},
		{nil, "tasks: required"},
		{batch(MaxCreatesPerBatch + 1), "over the limit"},
	} {
		_, err := follower.tasks.CreateTasks(ctx, connect.NewRequest(&warrenv1.CreateTasksRequest{Tasks: c.tasks}))
		if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), c.want) {
			t.Fatalf("want invalid_argument saying %q, got %v", c.want, err)
		}
	}
}

// TestPlacementPacesStarts: with MaxStarting 3, at most 3 tasks wait in
// placed at once; as each starts (records running), another is placed.
func TestPlacementPacesStarts(t *testing.T) {
	nodes := startCluster(t, 0, func(c *Config) { c.MaxStarting = 3 })
	ctx := context.Background()
	cc := warrenv1connect.NewClusterServiceClient(http.DefaultClient, nodes[1].url)
	_, err := cc.RegisterNode(ctx, connect.NewRequest(&warrenv1.RegisterNodeRequest{Node: &warrenv1.Node{
		Id: "n1", Drivers: []string{"sim"}, Capacity: &warrenv1.Resources{MilliCpu: 100 * DefaultTaskMilliCPU, MemoryBytes: 100 * DefaultTaskMemoryBytes},
	}}))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 10; i++ {
		if _, err := nodes[i%3].tasks.CreateTask(ctx, connect.NewRequest(&warrenv1.CreateTaskRequest{Spec: &warrenv1.TaskSpec{
			Repo: "https://example.com/r.git", Base: "main", IssueTitle: fmt.Sprint("t", i), Driver: "sim"}})); err != nil {
			t.Fatal(err)
		}
	}
	states := func() map[warrenv1.TaskState]int { return countStates(t, nodes[0]) }
	waitFor(t, "3 tasks placed", 10*time.Second, func() bool { return states()[warrenv1.TaskState_TASK_STATE_PLACED] == 3 })
	time.Sleep(200 * time.Millisecond) // ten placement ticks: still 3
	if got := states(); got[warrenv1.TaskState_TASK_STATE_PLACED] != 3 || got[warrenv1.TaskState_TASK_STATE_PENDING] != 7 {
		t.Fatalf("states %v, want 3 placed and 7 pending", got)
	}
	// Start one (as its actor would): one more is placed.
	tasks, _, err := nodes[0].srv.FSM().ListTasks(warrenv1.TaskState_TASK_STATE_PLACED, "", 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	tk := tasks[0]
	if _, err := nodes[0].tasks.AppendEvents(ctx, connect.NewRequest(&warrenv1.AppendEventsRequest{TaskId: tk.GetId(),
		LeaseEpoch: tk.GetLease().GetEpoch(), Events: []*warrenv1.EventInput{stateEvent("running")}})); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a fourth task placed", 10*time.Second, func() bool {
		got := states()
		return got[warrenv1.TaskState_TASK_STATE_RUNNING] == 1 && got[warrenv1.TaskState_TASK_STATE_PLACED] == 3 && got[warrenv1.TaskState_TASK_STATE_PENDING] == 6
	})
}

func TestListEventsPages(t *testing.T) {
	nodes := startCluster(t, 0)
	ctx := context.Background()
	task := createVia(t, nodes[0], 1)
	for i := 0; i < 5; i++ {
		if _, err := nodes[1].tasks.AppendEvents(ctx, connect.NewRequest(&warrenv1.AppendEventsRequest{TaskId: task.GetId(),
			Events: []*warrenv1.EventInput{logEvent(fmt.Sprint("m", i))}})); err != nil {
			t.Fatal(err)
		}
	}
	resp, err := nodes[1].tasks.ListEvents(ctx, connect.NewRequest(&warrenv1.ListEventsRequest{TaskId: task.GetId(), AfterSeq: 2, Limit: 2}))
	if err != nil {
		t.Fatal(err)
	}
	if evs := resp.Msg.GetEvents(); len(evs) != 2 || evs[0].GetSeq() != 3 || evs[1].GetSeq() != 4 || evs[0].GetTaskId() != task.GetId() {
		t.Fatalf("after 2, limit 2: %v", evs)
	}
	// The rest, then nothing past the end.
	resp, err = nodes[1].tasks.ListEvents(ctx, connect.NewRequest(&warrenv1.ListEventsRequest{TaskId: task.GetId(), AfterSeq: 4}))
	if err != nil || len(resp.Msg.GetEvents()) != 2 {
		t.Fatalf("after 4: %v %v", resp.Msg.GetEvents(), err)
	}
	resp, err = nodes[1].tasks.ListEvents(ctx, connect.NewRequest(&warrenv1.ListEventsRequest{TaskId: task.GetId(), AfterSeq: 6}))
	if err != nil || len(resp.Msg.GetEvents()) != 0 {
		t.Fatalf("after the end: %v %v", resp.Msg.GetEvents(), err)
	}
	_, err = nodes[1].tasks.ListEvents(ctx, connect.NewRequest(&warrenv1.ListEventsRequest{TaskId: "01J00000000000000000000000"}))
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("unknown task: %v", err)
	}
	_, err = nodes[1].tasks.ListEvents(ctx, connect.NewRequest(&warrenv1.ListEventsRequest{TaskId: task.GetId(), Limit: MaxListEvents + 1}))
	if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "limit") {
		t.Fatalf("limit over the maximum: %v", err)
	}
}

// The FSM does not scan an append's payload for valid JSON again, so the
// leader checks appends a follower forwards (Propose) as the API checks its
// own.
func TestProposeChecksForwardedAppends(t *testing.T) {
	nodes := startCluster(t, 0)
	leader := leaderOf(nodes)
	task := createVia(t, leader, 1)
	cl := warrenv1connect.NewClusterServiceClient(http.DefaultClient, leader.url)
	propose := func(payload string) error {
		b, err := EncodeCommand(&fsmv1.AppendEvents{TaskId: task.GetId(), RequestId: "p-" + payload, Time: timestamppb.Now(),
			Events: []*warrenv1.EventInput{{Kind: "log", Payload: []byte(payload)}}})
		if err != nil {
			t.Fatal(err)
		}
		return forwardOne(t, cl, b)
	}
	err := propose(`{"msg": "unterminated`)
	if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "events[0].payload: not a JSON object") {
		t.Fatalf("a forwarded append with a broken payload: %v", err)
	}
	if err := propose(`{"msg":"ok"}`); err != nil {
		t.Fatalf("a forwarded append with a good payload: %v", err)
	}
	evs, err := leader.srv.FSM().Events(task.GetId(), 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range evs {
		if e.GetKind() == "log" && string(e.GetPayload()) != `{"msg":"ok"}` {
			t.Fatalf("event %d has payload %q", e.GetSeq(), e.GetPayload())
		}
	}
}

// The leader checks every command a follower forwards, not only appends:
// the cluster API is open to whoever reaches the port, and a task id that
// is not a canonical ULID would share another task's event keys (an id
// that was another task's plus 8 bytes made that task unreadable, and a
// command on it panicked every server after a restart).
func TestProposeChecksEveryForwardedCommand(t *testing.T) {
	n := startSingle(t)
	victim := createVia(t, n, 1)
	id := victim.GetId()
	ts := timestamppb.New(t0)
	cl := warrenv1connect.NewClusterServiceClient(http.DefaultClient, n.url)
	for _, tc := range []struct {
		cmd  proto.Message
		want string
	}{
		{&fsmv1.CreateTask{Id: "", Tenant: "default", RequestId: "a", Spec: testSpec(), Time: ts}, "id: "},
		{&fsmv1.CreateTask{Id: id + "\x00\x00\x00\x00\x00\x00\x00\x07", Tenant: "default", RequestId: "b", Spec: testSpec(), Time: ts}, "id: "},
		{&fsmv1.CreateTask{Id: strings.ToLower(ulid.Make().String()), Tenant: "default", RequestId: "c", Spec: testSpec(), Time: ts}, "canonical form"},
		{&fsmv1.CreateTask{Id: ulid.Make().String(), Tenant: "default", RequestId: "d", Time: ts}, "spec: required"},
		{&fsmv1.CreateTask{Id: ulid.Make().String(), RequestId: "e", Spec: testSpec(), Time: ts}, "tenant: required"},
		{&fsmv1.SendMessage{TaskId: "nope", Text: "hi", Time: ts}, "task_id"},
		{&fsmv1.SendMessage{TaskId: id, Time: ts}, "text"},
		{&fsmv1.Decide{TaskId: id, Time: ts}, "tool_call_id"},
		{&fsmv1.CancelTask{TaskId: id + "x", Time: ts}, "task_id"},
		{&fsmv1.RegisterNode{Time: ts}, "node: required"},
		{&fsmv1.NodeOp{Id: "n1", Op: fsmv1.NodeOp_OP_DOWN, Time: ts}, "op: OP_DOWN is not an operator's op"},
		{&fsmv1.NodeOp{Id: "-", Op: fsmv1.NodeOp_OP_CORDON, Time: ts}, "id: \"-\" must be"},
		{&fsmv1.SetPool{Template: "default", Target: 5000}, "target"},
		{&fsmv1.GrantLease{TaskId: id, Node: "n1", Time: ts}, "not accepted from other servers"},
		{&fsmv1.SendMessage{TaskId: id, Text: "x", RequestId: "late", Time: &timestamppb.Timestamp{Seconds: 400000000000}}, "time: "},
	} {
		b, err := EncodeCommand(tc.cmd)
		if err != nil {
			t.Fatal(err)
		}
		err = forwardOne(t, cl, b)
		if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("forwarded %T %v: %v, want invalid_argument mentioning %q", tc.cmd, tc.cmd, err, tc.want)
		}
	}
	ctx := context.Background()
	if _, err := n.tasks.GetTask(ctx, connect.NewRequest(&warrenv1.GetTaskRequest{Id: id})); err != nil {
		t.Fatalf("the task after the refused commands: %v", err)
	}
	if _, err := n.tasks.ListTasks(ctx, connect.NewRequest(&warrenv1.ListTasksRequest{})); err != nil {
		t.Fatalf("ListTasks after the refused commands: %v", err)
	}
	// What the API makes still goes through.
	b, err := EncodeCommand(&fsmv1.SendMessage{TaskId: id, Text: "steer", RequestId: "fwd-1", Time: ts})
	if err != nil {
		t.Fatal(err)
	}
	if err := forwardOne(t, cl, b); err != nil {
		t.Fatalf("a good forwarded message: %v", err)
	}
}

// forwardOne sends one encoded command to a leader's Propose, as a
// follower forwards it, and returns the call's error or else the
// command's own (a refused command fails in its result, not the call).
func forwardOne(t *testing.T, cl warrenv1connect.ClusterServiceClient, cmd []byte) error {
	t.Helper()
	resp, err := cl.Propose(context.Background(), connect.NewRequest(&warrenv1.ProposeRequest{Commands: [][]byte{cmd}}))
	if err != nil {
		return err
	}
	if n := len(resp.Msg.GetResults()); n != 1 {
		t.Fatalf("Propose returned %d results for 1 command", n)
	}
	var r fsmv1.Result
	if err := proto.Unmarshal(resp.Msg.GetResults()[0], &r); err != nil {
		t.Fatal(err)
	}
	return resultErr(&r)
}

// startSingle starts a one-server cluster and waits until it leads.
func startSingle(t *testing.T) *node {
	t.Helper()
	n := startNode(t, t.TempDir(), "s1", true, "", 0)
	waitFor(t, "s1 to lead", 10*time.Second, func() bool { return leaderOf([]*node{n}) != nil })
	return n
}

// after_seq 2^64-1 (or Last-Event-ID 18446744073709551615) asks for
// nothing; after+1 wrapped to 0 and every event was sent again.
func TestAfterTheLastPossibleSeqSendsNothing(t *testing.T) {
	n := startSingle(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	task := createVia(t, n, 1)
	if _, err := n.tasks.CancelTask(ctx, connect.NewRequest(&warrenv1.CancelTaskRequest{TaskId: task.GetId()})); err != nil {
		t.Fatal(err) // pending, so it ends at once: the streams below end
	}
	stream, err := n.tasks.StreamEvents(ctx, connect.NewRequest(&warrenv1.StreamEventsRequest{TaskId: task.GetId(), AfterSeq: math.MaxUint64}))
	if err != nil {
		t.Fatal(err)
	}
	for stream.Receive() {
		t.Errorf("StreamEvents after 2^64-1 sent seq %d", stream.Msg().GetEvent().GetSeq())
	}
	stream.Close()
	resp, err := n.tasks.ListEvents(ctx, connect.NewRequest(&warrenv1.ListEventsRequest{TaskId: task.GetId(), AfterSeq: math.MaxUint64}))
	if err != nil || len(resp.Msg.GetEvents()) != 0 {
		t.Errorf("ListEvents after 2^64-1: %v, %v", resp.Msg.GetEvents(), err)
	}
	req, err := http.NewRequestWithContext(ctx, "GET", n.url+"/v1/tasks/"+task.GetId()+"/events", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Last-Event-ID", "18446744073709551615")
	hr, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer hr.Body.Close()
	body, err := io.ReadAll(hr.Body)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(body), "id: ") {
		t.Errorf("SSE with Last-Event-ID 2^64-1 sent events:\n%s", body)
	}
}

// A stream's watch of its task is let go when the stream ends: streams of
// tasks that do not exist, or that ended, left an entry behind for good
// (a client could grow the map at will with made-up ids).
func TestFinishedStreamsLeaveNoWatch(t *testing.T) {
	n := startSingle(t)
	ctx := context.Background()
	task := createVia(t, n, 1)
	if _, err := n.tasks.CancelTask(ctx, connect.NewRequest(&warrenv1.CancelTaskRequest{TaskId: task.GetId()})); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 20; i++ {
		stream, err := n.tasks.StreamEvents(ctx, connect.NewRequest(&warrenv1.StreamEventsRequest{TaskId: fmt.Sprintf("01J%023d", i)}))
		if err != nil {
			t.Fatal(err)
		}
		for stream.Receive() {
		}
		if connect.CodeOf(stream.Err()) != connect.CodeNotFound {
			t.Fatalf("stream of a missing task: %v", stream.Err())
		}
		stream.Close()
		hr, err := http.Get(n.url + "/v1/tasks/" + task.GetId() + "/events") // ended: sends its events and ends
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, hr.Body)
		hr.Body.Close()
	}
	if got := n.srv.FSM().watch.watched(); got != 0 {
		t.Fatalf("after 40 finished streams, %d tasks are still watched", got)
	}
}

// A request the API takes on the leader is taken through a follower too.
// The follower forwards it as a ProposeRequest, which adds to each command
// a type byte, a time and a generated request id; the leader read that
// under the client's limit, so a request within ~50 KB of it was refused
// (resource_exhausted) through a follower only. Here: the largest batch
// the API takes, forwarded as the follower would, fits the ClusterService's
// limit, and the leader reads a request of that size (every command names
// a task id in the wrong form, of the right length, so each is refused as
// such, in its own result, without a 33 MiB apply).
func TestForwardedRequestNearTheLimit(t *testing.T) {
	req := &warrenv1.AppendEventsBatchRequest{}
	for range MaxAppendsPerBatch {
		req.Appends = append(req.Appends, &warrenv1.AppendEventsRequest{TaskId: ulid.Make().String(), LeaseEpoch: 1 << 40,
			Events: []*warrenv1.EventInput{{Kind: KindLog}}})
	}
	var payload []byte
	for per := (maxRequestBytes - proto.Size(req)) / MaxAppendsPerBatch; ; per -= 8 { // as much as fits
		payload = []byte(`{"m":"` + strings.Repeat("x", per) + `"}`)
		for _, a := range req.Appends {
			a.Events[0].Payload = payload
		}
		if proto.Size(req) <= maxRequestBytes {
			break
		}
	}
	if size := proto.Size(req); size > maxRequestBytes || size < maxRequestBytes-4096 {
		t.Fatalf("built a %d-byte request, want just under %d", size, maxRequestBytes)
	}
	// What the follower sends: the handler's commands, encoded (with the
	// task ids spelt in lower case: as long, but refused).
	fwd := &warrenv1.ProposeRequest{}
	now := timestamppb.Now()
	for _, it := range req.Appends {
		b, err := EncodeCommand(&fsmv1.AppendEvents{TaskId: strings.ToLower(it.GetTaskId()), LeaseEpoch: it.GetLeaseEpoch(), Events: it.GetEvents(),
			RequestId: requestID(it.GetRequestId()), Time: now, ExpectedSeq: it.GetExpectedSeq()})
		if err != nil {
			t.Fatal(err)
		}
		fwd.Commands = append(fwd.Commands, b)
	}
	size := proto.Size(fwd)
	if size <= maxRequestBytes || size > maxForwardBytes {
		t.Fatalf("forwarded: %d bytes, want over the client's %d (else this test shows nothing) and at most %d", size, maxRequestBytes, maxForwardBytes)
	}
	n := startSingle(t)
	cl := warrenv1connect.NewClusterServiceClient(http.DefaultClient, n.url)
	resp, err := cl.Propose(context.Background(), connect.NewRequest(fwd))
	if err != nil {
		t.Fatalf("a %d-byte forwarded request: %v, want it read", size, err)
	}
	if got := len(resp.Msg.GetResults()); got != len(fwd.Commands) {
		t.Fatalf("%d results for %d commands", got, len(fwd.Commands))
	}
	var r fsmv1.Result
	if err := proto.Unmarshal(resp.Msg.GetResults()[0], &r); err != nil {
		t.Fatal(err)
	}
	if err := resultErr(&r); connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "task_id") {
		t.Fatalf("a %d-byte forwarded request: its first command got %v, want it refused for its task_id", size, err)
	}
}

// A leader judges no node before it is ready (its barrier done): until
// then no node can attach, so every node would look silent, and a slow
// or failed barrier declared them all down. Once ready, a node that never
// attaches is declared down after two TTLs, as before.
func TestLivenessWaitsForTheLeaderToBeReady(t *testing.T) {
	const ttl = 200 * time.Millisecond
	n := startNode(t, t.TempDir(), "s1", true, "", 0, func(c *Config) { c.NodeTTL, c.NodeHeartbeat = ttl, ttl/4 })
	waitFor(t, "s1 to lead and be ready", 10*time.Second, func() bool {
		return n.srv.Raft().State() == raft.Leader && n.srv.readyTerm.Load() == n.srv.Raft().CurrentTerm()
	})
	term := n.srv.readyTerm.Load()
	n.srv.readyTerm.Store(0) // as while its barrier runs
	n.srv.sess.lead(n.srv.clock.Now())
	cl := warrenv1connect.NewClusterServiceClient(http.DefaultClient, n.url)
	if _, err := cl.RegisterNode(context.Background(), connect.NewRequest(&warrenv1.RegisterNodeRequest{Node: &warrenv1.Node{
		Id: "n1", Drivers: []string{"sim"}, Capacity: &warrenv1.Resources{MilliCpu: 1000, MemoryBytes: 1 << 30}}})); err != nil {
		t.Fatal(err)
	}
	status := func() warrenv1.NodeStatus {
		nodes, err := n.srv.FSM().Nodes()
		if err != nil || len(nodes) != 1 {
			t.Fatalf("nodes: %v %v", nodes, err)
		}
		return nodes[0].GetStatus()
	}
	time.Sleep(5 * ttl)
	if st := status(); st != warrenv1.NodeStatus_NODE_STATUS_READY {
		t.Fatalf("before the leader was ready, n1 became %s", st)
	}
	n.srv.sess.ready(n.srv.clock.Now())
	n.srv.readyTerm.Store(term)
	waitFor(t, "n1, which never attached, to be declared down", 10*time.Second, func() bool {
		return status() == warrenv1.NodeStatus_NODE_STATUS_DOWN
	})
}

// The SSE gateway answers 404 for a task that does not exist, and 500,
// not 404, for one this replica cannot read.
func TestSSEStatusForMissingAndUnreadableTasks(t *testing.T) {
	n := startSingle(t)
	task := createVia(t, n, 1)
	get := func(id string) (int, string) {
		resp, err := http.Get(n.url + "/v1/tasks/" + id + "/events")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get(ulid.Make().String()); code != http.StatusNotFound || !strings.HasPrefix(body, "not_found:") {
		t.Fatalf("a missing task: %d %q", code, body)
	}
	if err := n.srv.FSM().db.Set(keyTask(task.GetId()), []byte{0xff, 0xff, 0xff}, pebble.Sync); err != nil {
		t.Fatal(err)
	}
	if code, body := get(task.GetId()); code != http.StatusInternalServerError || !strings.HasPrefix(body, "internal:") {
		t.Fatalf("an unreadable task: %d %q", code, body)
	}
}

// A task created through the leader is there at once for reads on a
// follower, which is often a moment behind: each read of a task it does
// not have yet catches up with the leader first. A task no server has is
// still not_found there.
func TestFollowerReadsSeeATaskJustCreated(t *testing.T) {
	nodes := startCluster(t, 1024)
	leader, follower := leaderOf(nodes), followerOf(nodes)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sse := func(id string) int {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, follower.url+"/v1/tasks/"+id+"/events", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close() // the stream goes on: the status is enough
		return resp.StatusCode
	}
	const tries = 10
	for i := range tries {
		id := createVia(t, leader, 100+4*i).GetId()
		if _, err := follower.tasks.GetTask(ctx, connect.NewRequest(&warrenv1.GetTaskRequest{Id: id})); err != nil {
			t.Fatalf("try %d: GetTask on the follower: %v", i, err)
		}
		id = createVia(t, leader, 101+4*i).GetId()
		resp, err := follower.tasks.ListEvents(ctx, connect.NewRequest(&warrenv1.ListEventsRequest{TaskId: id}))
		if err != nil {
			t.Fatalf("try %d: ListEvents on the follower: %v", i, err)
		}
		if len(resp.Msg.GetEvents()) == 0 {
			t.Fatalf("try %d: ListEvents on the follower: no events", i)
		}
		id = createVia(t, leader, 102+4*i).GetId()
		st, err := follower.tasks.StreamEvents(ctx, connect.NewRequest(&warrenv1.StreamEventsRequest{TaskId: id}))
		if err != nil {
			t.Fatal(err)
		}
		if !st.Receive() || st.Msg().GetEvent().GetSeq() != 1 {
			t.Fatalf("try %d: StreamEvents on the follower: %v", i, st.Err())
		}
		st.Close()
		id = createVia(t, leader, 103+4*i).GetId()
		if code := sse(id); code != http.StatusOK {
			t.Fatalf("try %d: SSE on the follower: status %d", i, code)
		}
	}
	missing := ulid.Make().String()
	if _, err := follower.tasks.GetTask(ctx, connect.NewRequest(&warrenv1.GetTaskRequest{Id: missing})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("a missing task on the follower: %v", err)
	}
	if code := sse(missing); code != http.StatusNotFound {
		t.Fatalf("a missing task's SSE on the follower: status %d", code)
	}
}

// Resuming the SSE stream of a task that has ended, at or after its last
// event, gets 204 No Content (an EventSource stops reconnecting); from
// before its last event, the rest and `end`.
func TestSSEOfAnEndedTask(t *testing.T) {
	n := startSingle(t)
	task := createVia(t, n, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := n.tasks.CancelTask(ctx, connect.NewRequest(&warrenv1.CancelTaskRequest{TaskId: task.GetId()})); err != nil {
		t.Fatal(err)
	}
	got, err := n.tasks.GetTask(ctx, connect.NewRequest(&warrenv1.GetTaskRequest{Id: task.GetId()}))
	if err != nil {
		t.Fatal(err)
	}
	last := got.Msg.GetTask().GetNextSeq() - 1
	get := func(lastID uint64) (int, string) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, n.url+"/v1/tasks/"+task.GetId()+"/events", nil)
		req.Header.Set("Last-Event-ID", strconv.FormatUint(lastID, 10))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, at := range []uint64{last, last + 5} {
		if code, body := get(at); code != http.StatusNoContent || body != "" {
			t.Errorf("Last-Event-ID %d of %d: %d %q; want 204 and no body", at, last, code, body)
		}
	}
	code, body := get(last - 1)
	if code != http.StatusOK || !strings.Contains(body, fmt.Sprintf("id: %d\n", last)) || !strings.Contains(body, "event: end\n") {
		t.Errorf("Last-Event-ID %d of %d: %d %q; want the last event and end", last-1, last, code, body)
	}
}

// A ListEvents page ends at 4 MiB (with at least one event), and a
// stream reads past such pages: every event once, in order.
func TestLargeEventsPageByBytes(t *testing.T) {
	n := startSingle(t)
	task := createVia(t, n, 1)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	big := []byte(`{"line":"` + strings.Repeat("x", 60<<10) + `"}`)
	const total = 150 // about 9 MiB
	for i := 0; i < total; i += 10 {
		var evs []*warrenv1.EventInput
		for range 10 {
			evs = append(evs, &warrenv1.EventInput{Kind: KindLog, Payload: big})
		}
		if _, err := n.tasks.AppendEvents(ctx, connect.NewRequest(&warrenv1.AppendEventsRequest{TaskId: task.GetId(), Events: evs})); err != nil {
			t.Fatal(err)
		}
	}
	last := uint64(total + 1) // task_created first
	var after uint64
	pages := 0
	for {
		resp, err := n.tasks.ListEvents(ctx, connect.NewRequest(&warrenv1.ListEventsRequest{TaskId: task.GetId(), AfterSeq: after, Limit: MaxListEvents}))
		if err != nil {
			t.Fatal(err)
		}
		evs := resp.Msg.GetEvents()
		if len(evs) == 0 {
			break
		}
		if size := proto.Size(resp.Msg); size > maxListBytes+64<<10 {
			t.Errorf("page %d: %d bytes", pages, size)
		}
		for _, e := range evs {
			if e.GetSeq() != after+1 {
				t.Fatalf("page %d: seq %d after %d", pages, e.GetSeq(), after)
			}
			after = e.GetSeq()
		}
		pages++
	}
	if after != last || pages < 3 {
		t.Fatalf("listed up to seq %d of %d in %d pages", after, last, pages)
	}
	if _, err := n.tasks.CancelTask(ctx, connect.NewRequest(&warrenv1.CancelTaskRequest{TaskId: task.GetId()})); err != nil {
		t.Fatal(err)
	}
	st, err := n.tasks.StreamEvents(ctx, connect.NewRequest(&warrenv1.StreamEventsRequest{TaskId: task.GetId()}))
	if err != nil {
		t.Fatal(err)
	}
	var seq uint64
	for st.Receive() {
		if got := st.Msg().GetEvent().GetSeq(); got != seq+1 {
			t.Fatalf("stream: seq %d after %d", got, seq)
		}
		seq++
	}
	if err := st.Err(); err != nil || seq <= last {
		t.Fatalf("stream ended at seq %d (log has more than %d): %v", seq, last, err)
	}
}

// Reads that a snapshot restore overlaps (it replaces the state piece by
// piece, so they could find tasks missing or old) answer unavailable,
// which clients retry, instead of not_found or a partial page.
func TestReadsDuringARestoreAreRetried(t *testing.T) {
	n := startSingle(t)
	task := createVia(t, n, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	f := n.srv.FSM()
	f.restores.Add(1) // as Restore does while it runs
	_, err := n.tasks.GetTask(ctx, connect.NewRequest(&warrenv1.GetTaskRequest{Id: task.GetId()}))
	if connect.CodeOf(err) != connect.CodeUnavailable {
		t.Errorf("GetTask during a restore: %v", err)
	}
	_, err = n.tasks.ListTasks(ctx, connect.NewRequest(&warrenv1.ListTasksRequest{}))
	if connect.CodeOf(err) != connect.CodeUnavailable {
		t.Errorf("ListTasks during a restore: %v", err)
	}
	_, err = n.tasks.ListEvents(ctx, connect.NewRequest(&warrenv1.ListEventsRequest{TaskId: task.GetId()}))
	if connect.CodeOf(err) != connect.CodeUnavailable {
		t.Errorf("ListEvents during a restore: %v", err)
	}
	st, err := n.tasks.StreamEvents(ctx, connect.NewRequest(&warrenv1.StreamEventsRequest{TaskId: task.GetId()}))
	if err == nil {
		for st.Receive() {
		}
		err = st.Err()
	}
	if connect.CodeOf(err) != connect.CodeUnavailable {
		t.Errorf("StreamEvents during a restore: %v", err)
	}
	f.restores.Add(1) // done
	if _, err := n.tasks.GetTask(ctx, connect.NewRequest(&warrenv1.GetTaskRequest{Id: task.GetId()})); err != nil {
		t.Errorf("GetTask after the restore: %v", err)
	}
}

// join asks the server at url to add server id at raftAddr.
func join(url, id, raftAddr string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	_, err := warrenv1connect.NewClusterServiceClient(http.DefaultClient, url).Join(ctx,
		connect.NewRequest(&warrenv1.JoinRequest{Id: id, RaftAddress: raftAddr, ApiUrl: "http://" + raftAddr}))
	return err
}

// raftAddrIn returns the raft address n's status lists for server id.
func raftAddrIn(n *node, id string) string {
	for _, p := range n.srv.Status().GetPeers() {
		if p.GetId() == id {
			return p.GetRaftAddress()
		}
	}
	return ""
}

// A voter the leader cannot reach still counts towards the quorum: a
// single server that took one in could never commit again. The leader
// refuses a join whose raft address does not answer, or answers as
// another server, and keeps taking writes.
func TestJoinWithAnUnreachableRaftAddressIsRefused(t *testing.T) {
	a := startSingle(t)
	unreachable := freeaddr.Loopback(t) // nothing listens there
	err := join(a.url, "s2", unreachable)
	if connect.CodeOf(err) != connect.CodeUnavailable || !strings.Contains(err.Error(), unreachable) || !strings.Contains(err.Error(), "refused") {
		t.Errorf("join at an unreachable raft address: got %v, want unavailable naming %s and the dial error", err, unreachable)
	}
	// The leader's own raft address, pasted by mistake: it answers, as s1.
	err = join(a.url, "s2", a.srv.cfg.RaftAddr)
	if connect.CodeOf(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), `"s1"`) {
		t.Errorf("join at the leader's raft address: got %v, want failed_precondition naming s1", err)
	}
	if peers := a.srv.Status().GetPeers(); len(peers) != 1 {
		t.Fatalf("peers after refused joins: %v", peers)
	}
	createVia(t, a, 1)
}

// A server restarted on its data with another raft address (and --join)
// joins again, which moves it: the leader replicates to it at the new
// address and records it.
func TestRestartWithANewRaftAddressMovesTheServer(t *testing.T) {
	dir := t.TempDir()
	a := startNode(t, dir, "s1", true, "", 0)
	waitFor(t, "s1 to lead", 10*time.Second, func() bool { return leaderOf([]*node{a}) != nil })
	startNode(t, dir, "s2", false, a.url, 0)
	c := startNode(t, dir, "s3", false, a.url, 0)
	waitFor(t, "3 voters", 15*time.Second, func() bool { return len(a.srv.Status().GetPeers()) == 3 })
	createVia(t, a, 1)
	c.stop()
	pipelineToStoppedFails(t, a)

	// Same id and data, a new raft address (startNode picks a fresh one).
	c2 := startNode(t, dir, "s3", false, a.url, 0)
	moved := c2.srv.cfg.RaftAddr
	task := createVia(t, a, 2)
	waitFor(t, "s3 to get a write at its new address", 10*time.Second, func() bool {
		_, err := c2.srv.FSM().Task(task.GetId())
		return err == nil
	})
	if got := raftAddrIn(a, "s3"); got != moved {
		t.Errorf("leader's configuration has s3 at %s, want %s", got, moved)
	}
	waitFor(t, "s3's member record to move", 10*time.Second, func() bool {
		m, err := a.srv.FSM().Member("s3")
		return err == nil && m.GetRaftAddress() == moved
	})
}

// pipelineToStoppedFails has the leader (via n) replicate a write while a
// voter is stopped, then waits a moment: its pipelined replication to the
// stopped voter fails and ends (raft replicates without a pipeline until
// a send succeeds again) before the test moves the voter's address.
// hashicorp/raft v1.8.0 logs a failed pipelined send with the peer read
// without its lock, which races with the address change
// (hashicorp/raft#681, fixed by #682, not released): the race detector
// failed these tests when the two met.
func pipelineToStoppedFails(t *testing.T, n *node) {
	t.Helper()
	createVia(t, n, 100)
	time.Sleep(500 * time.Millisecond)
}

// A join with the id of a voter whose raft address still answers as that
// voter is a second server given the same id: it is refused, naming both
// addresses, and the voter keeps its place. Once the voter is gone, the
// same join replaces it (how a dead server is replaced).
func TestJoinWithAnIDInUseIsRefused(t *testing.T) {
	nodes := startCluster(t, 0)
	c := nodes[2]
	old := c.srv.cfg.RaftAddr
	other := startNode(t, t.TempDir(), c.srv.ID(), false, "", 0, func(c *Config) { c.AwaitJoin = true }) // no state, not joining by itself
	addr := other.srv.cfg.RaftAddr
	err := join(nodes[0].url, c.srv.ID(), addr)
	if connect.CodeOf(err) != connect.CodeAlreadyExists || !strings.Contains(err.Error(), old) || !strings.Contains(err.Error(), addr) {
		t.Fatalf("join of a second %s: got %v, want already_exists naming %s and %s", c.srv.ID(), err, old, addr)
	}
	if got := raftAddrIn(nodes[0], c.srv.ID()); got != old {
		t.Fatalf("after a refused join %s is at %s, want %s", c.srv.ID(), got, old)
	}

	c.stop()
	pipelineToStoppedFails(t, nodes[0])
	waitFor(t, "the join to replace the stopped server", 15*time.Second, func() bool {
		err := join(nodes[0].url, c.srv.ID(), addr)
		if err != nil && connect.CodeOf(err) != connect.CodeUnavailable { // no leader for a moment
			t.Fatalf("join replacing a stopped server: %v", err)
		}
		return err == nil
	})
	task := createVia(t, nodes[0], 1)
	waitFor(t, "the replacement to get a write", 10*time.Second, func() bool {
		_, err := other.srv.FSM().Task(task.GetId())
		return err == nil
	})
}

// An Open that fails once raft runs (here: the gossip port is taken) stops
// what it started, waiting for raft before it closes the store: nothing is
// left running, and the data directory opens again.
func TestFailedOpenReleasesEverything(t *testing.T) {
	defer goleak.VerifyNone(t, append(raftLeaks, goleak.IgnoreCurrent())...)
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	cfg := Config{
		ID: "s1", DataDir: t.TempDir(), RaftAddr: freeaddr.Loopback(t), APIURL: "http://127.0.0.1:1",
		Bootstrap: true, GossipAddr: taken.Addr().String(), RaftLevel: "error",
	}
	if srv, err := Open(cfg); err == nil {
		srv.Close()
		t.Fatal("Open with a taken gossip port succeeded")
	}
	cfg.GossipAddr = ""
	srv, err := Open(cfg)
	if err != nil {
		t.Fatalf("Open again after a failed Open: %v", err)
	}
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
}

// A ListEvents page of many mid-sized events stays within 4 MiB on the
// wire, where gRPC clients' default receive limit is: the byte budget
// counted stored bytes only, and each event's task id and framing took a
// page of 5 KB events about 27 KB past it, which such a client refused
// on every try.
func TestEventsPageFitsFourMiBOnTheWire(t *testing.T) {
	n := startSingle(t)
	task := createVia(t, n, 1)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	mid := []byte(`{"line":"` + strings.Repeat("x", 5000) + `"}`)
	const total = 1000
	for i := 0; i < total; i += 100 {
		var evs []*warrenv1.EventInput
		for range 100 {
			evs = append(evs, &warrenv1.EventInput{Kind: KindLog, Payload: mid})
		}
		if _, err := n.tasks.AppendEvents(ctx, connect.NewRequest(&warrenv1.AppendEventsRequest{TaskId: task.GetId(), Events: evs})); err != nil {
			t.Fatal(err)
		}
	}
	var after uint64
	for {
		resp, err := n.tasks.ListEvents(ctx, connect.NewRequest(&warrenv1.ListEventsRequest{TaskId: task.GetId(), AfterSeq: after, Limit: MaxListEvents}))
		if err != nil {
			t.Fatal(err)
		}
		evs := resp.Msg.GetEvents()
		if len(evs) == 0 {
			break
		}
		if size := proto.Size(resp.Msg); size > 4<<20 {
			t.Fatalf("a page of %d events is %d bytes on the wire, over 4 MiB", len(evs), size)
		}
		after = evs[len(evs)-1].GetSeq()
	}
	if after != total+1 {
		t.Fatalf("listed up to seq %d of %d", after, total+1)
	}
}
