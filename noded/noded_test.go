package noded_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
	"github.com/warrenhq/warren/api/gen/warren/v1/warrenv1connect"
	"github.com/warrenhq/warren/client"
	"github.com/warrenhq/warren/internal/freeaddr"
	"github.com/warrenhq/warren/noded"
	"github.com/warrenhq/warren/noded/driver"
	"github.com/warrenhq/warren/noded/driver/sim"
	"github.com/warrenhq/warren/scheduler"
)

// cluster is three in-process servers (real raft on loopback, Pebble on
// disk, memberlist) for node daemons to join.
type cluster struct {
	t       *testing.T
	dir     string
	servers []*server
	gossip  []string
	cl      *client.Client
}

type server struct {
	srv *scheduler.Server
	hs  *http.Server
	url string
}

func startCluster(t *testing.T, n int, ttl time.Duration) *cluster {
	t.Helper()
	c := &cluster{t: t, dir: t.TempDir()}
	for i := 0; i < n; i++ {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		url := "http://" + ln.Addr().String()
		gaddr := freeaddr.Loopback(t)
		cfg := scheduler.Config{
			ID: fmt.Sprintf("s%d", i+1), DataDir: filepath.Join(c.dir, fmt.Sprint(i)), RaftAddr: freeaddr.Loopback(t), APIURL: url,
			Bootstrap: i == 0, SnapshotInterval: time.Hour, RaftLevel: "error",
			NodeTTL: ttl, GossipAddr: gaddr, JoinGossip: c.gossip, RaftLogTo: io.Discard,
		}
		if i > 0 {
			cfg.JoinURL = c.servers[0].url
		}
		srv, err := scheduler.Open(cfg)
		if err != nil {
			t.Fatal(err)
		}
		hs := &http.Server{Handler: srv.Handler()}
		hs.Protocols = new(http.Protocols)
		hs.Protocols.SetHTTP1(true)
		hs.Protocols.SetUnencryptedHTTP2(true)
		go hs.Serve(ln)
		s := &server{srv: srv, hs: hs, url: url}
		t.Cleanup(func() { s.srv.Close(); s.hs.Close() })
		c.servers = append(c.servers, s)
		c.gossip = append(c.gossip, gaddr)
		if i == 0 {
			waitFor(t, "first leader", 10*time.Second, func() bool { return srv.Raft().State().String() == "Leader" })
		}
	}
	var urls []string
	for _, s := range c.servers {
		urls = append(urls, s.url)
	}
	cl, err := client.New(joinComma(urls))
	if err != nil {
		t.Fatal(err)
	}
	c.cl = cl
	waitFor(t, "all servers to be voters", 20*time.Second, func() bool {
		st, err := cl.Cluster().Status(context.Background(), connect.NewRequest(&warrenv1.StatusRequest{}))
		return err == nil && len(st.Msg.GetPeers()) == n && st.Msg.GetLeaderApiUrl() != ""
	})
	return c
}

func joinComma(xs []string) string {
	s := ""
	for i, x := range xs {
		if i > 0 {
			s += ","
		}
		s += x
	}
	return s
}

func (c *cluster) urls() []string {
	var out []string
	for _, s := range c.servers {
		out = append(out, s.url)
	}
	return out
}

func (c *cluster) startNode(id string, latency time.Duration) *noded.Daemon {
	c.t.Helper()
	return c.startNodeWith(id, sim.New(sim.Config{RestoreLatency: latency, ExecLatency: latency}))
}

// startNodeWith starts a node daemon with drv; tweaks change its config.
func (c *cluster) startNodeWith(id string, drv driver.Driver, tweaks ...func(*noded.Config)) *noded.Daemon {
	c.t.Helper()
	cfg := noded.Config{
		ID: id, DataDir: filepath.Join(c.dir, "node-"+id), Servers: c.urls(),
		GossipAddr: freeaddr.Loopback(c.t), JoinGossip: c.gossip,
		Driver:   drv,
		Capacity: &warrenv1.Resources{MilliCpu: 1000 * 1000, MemoryBytes: 1 << 50},
		Labels:   map[string]string{"zone": id},
	}
	for _, tw := range tweaks {
		tw(&cfg)
	}
	d, err := noded.Start(cfg)
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { d.Close() })
	waitFor(c.t, "node "+id+" ready", 10*time.Second, func() bool {
		n, err := c.node(id)
		return err == nil && n.GetStatus() == warrenv1.NodeStatus_NODE_STATUS_READY
	})
	return d
}

