// Command recovery measures how fast a warren cluster moves the tasks of a
// dead node: 3 server processes and -nodes `warren node --driver sim`
// processes (SIMULATED sandboxes; real sessions, heartbeats, memberlist,
// raft and Pebble) on loopback run -tasks scripted tasks; once every task
// runs, one node is SIGKILLed. For each task it held, recovery time is
// from the SIGKILL to the first event appended by the task's new owner
// (its state_changed to running under the new lease epoch, as stamped by
// the server). It prints p50, p99 and max over those tasks (goal: p99 ≤ 3 s
// with the default 3 s TTL), how long the node took to be declared down and
// by which signal, and then the placement throughput of the scheduler's
// Place function for -place-tasks pending tasks over -place-nodes
// simulated nodes (goal: ≥ 5,000 placements/s), median of -place-runs.
//
// Run from the repository root:
//
//	go run ./bench/recovery                          # builds cmd/warren itself
//	go run ./bench/recovery -warren bin/warren -runs 3 -out bench/results/recovery.md
package main

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"

	"connectrpc.com/connect"

	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
	"github.com/warrenhq/warren/api/gen/warren/v1/warrenv1connect"
	"github.com/warrenhq/warren/bench/internal/cluster"
	"github.com/warrenhq/warren/scheduler"
)

type config struct {
	binary                            string
	runs, nodes, tasks, steps         int
	stepMillis                        int
	ttl                               time.Duration
	placeTasks, placeNodes, placeRuns int
	out                               string
	keep                              bool
	gossip                            bool
}

func main() {
	var c config
	flag.StringVar(&c.binary, "warren", "", "path to the warren binary (default: go build ./cmd/warren into a temp dir)")
	flag.IntVar(&c.runs, "runs", 1, "node kills, each on a fresh cluster")
	flag.IntVar(&c.nodes, "nodes", 3, "node daemon processes")
	flag.IntVar(&c.tasks, "tasks", 330, "scripted tasks (the victim holds about tasks/nodes of them)")
	flag.IntVar(&c.steps, "steps", 100, "scripted steps per task (long enough that none ends before the kill)")
	flag.IntVar(&c.stepMillis, "step-millis", 200, "how long each scripted step's command runs (ms)")
	flag.DurationVar(&c.ttl, "node-ttl", 3*time.Second, "the servers' --node-ttl")
	flag.IntVar(&c.placeTasks, "place-tasks", 10000, "placement: pending tasks")
	flag.IntVar(&c.placeNodes, "place-nodes", 500, "placement: simulated nodes")
	flag.IntVar(&c.placeRuns, "place-runs", 5, "placement: runs (median reported)")
	flag.BoolVar(&c.gossip, "gossip", true, "run memberlist (false: only the heartbeat TTL detects the dead node)")
	flag.StringVar(&c.out, "out", "", "also write the results as markdown to this file")
	flag.BoolVar(&c.keep, "keep", false, "keep data directories and logs")
	flag.Parse()
	if flag.NArg() > 0 || c.runs < 1 || c.nodes < 2 || c.tasks < 1 || c.steps < 1 {
		fmt.Fprintln(os.Stderr, "usage: recovery [-runs N>=1] [-nodes N>=2] [-tasks N>=1] [-steps N>=1] ...")
		os.Exit(2)
	}
	os.Exit(cluster.Run(func(ctx context.Context) error { return run(ctx, c) }))
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s  %s\n", time.Now().Format("15:04:05.000"), fmt.Sprintf(format, args...))
}

type runResult struct {
	held       int
	recovered  []time.Duration
	detect     time.Duration
	reason     string
	falseDowns int
}