func (c *cluster) node(id string) (*warrenv1.Node, error) {
	resp, err := c.cl.Cluster().ListNodes(context.Background(), connect.NewRequest(&warrenv1.ListNodesRequest{}))
	if err != nil {
		return nil, err
	}
	for _, n := range resp.Msg.GetNodes() {
		if n.GetId() == id {
			return n, nil
		}
	}
	return nil, fmt.Errorf("node %s not registered", id)
}

func (c *cluster) submit(n int, script *warrenv1.Script) []string {
	c.t.Helper()
	var ids []string
	for i := 0; i < n; i++ {
		resp, err := c.cl.Tasks().CreateTask(context.Background(), connect.NewRequest(&warrenv1.CreateTaskRequest{
			RequestId: fmt.Sprint("req-", i), Spec: &warrenv1.TaskSpec{Repo: "https://example.com/r.git", Base: "main",
				IssueTitle: fmt.Sprint("scripted ", i), Driver: "sim", Script: script}}))
		if err != nil {
			c.t.Fatal(err)
		}
		ids = append(ids, resp.Msg.GetTask().GetId())
	}
	return ids
}

func (c *cluster) task(id string) *warrenv1.Task {
	resp, err := c.cl.Tasks().GetTask(context.Background(), connect.NewRequest(&warrenv1.GetTaskRequest{Id: id}))
	if err != nil {
		return nil
	}
	return resp.Msg.GetTask()
}