func run(ctx context.Context, c config) error {
	if c.binary == "" {
		b, err := cluster.Build(ctx, logf)
		if err != nil {
			return err
		}
		c.binary = b
	}
	var results []runResult
	for i := range c.runs {
		logf("run %d/%d", i+1, c.runs)
		r, err := oneRun(ctx, c)
		if err != nil {
			return err
		}
		results = append(results, r)
		logf("  victim held %d tasks; declared down after %v (%s); recovery p50 %v p99 %v max %v",
			r.held, r.detect.Round(time.Millisecond), r.reason, pct(r.recovered, 50), pct(r.recovered, 99), pct(r.recovered, 100))
	}
	var all []time.Duration
	var detects []time.Duration
	falseDowns := 0
	for _, r := range results {
		all = append(all, r.recovered...)
		detects = append(detects, r.detect)
		falseDowns += r.falseDowns
	}
	logf("placement: %d pending tasks over %d simulated nodes, %d runs", c.placeTasks, c.placeNodes, c.placeRuns)
	rate, per := placement(c)

	var b strings.Builder
	fmt.Fprintf(&b, "# Node-failure recovery and placement\n\n")
	fmt.Fprintf(&b, "Measured %s on %d CPUs (%s/%s): `go run ./bench/recovery -runs %d -nodes %d -tasks %d -steps %d -step-millis %d -node-ttl %v -gossip=%v`.\n\n",
		time.Now().UTC().Format("2006-01-02"), runtime.NumCPU(), runtime.GOOS, runtime.GOARCH, c.runs, c.nodes, c.tasks, c.steps, c.stepMillis, c.ttl, c.gossip)
	fmt.Fprintf(&b, "3 server processes and %d `warren node --driver sim` processes (simulated sandboxes; real sessions, heartbeats every 500 ms, memberlist, raft and Pebble with sync) on loopback. Recovery time is from the node's SIGKILL to the first event appended by each task's new owner, stamped by the server.\n\n", c.nodes)
	fmt.Fprintf(&b, "| metric | value |\n|---|---|\n")
	fmt.Fprintf(&b, "| tasks recovered (over %d kills) | %d |\n", c.runs, len(all))
	fmt.Fprintf(&b, "| recovery p50 | %v |\n| recovery p99 | %v |\n| recovery max | %v |\n", pct(all, 50), pct(all, 99), pct(all, 100))
	fmt.Fprintf(&b, "| node declared down after (median of kills) | %v |\n", pct(detects, 50))
	reasons := map[string]int{}
	for _, r := range results {
		reasons[r.reason]++
	}
	for reason, n := range reasons {
		fmt.Fprintf(&b, "| declared down by | %s (%d of %d kills) |\n", reason, n, c.runs)
	}
	fmt.Fprintf(&b, "| healthy nodes falsely declared down | %d |\n", falseDowns)
	fmt.Fprintf(&b, "| placement, %d tasks over %d simulated nodes (median of %d) | %.0f placements/s (%v per plan) |\n", c.placeTasks, c.placeNodes, c.placeRuns, rate, per.Round(time.Millisecond))
	fmt.Print("\n" + b.String())
	if c.out != "" {
		return os.WriteFile(c.out, []byte(b.String()), 0o644)
	}
	return nil
}

func oneRun(ctx context.Context, c config) (runResult, error) {
	var r runResult
	cl, err := cluster.Start(ctx, cluster.Options{Binary: c.binary, Gossip: c.gossip, Keep: c.keep, Logf: logf,
		ServerArgs: []string{"--log-level", "warn", "--node-ttl", c.ttl.String()}})
	if err != nil {
		return r, err
	}
	defer cl.Close()
	fail := func(err error) (runResult, error) { return r, fmt.Errorf("%w\n%s", err, cl.LogTails(10)) }
	for i := range c.nodes {
		id := fmt.Sprintf("n%d", i+1)
		if _, err := cl.StartDaemon(id, "--capacity", "cpu=10000,mem=10000GiB", "--labels", "zone="+id, "--log-level", "warn"); err != nil {
			return fail(err)
		}
	}
	hc := cluster.HTTPClient(false, 16)
	var tasks warrenv1connect.TaskServiceClient
	var clu warrenv1connect.ClusterServiceClient
	pick := func() {
		for _, s := range cl.Nodes {
			if s.Running() {
				tasks = warrenv1connect.NewTaskServiceClient(hc, s.URL)
				clu = warrenv1connect.NewClusterServiceClient(hc, s.URL)
				return
			}
		}
	}
	pick()
	nodes := func() map[string]*warrenv1.Node {
		resp, err := clu.ListNodes(ctx, connect.NewRequest(&warrenv1.ListNodesRequest{}))
		if err != nil {
			return nil
		}
		out := map[string]*warrenv1.Node{}
		for _, n := range resp.Msg.GetNodes() {
			out[n.GetId()] = n
		}
		return out
	}
	if err := wait(ctx, 30*time.Second, "all nodes ready", func() bool {
		ready := 0
		for _, n := range nodes() {
			if n.GetStatus() == warrenv1.NodeStatus_NODE_STATUS_READY {
				ready++
			}
		}
		return ready == c.nodes
	}); err != nil {
		return fail(err)
	}
	logf("  %d nodes ready; submitting %d tasks of %d steps x %d ms", c.nodes, c.tasks, c.steps, c.stepMillis)
	for i := range c.tasks {
		_, err := tasks.CreateTask(ctx, connect.NewRequest(&warrenv1.CreateTaskRequest{RequestId: fmt.Sprint("rec-", i),
			Spec: &warrenv1.TaskSpec{Repo: "https://example.com/r.git", Base: "main", IssueTitle: fmt.Sprint("recovery ", i),
				Driver: "sim", Script: &warrenv1.Script{Steps: uint32(c.steps), StepMillis: uint32(c.stepMillis)}}}))
		if err != nil {
			return fail(err)
		}
	}
	running := func() []*warrenv1.Task {
		var out []*warrenv1.Task
		if cluster.EachTask(ctx, tasks, warrenv1.TaskState_TASK_STATE_RUNNING, func(t *warrenv1.Task) { out = append(out, t) }) != nil {
			return nil
		}
		return out
	}
	if err := wait(ctx, 120*time.Second, "every task running", func() bool { return len(running()) == c.tasks }); err != nil {
		return fail(err)
	}
	time.Sleep(time.Second)
	victim := cl.Daemons[0]
	held := map[string]uint64{} // task -> epoch on the victim
	for _, t := range running() {
		if t.GetLease().GetNode() == victim.ID {
			held[t.GetId()] = t.GetLease().GetEpoch()
		}
	}
	r.held = len(held)
	logf("  SIGKILL %s, which holds %d tasks", victim.ID, len(held))
	killed := victim.Kill()
	if err := wait(ctx, 60*time.Second, "the victim declared down", func() bool {
		n := nodes()[victim.ID]
		return n.GetStatus() == warrenv1.NodeStatus_NODE_STATUS_DOWN
	}); err != nil {
		return fail(err)
	}
	vn := nodes()[victim.ID]
	r.detect = vn.GetStatusChangedAt().AsTime().Sub(killed)
	r.reason = vn.GetStatusReason()
	if strings.HasPrefix(r.reason, "no heartbeat") {
		r.reason = "heartbeat TTL"
	}
	// Wait until every held task has an event from its new owner.
	pendingIDs := map[string]bool{}
	for id := range held {
		pendingIDs[id] = true
	}
	if err := wait(ctx, 60*time.Second, "every moved task's new owner to append", func() bool {
		for id := range pendingIDs {
			at, st, _ := cluster.FirstOwnerEvent(ctx, tasks, id, held[id])
			if st != cluster.Recovered {
				return false
			}
			r.recovered = append(r.recovered, at.Sub(killed))
			delete(pendingIDs, id)
		}
		return true
	}); err != nil {
		return fail(err)
	}
	for id, n := range nodes() {
		if id != victim.ID && n.GetStatus() != warrenv1.NodeStatus_NODE_STATUS_READY {
			r.falseDowns++
		}
	}
	return r, nil
}

func wait(ctx context.Context, d time.Duration, what string, cond func() bool) error {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %v waiting for %s", d, what)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return nil
}

func pct(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := (len(s)*p + 99) / 100
	return s[min(max(i-1, 0), len(s)-1)].Round(time.Millisecond)
}

// placement times scheduler.Place for placeTasks pending tasks over
// placeNodes simulated nodes (16 cores, 64 GiB, three zones, warm pools)
// and returns the median rate.
func placement(c config) (float64, time.Duration) {
	var times []time.Duration
	for i := range c.placeRuns {
		nodes := make([]scheduler.PlacementNode, c.placeNodes)
		for j := range nodes {
			nodes[j] = scheduler.PlacementNode{ID: fmt.Sprintf("sim%04d", j), Status: scheduler.NodeReady, Eligible: true,
				Drivers: []string{"sim"}, Templates: []string{"py", "go"}, WarmTemplates: map[string]int{"py": 2},
				Capacity: scheduler.Resources{MilliCPU: 16000, MemoryBytes: 64 << 30},
				Labels:   map[string]string{"zone": []string{"a", "b", "c"}[j%3]}}
		}
		tasks := make([]scheduler.PendingTask, c.placeTasks)
		for j := range tasks {
			tasks[j] = scheduler.PendingTask{ID: fmt.Sprintf("t%06d", j), Driver: "sim", Template: []string{"", "py", "go"}[j%3],
				Needs: scheduler.Resources{MilliCPU: 500, MemoryBytes: 1 << 30}}
		}
		start := time.Now()
		plan := scheduler.Place(nodes, tasks, scheduler.PlacementConfig{SpreadLabel: "zone"}, rand.New(rand.NewPCG(uint64(i), 1)))
		d := time.Since(start)
		if len(plan.Placements) != c.placeTasks {
			logf("  run %d placed %d of %d", i, len(plan.Placements), c.placeTasks)
		}
		times = append(times, d)
	}
	slices.Sort(times)
	m := times[len(times)/2]
	return float64(c.placeTasks) / m.Seconds(), m
}