func (c *cluster) events(id string) []*warrenv1.Event {
	c.t.Helper()
	var out []*warrenv1.Event
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := c.cl.Watch(ctx, id, 0, func(e *warrenv1.Event) error { out = append(out, e); return nil }, nil); err != nil {
		c.t.Fatalf("watch %s: %v", id, err)
	}
	return out
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

func (c *cluster) allEnded(ids []string) func() bool {
	return func() bool {
		for _, id := range ids {
			t := c.task(id)
			if t == nil || t.GetState() != warrenv1.TaskState_TASK_STATE_SUCCEEDED {
				return false
			}
		}
		return true
	}
}

// checkLog checks one finished task's log: gapless, every step has exactly
// one effect and at least one result, and no event was appended under an
// epoch older than one already seen (a stale owner never lands after the
// bump).
func checkLog(t *testing.T, id string, events []*warrenv1.Event, steps int) (nodes map[string]bool) {
	t.Helper()
	nodes = map[string]bool{}
	effects := map[string]int{}
	results := map[string]int{}
	var maxEpoch uint64
	for i, e := range events {
		if e.GetSeq() != uint64(i+1) {
			t.Fatalf("task %s: event %d has seq %d: log not gapless", id, i, e.GetSeq())
		}
		if e.GetEpoch() != 0 {
			if e.GetEpoch() < maxEpoch {
				t.Fatalf("task %s: seq %d appended under epoch %d after epoch %d", id, e.GetSeq(), e.GetEpoch(), maxEpoch)
			}
			maxEpoch = e.GetEpoch()
		}
		var p map[string]any
		_ = json.Unmarshal(e.GetPayload(), &p)
		switch e.GetKind() {
		case "effect":
			effects[p["idempotency_key"].(string)]++
			nodes[p["node"].(string)] = true
		case "tool_result":
			results[p["tool_call_id"].(string)]++
		}
	}
	for s := 1; s <= steps; s++ {
		key := id + "/step-" + strconv.Itoa(s)
		if effects[key] != 1 {
			t.Fatalf("task %s: effect %s recorded %d times, want 1", id, key, effects[key])
		}
		if results["step-"+strconv.Itoa(s)] < 1 {
			t.Fatalf("task %s: step %d has no result", id, s)
		}
	}
	if len(effects) != steps {
		t.Fatalf("task %s: %d effects, want %d", id, len(effects), steps)
	}
	return nodes
}

func TestTasksRunOnNodes(t *testing.T) {
	c := startCluster(t, 3, 0)
	c.startNode("n1", 0)
	c.startNode("n2", 0)
	ids := c.submit(20, &warrenv1.Script{Steps: 5, StepMillis: 10, OutputBytes: 100})
	waitFor(t, "all tasks to succeed", 60*time.Second, c.allEnded(ids))
	used := map[string]bool{}
	for _, id := range ids {
		for n := range checkLog(t, id, c.events(id), 5) {
			used[n] = true
		}
	}
	if len(used) != 2 {
		t.Fatalf("tasks ran on %v, want both nodes (spread)", used)
	}
	waitFor(t, "allocations released", 5*time.Second, func() bool {
		n1, _ := c.node("n1")
		n2, _ := c.node("n2")
		return n1.GetTaskCount() == 0 && n2.GetTaskCount() == 0
	})
}

// TestPartitionedNodeIsFenced cuts a node off from servers and gossip
// mid-run: its tasks are re-placed; when it comes back, its stale appends
// are refused and its actors stop; no event of the old epoch lands after
// the bump.
func TestPartitionedNodeIsFenced(t *testing.T) {
	c := startCluster(t, 3, time.Second)
	a := c.startNode("a", 0)
	ids := c.submit(10, &warrenv1.Script{Steps: 30, StepMillis: 50})
	waitFor(t, "tasks running on a", 20*time.Second, func() bool { return a.Running() == 10 })
	waitFor(t, "a few steps done", 20*time.Second, func() bool { return c.task(ids[0]).GetNextSeq() > 8 })
	a.Partition(true)
	b := c.startNode("b", 0)
	waitFor(t, "a declared down", 20*time.Second, func() bool {
		n, _ := c.node("a")
		return n.GetStatus() == warrenv1.NodeStatus_NODE_STATUS_DOWN
	})
	waitFor(t, "a's tasks re-placed on b", 20*time.Second, func() bool { return b.Running() == 10 })
	time.Sleep(300 * time.Millisecond) // a keeps trying to append, blind
	a.Partition(false)
	waitFor(t, "a's actors stop", 20*time.Second, func() bool { return a.Running() == 0 })
	waitFor(t, "all tasks to succeed", 60*time.Second, c.allEnded(ids))
	for _, id := range ids {
		nodes := checkLog(t, id, c.events(id), 30)
		if !nodes["b"] {
			t.Fatalf("task %s: no effect recorded by b, the new owner: %v", id, nodes)
		}
	}
	if st := a.Stats(); st.StoppedStale+st.Stopped == 0 {
		t.Fatalf("a's actors were not stopped by the fence: %+v", st)
	}
}

func TestDrainMovesTasks(t *testing.T) {
	c := startCluster(t, 1, 0)
	a := c.startNode("a", 0)
	ids := c.submit(10, &warrenv1.Script{Steps: 20, StepMillis: 50})
	waitFor(t, "tasks running on a", 20*time.Second, func() bool { return a.Running() == 10 })
	b := c.startNode("b", 0)
	if _, err := c.cl.Cluster().DrainNode(context.Background(), connect.NewRequest(&warrenv1.DrainNodeRequest{Id: "a"})); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "all tasks to succeed", 60*time.Second, c.allEnded(ids))
	for _, id := range ids {
		nodes := checkLog(t, id, c.events(id), 20)
		if !nodes["b"] {
			t.Fatalf("task %s never moved to b: %v", id, nodes)
		}
	}
	if st := a.Stats(); st.Yielded != 10 {
		t.Fatalf("a yielded %d tasks, want 10: %+v", st.Yielded, st)
	}
	_ = b
}

// An uncordon before the tasks' next step boundary takes back the drain's
// requests to give them back: the tasks stay on the node and finish there.
func TestUncordonKeepsTasks(t *testing.T) {
	c := startCluster(t, 1, 0)
	a := c.startNode("a", 0)
	// One long step: the drain and the uncordon both land inside it.
	ids := c.submit(4, &warrenv1.Script{Steps: 1, StepMillis: 15000})
	waitFor(t, "tasks running on a", 20*time.Second, func() bool {
		for _, id := range ids {
			if c.task(id).GetState() != warrenv1.TaskState_TASK_STATE_RUNNING {
				return false
			}
		}
		return a.Running() == 4
	})
	ctx := context.Background()
	if _, err := c.cl.Cluster().DrainNode(ctx, connect.NewRequest(&warrenv1.DrainNodeRequest{Id: "a"})); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a to be asked to give its tasks back", 5*time.Second, func() bool { return a.Stats().YieldAsked >= 4 })
	if _, err := c.cl.Cluster().UncordonNode(ctx, connect.NewRequest(&warrenv1.NodeRequest{Id: "a"})); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the requests to be withdrawn", 5*time.Second, func() bool { return a.Stats().YieldWithdrawn >= 4 })
	waitFor(t, "all tasks to succeed", 60*time.Second, c.allEnded(ids))
	if st := a.Stats(); st.Yielded != 0 {
		t.Fatalf("a gave back %d tasks after the uncordon: %+v", st.Yielded, st)
	}
	for _, id := range ids {
		if tk := c.task(id); tk.GetState() != warrenv1.TaskState_TASK_STATE_SUCCEEDED || tk.GetLease().GetEpoch() != 1 {
			t.Fatalf("task %s: %s at epoch %d, want succeeded under its first lease", id, tk.GetState(), tk.GetLease().GetEpoch())
		}
	}
}

// A session that ends takes its requests to give tasks back with it (only
// its leader could withdraw them); the next session's leader asks again
// while the node drains, and an uncordon then withdraws those.
func TestYieldRequestsEndWithTheSession(t *testing.T) {
	c := startCluster(t, 1, 0)
	a := c.startNode("a", 0)
	// One long step: everything below lands inside it.
	ids := c.submit(4, &warrenv1.Script{Steps: 1, StepMillis: 20000})
	waitFor(t, "tasks running on a", 20*time.Second, func() bool { return a.Running() == 4 })
	ctx := context.Background()
	if _, err := c.cl.Cluster().DrainNode(ctx, connect.NewRequest(&warrenv1.DrainNodeRequest{Id: "a"})); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a to be asked to give its tasks back", 5*time.Second, func() bool { return a.Stats().YieldAsked == 4 })
	sessions := a.Stats().Sessions
	a.Partition(true) // cuts the session; the steps are mid-command, with no appends
	waitFor(t, "the requests to be dropped", 5*time.Second, func() bool { return a.Stats().YieldWithdrawn == 4 })
	a.Partition(false)
	waitFor(t, "a new session", 10*time.Second, func() bool { return a.Stats().Sessions > sessions })
	waitFor(t, "a to be asked again", 5*time.Second, func() bool { return a.Stats().YieldAsked == 8 })
	if _, err := c.cl.Cluster().UncordonNode(ctx, connect.NewRequest(&warrenv1.NodeRequest{Id: "a"})); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the requests to be withdrawn", 5*time.Second, func() bool { return a.Stats().YieldWithdrawn == 8 })
	waitFor(t, "all tasks to succeed", 60*time.Second, c.allEnded(ids))
	if st := a.Stats(); st.Yielded != 0 || st.YieldAsked != st.YieldWithdrawn {
		t.Fatalf("stats %+v: want every request withdrawn and no task given back", st)
	}
}

func TestCancelStopsRunningTask(t *testing.T) {
	c := startCluster(t, 1, 0)
	a := c.startNode("a", 0)
	ids := c.submit(3, &warrenv1.Script{Steps: 200, StepMillis: 20})
	waitFor(t, "tasks running", 20*time.Second, func() bool {
		return a.Running() == 3 && c.task(ids[0]).GetState() == warrenv1.TaskState_TASK_STATE_RUNNING
	})
	for _, id := range ids {
		if _, err := c.cl.Tasks().CancelTask(context.Background(), connect.NewRequest(&warrenv1.CancelTaskRequest{TaskId: id, Reason: "test"})); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "tasks cancelled", 20*time.Second, func() bool {
		for _, id := range ids {
			if c.task(id).GetState() != warrenv1.TaskState_TASK_STATE_CANCELLED {
				return false
			}
		}
		return a.Running() == 0
	})
	for _, id := range ids {
		evs := c.events(id)
		last := evs[len(evs)-1]
		if last.GetKind() != "state_changed" || !strings.Contains(string(last.GetPayload()), `"to":"cancelled"`) || last.GetEpoch() == 0 {
			t.Fatalf("task %s: last event %s %s (epoch %d), want the node's state_changed to cancelled", id, last.GetKind(), last.GetPayload(), last.GetEpoch())
		}
	}
}

// A cancel interrupts a scripted step that runs the spec's own command
// (here a day's sleep, on the simulated driver, which sleeps until its
// context ends): the task is cancelled within seconds. It stayed running
// until the command ended, since a scripted actor heard of the cancel
// only from its next append, after the command.
func TestCancelInterruptsAScriptedCommand(t *testing.T) {
	c := startCluster(t, 1, 0)
	a := c.startNode("a", 0)
	ids := c.submit(1, &warrenv1.Script{Steps: 1, Command: "sleep 86400"})
	waitFor(t, "task running its command", 20*time.Second, func() bool {
		res, err := c.cl.Tasks().ListEvents(context.Background(), connect.NewRequest(&warrenv1.ListEventsRequest{TaskId: ids[0]}))
		if err != nil {
			return false
		}
		for _, e := range res.Msg.GetEvents() {
			if e.GetKind() == "tool_call" {
				return true
			}
		}
		return false
	})
	if _, err := c.cl.Tasks().CancelTask(context.Background(), connect.NewRequest(&warrenv1.CancelTaskRequest{TaskId: ids[0], Reason: "test"})); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "task cancelled", 15*time.Second, func() bool {
		return c.task(ids[0]).GetState() == warrenv1.TaskState_TASK_STATE_CANCELLED && a.Running() == 0
	})
}

// A warm-pool target set on the cluster reaches a node that joins later:
// the leader sends the targets when a node's session opens.
func TestPoolTargetReachesLaterNodes(t *testing.T) {
	c := startCluster(t, 1, 3*time.Second)
	sc := warrenv1connect.NewSandboxServiceClient(http.DefaultClient, c.servers[0].url)
	if _, err := sc.SetPoolTarget(context.Background(), connect.NewRequest(&warrenv1.SetPoolTargetRequest{Template: "default", Target: 3})); err != nil {
		t.Fatal(err)
	}
	drv := sim.New(sim.Config{})
	d, err := noded.Start(noded.Config{ID: "late", DataDir: filepath.Join(c.dir, "node-late"), Servers: c.urls(), GossipAddr: freeaddr.Loopback(t),
		JoinGossip: c.gossip, Driver: drv, Capacity: &warrenv1.Resources{MilliCpu: 1000, MemoryBytes: 1 << 30}})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	waitFor(t, "the node to get the pool target", 10*time.Second, func() bool { return drv.Target("default") == 3 })
}

// `warren pool set default 0` while a node is away removes the cluster's
// record; the node, back, restores its old target from its pools.json,
// and the new session's complete set of targets (which does not name
// default) sets it to 0.
func TestPoolTargetRemovedWhileANodeWasAwayReachesIt(t *testing.T) {
	c := startCluster(t, 1, 2*time.Second)
	sc := warrenv1connect.NewSandboxServiceClient(http.DefaultClient, c.servers[0].url)
	set := func(tpl string, n uint32) {
		t.Helper()
		// Unreachable nodes are reported, not an error.
		if _, err := sc.SetPoolTarget(context.Background(), connect.NewRequest(&warrenv1.SetPoolTargetRequest{Template: tpl, Target: n})); err != nil {
			t.Fatal(err)
		}
	}
	dataDir := filepath.Join(c.dir, "node-away")
	start := func(drv *sim.Driver) *noded.Daemon {
		d, err := noded.Start(noded.Config{ID: "away", DataDir: dataDir, Servers: c.urls(), GossipAddr: freeaddr.Loopback(t),
			JoinGossip: c.gossip, Driver: drv, SandboxListen: "127.0.0.1:0",
			Capacity: &warrenv1.Resources{MilliCpu: 1000, MemoryBytes: 1 << 30}})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	drv1 := sim.New(sim.Config{})
	d1 := start(drv1)
	set("default", 3)
	waitFor(t, "the node to get the target", 10*time.Second, func() bool { return drv1.Target("default") == 3 })
	d1.Close()
	waitFor(t, "the node to be down", 15*time.Second, func() bool {
		n, err := c.node("away")
		return err == nil && n.GetStatus() == warrenv1.NodeStatus_NODE_STATUS_DOWN
	})

	set("default", 0) // the operator drops the pool while the node is away
	set("marker", 1)  // to know when the new session delivered the targets

	// What the node restores at start, before its session is up.
	if b, err := os.ReadFile(filepath.Join(dataDir, "pools.json")); err != nil || !strings.Contains(string(b), `"default":3`) {
		t.Fatalf("pools.json: %s %v; want default's 3 saved", b, err)
	}
	drv2 := sim.New(sim.Config{})
	d2 := start(drv2)
	defer d2.Close()
	waitFor(t, "the new session's targets", 10*time.Second, func() bool { return drv2.Target("marker") == 1 })
	waitFor(t, "the removed target to reach the node", 10*time.Second, func() bool { return drv2.Target("default") == 0 })
}
