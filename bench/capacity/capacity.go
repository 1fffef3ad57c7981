// Package capacity is `warren bench capacity`: it starts a real 3-server
// cluster (separate processes, raft on loopback, Pebble on disk with sync)
// and N node daemons with the SIMULATED sandbox driver (many per process,
// with real memberlist, sessions and heartbeats), submits T tasks that run
// scripted trajectories (no model is called: steps are SIMULATED model
// steps whose durations and event sizes are drawn from distributions and
// compressed by a time scale), keeps them all concurrent, and measures
// placement, event appends, raft apply batches, CPU and memory; then it
// SIGKILLs 10% of the nodes and later the leader and measures recovery.
// It checks the invariants at the end (no event lost or duplicated, every
// effect once, no task stuck) and writes JSON, markdown and an SVG chart.
package capacity

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"

	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
	"github.com/warrenhq/warren/api/gen/warren/v1/warrenv1connect"
	"github.com/warrenhq/warren/bench/internal/cluster"
	"github.com/warrenhq/warren/noded"
)

// Options are a run's settings.
type Options struct {
	Preset          string        `json:"preset"`
	Servers         int           `json:"servers"`
	Nodes           int           `json:"nodes"`
	NodesPerProcess int           `json:"nodes_per_process"`
	Tasks           int           `json:"tasks"`
	Steps           int           `json:"steps"`
	StepMedian      time.Duration `json:"step_median"`    // a real step's median duration, before time scaling
	TimeScale       float64       `json:"time_scale"`     // step durations are divided by this
	OutputMedian    int           `json:"output_median"`  // median tool output bytes per step
	SteadySeconds   float64       `json:"steady_seconds"` // measuring window before the faults
	KillFraction    float64       `json:"kill_fraction"`  // of the nodes, in whole node processes
	CheckLogs       int           `json:"check_logs"`     // logs to check at the end; 0 = all
	// Finish is how the run ends after the faults: "run" waits for every
	// task to succeed; "cancel" cancels them all (each ends at its next
	// step boundary) and waits for every task to end, which bounds a run
	// whose tasks would take most of an hour.
	Finish string `json:"finish"`
	// FleetNice runs the node processes under nice(1) at this value (0:
	// not niced). The servers then keep their cores, as on a deployment
	// where the fleet runs on other machines, and a fleet that offers more
	// than the servers sustain is slowed instead of starving raft's
	// heartbeats.
	FleetNice int           `json:"fleet_nice"`
	Timeout   time.Duration `json:"timeout"` // the whole run
	Binary    string        `json:"-"`       // the warren binary
	OutDir    string        `json:"-"`       // where results go
	Keep      bool          `json:"-"`       // keep data and logs
	Seed      uint64        `json:"seed"`
}

// Presets.
var Presets = map[string]Options{
	// default runs steps at half speed (a 40 s median; the model call and
	// the tool run of a coding agent's step take tens of seconds): 40,000
	// tasks then offer about 3,000 events/s in 2,000 append calls/s, two
	// thirds of what this control plane sustained at 40,000 tasks on a
	// 2-core box (about 4,700 events/s). In real time they offered 6,000/s:
	// appends queued for seconds, the starved leader lost its lease, and
	// new leaders declared healthy nodes down. Its tasks would need 27-53
	// minutes to finish, so it cancels them after the faults.
	"default": {Preset: "default", Servers: 3, Nodes: 1000, NodesPerProcess: 100, Tasks: 40000, Steps: 40,
		StepMedian: 20 * time.Second, TimeScale: 0.5, OutputMedian: 1024, SteadySeconds: 30, KillFraction: 0.1,
		CheckLogs: 2000, Timeout: 60 * time.Minute, Finish: "cancel"},
	"ci": {Preset: "ci", Servers: 3, Nodes: 50, NodesPerProcess: 5, Tasks: 2000, Steps: 40,
		StepMedian: 20 * time.Second, TimeScale: 20, OutputMedian: 1024, SteadySeconds: 10, KillFraction: 0.1,
		CheckLogs: 0, Timeout: 10 * time.Minute, Finish: "run"},
}

// run is the state of one run.
type run struct {
	o     Options
	out   io.Writer // progress
	cl    *cluster.Cluster
	hc    *http.Client
	rep   *Report
	t0    time.Time // first task submitted
	start time.Time

	mu       sync.Mutex
	samples  []Sample
	prev     map[string]noded.MetricsSnapshot // per fleet process, last sample
	hist     []uint64                         // summed histogram of the last sample
	cpuPrev  map[string]time.Duration
	cpuAt    time.Time
	leaderID atomic.Value // string
	peakRSS  map[string]int64
	base     noded.MetricsSnapshot // aggregate at the start
	stopS    chan struct{}
	doneS    chan struct{}
}

// Run performs one capacity run and writes its report.
func Run(ctx context.Context, o Options, progress io.Writer) (*Report, error) {
	if o.Binary == "" {
		return nil, errors.New("capacity: no warren binary")
	}
	if o.NodesPerProcess <= 0 || o.Nodes%o.NodesPerProcess != 0 {
		return nil, fmt.Errorf("nodes: %d must be a multiple of nodes-per-process %d", o.Nodes, o.NodesPerProcess)
	}
	if o.Tasks < 1 || o.Steps < 1 || o.TimeScale <= 0 || o.Servers < 3 {
		return nil, errors.New("tasks, steps and time-scale must be positive, and servers at least 3")
	}
	if o.Finish != "run" && o.Finish != "cancel" {
		return nil, fmt.Errorf("finish: %q is not run or cancel", o.Finish)
	}
	if o.Seed == 0 {
		o.Seed = uint64(time.Now().UnixNano())
	}
	r := &run{o: o, out: progress, start: time.Now(), prev: map[string]noded.MetricsSnapshot{}, cpuPrev: map[string]time.Duration{},
		peakRSS: map[string]int64{}, stopS: make(chan struct{}), doneS: make(chan struct{}), hc: cluster.HTTPClient(false, 64)}
	r.leaderID.Store("")
	r.rep = &Report{Preset: o.Preset, Started: r.start.UTC(), Config: o, Machine: machine(),
		Command: fmt.Sprintf("warren bench capacity --preset %s", o.Preset),
		Real: []string{"3 warren server processes: raft over loopback TCP, Pebble on disk with every acknowledged write synced",
			fmt.Sprintf("%d node daemons in %d processes: memberlist gossip (UDP/TCP), sessions with the leader, heartbeats every 500 ms, task actors, batched appends over HTTP", o.Nodes, o.Nodes/o.NodesPerProcess),
			"SIGKILL of node processes and of the leader"},
		Simulated: []string{"sandboxes: the sim driver (in memory; a step's command is a timed sleep, no process runs)",
			"the model: tasks run scripted steps (tool_call, then effect and tool_result in one append, per step) with durations and output sizes drawn from distributions; no model is called",
			fmt.Sprintf("time: step durations are divided by %g", o.TimeScale)},
		DetectedBy: map[string]int{}}
	if o.FleetNice > 0 {
		r.rep.Real = append(r.rep.Real, fmt.Sprintf("one box: the node processes run at nice %d, so the servers keep priority on the shared cores, as they would on their own machines", o.FleetNice))
	}
	if o.Finish == "cancel" {
		r.rep.Real = append(r.rep.Real, "the end: after the faults every task is cancelled (it ends at its next step boundary) instead of running its 40 steps to the end")
	}
	rep, err := r.do(ctx)
	if err != nil && r.cl != nil {
		r.rep.Violations = append(r.rep.Violations, "run failed: "+firstLine(err.Error()))
		if !r.t0.IsZero() {
			r.rep.TotalSeconds = time.Since(r.t0).Seconds()
			r.rep.Overall = window(r.base, r.aggregate())
		}
		r.finish() // report what was measured before the failure
		rep = r.rep
	}
	if r.cl != nil {
		r.cl.Close()
	}
	return rep, err
}

func (r *run) logf(format string, args ...any) {
	fmt.Fprintf(r.out, "%7.1fs  %s\n", time.Since(r.start).Seconds(), fmt.Sprintf(format, args...))
}

func (r *run) do(ctx context.Context) (*Report, error) {
	o := r.o
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	var err error
	r.logf("starting %d servers", o.Servers)
	r.cl, err = cluster.Start(ctx, cluster.Options{Binary: o.Binary, Servers: o.Servers, Gossip: true, Keep: o.Keep, DaemonNice: o.FleetNice,
		ServerArgs: []string{"--log-level", "warn", "--pprof"}, Logf: func(f string, a ...any) { r.logf(f, a...) }})
	if err != nil {
		return nil, err
	}
	procs := o.Nodes / o.NodesPerProcess
	r.logf("starting %d node processes x %d simulated nodes", procs, o.NodesPerProcess)
	nodesStart := time.Now()
	for i := range procs {
		// Room for twice the average share of tasks: bin-packing then fills
		// nodes to about that and spreads the rest, as on a real fleet,
		// instead of packing a whole zone's tasks onto its first nodes.
		cpu := max(4, 2*((o.Tasks+o.Nodes-1)/o.Nodes))
		if _, err := r.cl.StartFleet(fmt.Sprintf("h%03d", i+1), o.NodesPerProcess,
			"--capacity", fmt.Sprintf("cpu=%d,mem=4000GiB", cpu), "--labels", fmt.Sprintf("zone=z%d", i%3), "--log-level", "warn", "--pprof"); err != nil {
			return nil, err
		}
	}
	if err := r.wait(ctx, 5*time.Minute, "every node ready", func() (bool, string) {
		for _, d := range r.cl.Daemons {
			if !d.Running() {
				return false, "node process " + d.ID + " exited"
			}
		}
		n, _ := r.readyNodes(ctx)
		return n == o.Nodes, fmt.Sprintf("%d/%d nodes ready", n, o.Nodes)
	}); err != nil {
		return nil, r.withLogs(err)
	}
	r.rep.NodesReadySeconds = time.Since(nodesStart).Seconds()
	r.rep.NodeProcesses, r.rep.NodesPerProcess = procs, o.NodesPerProcess
	r.logf("%d nodes ready in %.1fs", o.Nodes, r.rep.NodesReadySeconds)
	rssBefore := r.fleetRSS()
	r.base = r.aggregate()
	go r.sampler(ctx)
	defer func() { close(r.stopS); <-r.doneS }()

	// Submit.
	r.t0 = time.Now()
	ids, err := r.submit(ctx)
	if err != nil {
		return nil, r.withLogs(err)
	}
	r.rep.SubmitSeconds = time.Since(r.t0).Seconds()
	r.logf("submitted %d tasks in %.1fs", o.Tasks, r.rep.SubmitSeconds)
	if err := r.wait(ctx, 10*time.Minute, "every task running", func() (bool, string) {
		a := r.aggregate()
		n := int(a.RecordedRunning - r.base.RecordedRunning)
		return n >= o.Tasks, fmt.Sprintf("%d/%d tasks running", n, o.Tasks)
	}); err != nil {
		return nil, r.withLogs(err)
	}
	r.rep.AllRunningSeconds = time.Since(r.t0).Seconds()
	r.rep.PlacementsPerSec = float64(o.Tasks) / r.rep.AllRunningSeconds
	r.logf("all %d tasks placed and running %.1fs after the first submission (%.0f/s)", o.Tasks, r.rep.AllRunningSeconds, r.rep.PlacementsPerSec)
	r.mark("all running")

	// Steady state, after one median step: the tasks started within
	// seconds of one another, so until their first steps end they append
	// little, and then all at once.
	warm := time.Duration(float64(o.StepMedian) / o.TimeScale)
	r.logf("warming up for %s (one median step) before measuring", warm.Round(100*time.Millisecond))
	if err := sleep(ctx, warm); err != nil {
		return nil, err
	}
	r.mark("steady")
	steadyFrom, aFrom := time.Now(), r.aggregate()
	st0, _ := r.leaderStatus(ctx)
	cpu0 := r.cpuTimes()
	profDone := r.profile(ctx, time.Duration(min(o.SteadySeconds, 30)*float64(time.Second)))
	if err := sleep(ctx, time.Duration(o.SteadySeconds*float64(time.Second))); err != nil {
		return nil, err
	}
	aTo := r.aggregate()
	r.rep.Steady = window(aFrom, aTo)
	if st1, err := r.leaderStatus(ctx); err == nil && st0 != nil {
		r.rep.ApplyEntries = st1.GetAppliedEntries() - st0.GetAppliedEntries()
		r.rep.ApplyCommands = st1.GetAppliedCommands() - st0.GetAppliedCommands()
		if r.rep.ApplyEntries > 0 {
			r.rep.CommandsPerEntry = float64(r.rep.ApplyCommands) / float64(r.rep.ApplyEntries)
		}
		for i, v := range st1.GetCommandsPerEntry() {
			var before uint64
			if i < len(st0.GetCommandsPerEntry()) {
				before = st0.GetCommandsPerEntry()[i]
			}
			r.rep.CommandsPerEntryHis = append(r.rep.CommandsPerEntryHis, v-before)
		}
	}
	cpu1 := r.cpuTimes()
	el := time.Since(steadyFrom).Seconds()
	leader := r.leaderID.Load().(string)
	for id, c := range cpu1 {
		d := (c - cpu0[id]).Seconds() / el
		switch {
		case id == leader:
			r.rep.LeaderCPUCores = d
			r.rep.ServerCPUCores += d
		case strings.HasPrefix(id, "s"):
			r.rep.ServerCPUCores += d
		default:
			r.rep.NodeCPUCores += d
		}
	}
	rssAfter := r.fleetRSS()
	var growth int64
	for id, v := range rssAfter {
		growth += v - rssBefore[id]
	}
	if aTo.Running > 0 {
		r.rep.BytesPerTaskActor = float64(growth) / float64(aTo.Running)
	}
	<-profDone
	r.logf("steady %.0fs: %.0f events/s in %.0f appends/s, p50 %.1f ms, p99 %.1f ms, p999 %.1f ms; %.1f commands per raft entry",
		el, r.rep.Steady.EventsPerSec, r.rep.Steady.AppendsPerSec, r.rep.Steady.P50Ms, r.rep.Steady.P99Ms, r.rep.Steady.P999Ms, r.rep.CommandsPerEntry)

	// Fault 1: kill 10% of the nodes (whole processes).
	if err := r.killNodes(ctx); err != nil {
		return nil, r.withLogs(err)
	}
	// Fault 2: kill the leader.
	if err := r.killLeader(ctx); err != nil {
		return nil, r.withLogs(err)
	}

	// The end: every task must end (succeed, or with --finish cancel be
	// cancelled); a task making no progress is stuck.
	if o.Finish == "cancel" {
		if err := r.cancelAll(ctx, ids); err != nil {
			return nil, r.withLogs(err)
		}
	}
	if err := r.waitFinished(ctx, ids); err != nil {
		return nil, r.withLogs(err)
	}
	r.rep.TotalSeconds = time.Since(r.t0).Seconds()
	r.rep.Overall = window(r.base, r.aggregate())
	r.logf("every task ended %.1fs after the first submission; checking logs", r.rep.TotalSeconds)
	r.check(ctx, ids)
	r.finish()
	return r.rep, nil
}

func (r *run) withLogs(err error) error {
	return fmt.Errorf("%w\n%s", err, r.cl.LogTails(8))
}

func sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

// wait polls cond every 250 ms, printing its progress line every 2 s. A
// line saying a process exited fails at once.
func (r *run) wait(ctx context.Context, d time.Duration, what string, cond func() (bool, string)) error {
	deadline := time.Now().Add(d)
	last := time.Now()
	for {
		ok, line := cond()
		if ok {
			return nil
		}
		if strings.HasSuffix(line, " exited") {
			return fmt.Errorf("waiting for %s: %s", what, line)
		}
		if time.Since(last) > 2*time.Second {
			r.logf("  %s", line)
			last = time.Now()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %v waiting for %s (%s)", d, what, line)
		}
		if err := sleep(ctx, 250*time.Millisecond); err != nil {
			return err
		}
	}
}

func (r *run) servers() (warrenv1connect.TaskServiceClient, warrenv1connect.ClusterServiceClient) {
	for _, s := range r.cl.Nodes {
		if s.Running() {
			return warrenv1connect.NewTaskServiceClient(r.hc, s.URL), warrenv1connect.NewClusterServiceClient(r.hc, s.URL)
		}
	}
	return nil, nil
}

func (r *run) nodes(ctx context.Context) ([]*warrenv1.Node, error) {
	_, cc := r.servers()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := cc.ListNodes(ctx, connect.NewRequest(&warrenv1.ListNodesRequest{}))
	if err != nil {
		return nil, err
	}
	return resp.Msg.GetNodes(), nil
}

func (r *run) readyNodes(ctx context.Context) (int, error) {
	ns, err := r.nodes(ctx)
	n := 0
	for _, x := range ns {
		if x.GetStatus() == warrenv1.NodeStatus_NODE_STATUS_READY {
			n++
		}
	}
	return n, err
}

func (r *run) leaderStatus(ctx context.Context) (*warrenv1.StatusResponse, error) {
	for _, s := range r.cl.Nodes {
		if !s.Running() {
			continue
		}
		st, err := s.Status(ctx)
		if err == nil && st.GetRaftState() == "leader" {
			r.leaderID.Store(s.ID)
			return st, nil
		}
	}
	return nil, errors.New("no leader")
}

// submit creates the tasks, 64 calls at a time over every server, each
// with a step duration and an output size drawn for it.
func (r *run) submit(ctx context.Context) ([]string, error) {
	o := r.o
	rng := rand.New(rand.NewPCG(o.Seed, 7))
	specs := make([]*warrenv1.TaskSpec, o.Tasks)
	for i := range specs {
		// Lognormal around the medians: sigma 0.3 for durations (clamped
		// to half and twice the median, so no task runs for ever), 1 for
		// output sizes.
		step := float64(o.StepMedian) * min(2, max(0.5, math.Exp(0.3*rng.NormFloat64()))) / o.TimeScale
		out := float64(o.OutputMedian) * math.Exp(rng.NormFloat64())
		specs[i] = &warrenv1.TaskSpec{Repo: "https://example.com/bench.git", Base: "main", IssueTitle: fmt.Sprint("capacity ", i),
			Driver: "sim", Script: &warrenv1.Script{Steps: uint32(o.Steps),
				StepMillis:  uint32(max(1, min(600000, step/float64(time.Millisecond)))),
				OutputBytes: uint32(max(16, min(60000, out)))}}
	}
	var clients []warrenv1connect.TaskServiceClient
	for _, s := range r.cl.Nodes {
		clients = append(clients, warrenv1connect.NewTaskServiceClient(r.hc, s.URL))
	}
	// CreateTasks calls of submitChunk tasks from a few workers: the
	// creates then take their share of the raft pipeline in a few large
	// commands, instead of 64 small calls queued among the appends of
	// thousands of running actors.
	const submitChunk, submitWorkers = 500, 4
	ids := make([]string, o.Tasks)
	err := inParallel(o.Tasks, submitChunk, submitWorkers, func(w, lo, hi int) error {
		req := &warrenv1.CreateTasksRequest{}
		for i := lo; i < hi; i++ {
			req.Tasks = append(req.Tasks, &warrenv1.CreateTaskRequest{RequestId: fmt.Sprint("cap-", i), Spec: specs[i]})
		}
		var err error
		for attempt := 0; attempt < 5; attempt++ {
			c := clients[(w+attempt)%len(clients)]
			cctx, cancel := context.WithTimeout(ctx, 60*time.Second)
			var resp *connect.Response[warrenv1.CreateTasksResponse]
			resp, err = c.CreateTasks(cctx, connect.NewRequest(req))
			cancel()
			if err == nil {
				for j, res := range resp.Msg.GetResults() {
					if res.GetErrorCode() != "" {
						err = fmt.Errorf("task %d: %s: %s", lo+j, res.GetErrorCode(), res.GetErrorMessage())
						break
					}
					ids[lo+j] = res.GetTask().GetId()
				}
				break
			}
		}
		if err != nil {
			return fmt.Errorf("create tasks %d..%d: %w", lo, hi-1, err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return ids, nil
}

// aggregate sums the fleet processes' counters (those still running keep
// their last snapshot after they die, so totals never go backwards).
func (r *run) aggregate() noded.MetricsSnapshot {
	r.poll()
	r.mu.Lock()
	defer r.mu.Unlock()
	var a noded.MetricsSnapshot
	a.Buckets = make([]uint64, len(r.hist))
	copy(a.Buckets, r.hist)
	for id, m := range r.prev {
		a.Nodes += m.Nodes
		if d := r.cl.Node(id); d == nil || d.Running() { // a killed process runs nothing
			a.Running += m.Running
		}
		a.Started += m.Started
		a.Finished += m.Finished
		a.Appends += m.Appends
		a.Events += m.Events
		a.AppendErrors += m.AppendErrors
		a.RecordedRunning += m.RecordedRunning
		a.LastAppendUnixNano = max(a.LastAppendUnixNano, m.LastAppendUnixNano)
		a.BucketBaseMicros, a.BucketGrowth = m.BucketBaseMicros, m.BucketGrowth
	}
	a.Time = time.Now()
	return a
}

// poll reads every live fleet process's /metrics.
func (r *run) poll() {
	var wg sync.WaitGroup
	for _, d := range r.cl.Daemons {
		if !d.Running() {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, "GET", "http://"+d.Metrics+"/metrics", nil)
			resp, err := r.hc.Do(req)
			if err != nil {
				return
			}
			defer resp.Body.Close()
			var m noded.MetricsSnapshot
			if json.NewDecoder(resp.Body).Decode(&m) != nil {
				return
			}
			r.mu.Lock()
			r.prev[d.ID] = m
			r.mu.Unlock()
		}()
	}
	wg.Wait()
	r.mu.Lock()
	var hist []uint64
	for _, m := range r.prev {
		if hist == nil {
			hist = make([]uint64, len(m.Buckets))
		}
		for i, v := range m.Buckets {
			if i < len(hist) {
				hist[i] += v
			}
		}
	}
	r.hist = hist
	r.mu.Unlock()
}

// window summarises appends between two aggregates.
func window(a, b noded.MetricsSnapshot) Window {
	w := Window{Seconds: b.Time.Sub(a.Time).Seconds(), Appends: b.Appends - a.Appends, Events: b.Events - a.Events,
		Errors: b.AppendErrors - a.AppendErrors}
	if w.Seconds > 0 {
		w.AppendsPerSec = float64(w.Appends) / w.Seconds
		w.EventsPerSec = float64(w.Events) / w.Seconds
	}
	d := make([]uint64, len(b.Buckets))
	for i := range d {
		if i < len(a.Buckets) {
			d[i] = b.Buckets[i] - a.Buckets[i]
		} else {
			d[i] = b.Buckets[i]
		}
	}
	w.P50Ms = quantile(d, b, 0.50)
	w.P99Ms = quantile(d, b, 0.99)
	w.P999Ms = quantile(d, b, 0.999)
	return w
}

// quantile returns the upper bound (ms) of the bucket holding quantile q.
func quantile(counts []uint64, m noded.MetricsSnapshot, q float64) float64 {
	var total uint64
	for _, c := range counts {
		total += c
	}
	if total == 0 {
		return 0
	}
	want := uint64(math.Ceil(q * float64(total)))
	var seen uint64
	for i, c := range counts {
		seen += c
		if seen >= want {
			return m.BucketBaseMicros * math.Pow(m.BucketGrowth, float64(i)) / 1000
		}
	}
	return 0
}

// sampler records one Sample per second until stopped.
func (r *run) sampler(ctx context.Context) {
	defer close(r.doneS)
	t := time.NewTicker(time.Second)
	defer t.Stop()
	prev := r.aggregate()
	cpuPrev, cpuAt := r.cpuTimes(), time.Now()
	for {
		select {
		case <-r.stopS:
			return
		case <-ctx.Done():
			return
		case <-t.C:
		}
		cur := r.aggregate()
		if cur.Time.Sub(prev.Time) < 500*time.Millisecond {
			continue // a slow poll made ticks bunch up: too short to rate
		}
		w := window(prev, cur)
		prev = cur
		cpu, now := r.cpuTimes(), time.Now()
		_, _ = r.leaderStatus(ctx)
		leader := r.leaderID.Load().(string)
		s := Sample{T: now.Sub(r.t0).Seconds(), EventsPerSec: w.EventsPerSec, AppendsPerSec: w.AppendsPerSec, P50Ms: w.P50Ms, P99Ms: w.P99Ms,
			Running: cur.Running, Finished: cur.Finished - r.base.Finished}
		if r.t0.IsZero() {
			s.T = 0
		}
		if c, ok := cpu[leader]; ok {
			s.LeaderCPU = (c - cpuPrev[leader]).Seconds() / now.Sub(cpuAt).Seconds()
		}
		cpuPrev, cpuAt = cpu, now
		for _, n := range append(append([]*cluster.Node{}, r.cl.Nodes...), r.cl.Daemons...) {
			if v, err := n.RSS(); err == nil {
				r.mu.Lock()
				r.peakRSS[n.ID] = max(r.peakRSS[n.ID], v)
				r.mu.Unlock()
				if n.ID == leader {
					s.LeaderRSS = v
				}
			}
		}
		if !r.t0.IsZero() {
			r.mu.Lock()
			r.samples = append(r.samples, s)
			r.mu.Unlock()
			fmt.Fprintf(r.out, "%7.1fs  running %6d  finished %6d  events/s %7.0f  p50 %6.1f ms  p99 %7.1f ms  leader %s cpu %.2f rss %s\n",
				time.Since(r.start).Seconds(), s.Running, s.Finished, s.EventsPerSec, s.P50Ms, s.P99Ms, leader, s.LeaderCPU, mib(s.LeaderRSS))
		}
	}
}

func mib(b int64) string { return fmt.Sprintf("%.0fMiB", float64(b)/(1<<20)) }

func (r *run) mark(label string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.rep.Marks = append(r.rep.Marks, Mark{T: time.Since(r.t0).Seconds(), Label: label})
}

func (r *run) cpuTimes() map[string]time.Duration {
	out := map[string]time.Duration{}
	for _, n := range append(append([]*cluster.Node{}, r.cl.Nodes...), r.cl.Daemons...) {
		if c, err := n.CPUTime(); err == nil {
			out[n.ID] = c
		}
	}
	return out
}

func (r *run) fleetRSS() map[string]int64 {
	out := map[string]int64{}
	for _, d := range r.cl.Daemons {
		if v, err := d.RSS(); err == nil {
			out[d.ID] = v
		}
	}
	return out
}

// profile takes CPU profiles of the leader and of the first node process
// for d (and the leader's heap profile after it) into the output
// directory, and summarises the leader's CPU profile.
func (r *run) profile(ctx context.Context, d time.Duration) <-chan struct{} {
	done := make(chan struct{})
	leader := r.cl.Node(r.leaderID.Load().(string))
	if leader == nil || r.o.OutDir == "" {
		close(done)
		return done
	}
	file := func(what string) string {
		return filepath.Join(r.o.OutDir, fmt.Sprintf("capacity-%s-%s.pprof", r.o.Preset, what))
	}
	get := func(url, file string) error {
		ctx, cancel := context.WithTimeout(ctx, d+30*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("GET %s: %s", url, resp.Status)
		}
		f, err := os.Create(file)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = io.Copy(f, resp.Body)
		return err
	}
	cpuURL := fmt.Sprintf("/debug/pprof/profile?seconds=%d", int(d.Seconds()))
	var wg sync.WaitGroup
	if len(r.cl.Daemons) > 0 && r.cl.Daemons[0].Metrics != "" {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := get("http://"+r.cl.Daemons[0].Metrics+cpuURL, file("node-cpu")); err != nil {
				r.logf("node process CPU profile: %v", err)
			}
		}()
	}
	go func() {
		defer close(done)
		defer wg.Wait()
		cpuFile := file("leader-cpu")
		if err := get(leader.URL+cpuURL, cpuFile); err != nil {
			r.logf("leader CPU profile: %v", err)
			return
		}
		_ = get(leader.URL+"/debug/pprof/heap", file("leader-heap"))
		if out, err := exec.Command("go", "tool", "pprof", "-top", "-nodecount=15", r.o.Binary, cpuFile).Output(); err == nil {
			lines := strings.Split(string(out), "\n")
			r.mu.Lock()
			r.rep.ProfileTop = strings.Join(lines[:min(len(lines), 24)], "\n")
			r.mu.Unlock()
		}
	}()
	return done
}

// killNodes SIGKILLs whole node processes holding KillFraction of the
// nodes, then times detection and each lost task's recovery: from the
// kill to the first event its new owner appended (server time).
func (r *run) killNodes(ctx context.Context) error {
	procs := max(1, int(math.Round(r.o.KillFraction*float64(len(r.cl.Daemons)))))
	victims := r.cl.Daemons[:procs]
	prefixes := map[string]bool{}
	for _, v := range victims {
		prefixes[v.ID] = true
	}
	onVictim := func(node string) bool {
		p, _, _ := strings.Cut(node, "-")
		return prefixes[p]
	}
	held := map[string]uint64{}
	tasks, _ := r.servers()
	if err := cluster.EachTask(ctx, tasks, warrenv1.TaskState_TASK_STATE_UNSPECIFIED, func(t *warrenv1.Task) {
		if (t.GetState() == warrenv1.TaskState_TASK_STATE_RUNNING || t.GetState() == warrenv1.TaskState_TASK_STATE_PLACED) && onVictim(t.GetLease().GetNode()) {
			held[t.GetId()] = t.GetLease().GetEpoch()
		}
	}); err != nil {
		return err
	}
	r.rep.KilledNodes = procs * r.o.NodesPerProcess
	r.rep.KilledTasks = len(held)
	r.logf("fault 1: SIGKILL %d node processes (%d nodes, %d tasks)", procs, r.rep.KilledNodes, len(held))
	var killed time.Time
	for _, v := range victims {
		killed = v.Kill()
	}
	r.mark(fmt.Sprintf("kill %d nodes", r.rep.KilledNodes))
	if err := r.wait(ctx, 2*time.Minute, "the killed nodes declared down", func() (bool, string) {
		ns, err := r.nodes(ctx)
		if err != nil {
			return false, err.Error()
		}
		down := 0
		for _, n := range ns {
			if onVictim(n.GetId()) && n.GetStatus() == warrenv1.NodeStatus_NODE_STATUS_DOWN {
				down++
			}
		}
		return down == r.rep.KilledNodes, fmt.Sprintf("%d/%d killed nodes down", down, r.rep.KilledNodes)
	}); err != nil {
		return err
	}
	ns, _ := r.nodes(ctx)
	for _, n := range ns {
		if onVictim(n.GetId()) {
			r.rep.DetectSeconds = max(r.rep.DetectSeconds, n.GetStatusChangedAt().AsTime().Sub(killed).Seconds())
			reason := n.GetStatusReason()
			if strings.HasPrefix(reason, "no heartbeat") {
				reason = "heartbeat TTL"
			}
			r.rep.DetectedBy[reason]++
		}
	}
	var rec []time.Duration
	var mu sync.Mutex
	ended := 0
	last := map[string]string{}
	if err := r.wait(ctx, 3*time.Minute, "every lost task's new owner to append", func() (bool, string) {
		var wg sync.WaitGroup
		sem := make(chan struct{}, 32)
		mu.Lock()
		todo := make(map[string]uint64, len(held))
		for id, e := range held {
			todo[id] = e
		}
		mu.Unlock()
		for id, epoch := range todo {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				at, st, desc := cluster.FirstOwnerEvent(ctx, tasks, id, epoch)
				mu.Lock()
				defer mu.Unlock()
				switch st {
				case cluster.Recovered:
					rec = append(rec, at.Sub(killed))
					delete(held, id)
				case cluster.EndedBefore:
					ended++
					delete(held, id)
				default:
					last[id] = desc
				}
			}()
		}
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		line := fmt.Sprintf("%d lost tasks recovered, %d ended before the kill, %d to go", len(rec), ended, len(held))
		if len(held) > 0 && len(held) <= 5 {
			for id := range held {
				line += "; " + last[id]
			}
		}
		return len(held) == 0, line
	}); err != nil {
		return err
	}
	r.rep.RecoveredTasks = len(rec)
	r.rep.RecoveryP50, r.rep.RecoveryP99, r.rep.RecoveryMax = pct(rec, 0.5), pct(rec, 0.99), pct(rec, 1)
	// Healthy nodes declared down meanwhile: their status changed after
	// the kill (down, or down and registered again).
	if ns, err := r.nodes(ctx); err == nil {
		for _, n := range ns {
			if !onVictim(n.GetId()) && n.GetStatusChangedAt().AsTime().After(killed) {
				r.rep.Fault1FalseDowns++
			}
		}
	}
	r.logf("fault 1: nodes down after %.2fs (%v); recovery p50 %.2fs p99 %.2fs max %.2fs over %d tasks; %d healthy nodes declared down",
		r.rep.DetectSeconds, r.rep.DetectedBy, r.rep.RecoveryP50, r.rep.RecoveryP99, r.rep.RecoveryMax, len(rec), r.rep.Fault1FalseDowns)
	return sleep(ctx, 5*time.Second)
}

func pct(ds []time.Duration, q float64) float64 {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return s[min(max(i, 0), len(s)-1)].Seconds()
}

// killLeader SIGKILLs the leader and measures the time to the first
// acknowledged append on the new leader, with a probe task no node can
// take (driver "container"), and counts healthy nodes declared down.
func (r *run) killLeader(ctx context.Context) error {
	tasks, _ := r.servers()
	resp, err := tasks.CreateTask(ctx, connect.NewRequest(&warrenv1.CreateTaskRequest{RequestId: "cap-probe",
		Spec: &warrenv1.TaskSpec{Repo: "https://example.com/probe.git", Base: "main", IssueTitle: "failover probe (never placed)", Driver: "container"}}))
	if err != nil {
		return err
	}
	probe := resp.Msg.GetTask().GetId()
	before, err := r.nodes(ctx)
	if err != nil {
		return fmt.Errorf("list nodes before the leader kill: %w", err)
	}
	if _, err := r.leaderStatus(ctx); err != nil {
		return err
	}
	old := r.cl.Node(r.leaderID.Load().(string))
	r.rep.OldLeader = old.ID
	r.logf("fault 2: SIGKILL the leader %s", old.ID)
	killed := old.Kill()
	r.mark("kill leader")
	var survivors []warrenv1connect.TaskServiceClient
	for _, s := range r.cl.Nodes {
		if s != old {
			survivors = append(survivors, warrenv1connect.NewTaskServiceClient(r.hc, s.URL))
		}
	}
	// A probe every 50 ms, each allowed 10 s: under load an append may
	// queue for seconds, and the first acknowledgement is what counts.
	var first time.Time
	var once sync.Once
	acked := make(chan struct{})
	pctx, stopProbes := context.WithTimeout(ctx, 2*time.Minute)
	var pwg sync.WaitGroup
probe:
	for i := 0; ; i++ {
		select {
		case <-pctx.Done():
			break probe
		case <-acked:
			break probe
		default:
		}
		pwg.Add(1)
		go func(i int) {
			defer pwg.Done()
			cctx, cancel := context.WithTimeout(pctx, 10*time.Second)
			defer cancel()
			_, err := survivors[i%len(survivors)].AppendEvents(cctx, connect.NewRequest(&warrenv1.AppendEventsRequest{TaskId: probe,
				Events: []*warrenv1.EventInput{{Kind: "log", Payload: []byte(`{"msg":"failover probe"}`)}}, RequestId: fmt.Sprint("probe-", i)}))
			if err == nil {
				now := time.Now()
				once.Do(func() { first = now; close(acked) })
			}
		}(i)
		_ = sleep(pctx, 50*time.Millisecond)
	}
	stopProbes()
	pwg.Wait()
	at := first
	if at.IsZero() {
		return errors.New("no append acknowledged within two minutes of the leader kill")
	}
	r.rep.FailoverSeconds = at.Sub(killed).Seconds()
	if st, err := r.leaderStatus(ctx); err == nil {
		r.rep.NewLeader = st.GetServerId()
	}
	r.logf("fault 2: appends resumed %.2fs after the kill; new leader %s; watching for false downs", r.rep.FailoverSeconds, r.rep.NewLeader)
	// A node falsely declared down would be within a TTL plus grace.
	if err := sleep(ctx, 8*time.Second); err != nil {
		return err
	}
	// A survivor may not answer at once while the new leader settles.
	var after []*warrenv1.Node
	for try := 0; ; try++ {
		if after, err = r.nodes(ctx); err == nil {
			break
		}
		if try == 4 {
			return fmt.Errorf("list nodes after the leader kill: %w", err)
		}
		if err := sleep(ctx, time.Second); err != nil {
			return err
		}
	}
	r.rep.FalseDownNodes = falseDowns(before, after, killed)
	_, _ = tasks.CancelTask(ctx, connect.NewRequest(&warrenv1.CancelTaskRequest{TaskId: probe, Reason: "probe done"}))
	r.logf("fault 2: %d healthy nodes declared down", r.rep.FalseDownNodes)
	return nil
}

// falseDowns counts the nodes declared down since killed: each node listed
// in before that was not down then and whose status has changed since, after
// killed, for a reason other than an operator's. A node declared down
// registers again within a second or so, so its status alone, read seconds
// later, no longer shows it; its StatusChangedAt ("registered again", or
// the down's own reason) does.
func falseDowns(before, after []*warrenv1.Node, killed time.Time) int {
	changedAt := make(map[string]time.Time, len(before))
	for _, n := range before {
		if n.GetStatus() != warrenv1.NodeStatus_NODE_STATUS_DOWN {
			changedAt[n.GetId()] = n.GetStatusChangedAt().AsTime()
		}
	}
	count := 0
	for _, n := range after {
		prev, ok := changedAt[n.GetId()]
		at := n.GetStatusChangedAt().AsTime()
		if !ok || at.Equal(prev) || !at.After(killed) {
			continue
		}
		switch n.GetStatusReason() {
		case "operator", "drain deadline passed": // an operator's cordon or drain
			continue
		}
		count++
	}
	return count
}

// waitFinished waits until every task has ended; no progress for two
// minutes means a task is stuck.
func (r *run) waitFinished(ctx context.Context, ids []string) error {
	last, lastChange := -1, time.Now()
	for {
		n, err := r.countEnded(ctx)
		if err == nil {
			if n != last {
				last, lastChange = n, time.Now()
			}
			if n >= len(ids) {
				return nil
			}
		}
		if time.Since(lastChange) > 2*time.Minute {
			r.rep.Violations = append(r.rep.Violations, fmt.Sprintf("stuck: %d of %d tasks ended, no progress for 2 minutes", last, len(ids)))
			return fmt.Errorf("tasks stuck: %d of %d ended and no progress for 2 minutes", last, len(ids))
		}
		if err := sleep(ctx, time.Second); err != nil {
			return err
		}
	}
}

// cancelAll cancels every task that has not ended; each actor records the
// cancellation at its next step boundary.
func (r *run) cancelAll(ctx context.Context, ids []string) error {
	r.mark("cancel all")
	r.logf("cancelling the %d tasks (--finish cancel)", len(ids))
	tasks, _ := r.servers()
	// Each cancel is a raft write that queues with the appends of every
	// running actor: many in flight, or 40,000 take many minutes.
	return inParallel(len(ids), 1, 512, func(_, i, _ int) error {
		// Retry until the run's deadline: under overload a cancel can take
		// minutes, and a task that never ends is caught as stuck by
		// waitFinished.
		for backoff := time.Second; ; backoff = min(2*backoff, 10*time.Second) {
			cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			_, err := tasks.CancelTask(cctx, connect.NewRequest(&warrenv1.CancelTaskRequest{TaskId: ids[i], RequestId: "bench-cancel"}))
			cancel()
			if err == nil || connect.CodeOf(err) == connect.CodeFailedPrecondition {
				return nil // cancelled, or it had already ended
			}
			if ctx.Err() != nil {
				return fmt.Errorf("cancel task %s: %w", ids[i], err)
			}
			r.logf("cancel task %s: %v; retrying in %s", ids[i], err, backoff)
			if err := sleep(ctx, backoff); err != nil {
				return err
			}
		}
	})
}

// inParallel calls fn(worker, lo, hi) for the chunks [lo, hi) of [0, n),
// chunk long, from workers goroutines. After the first error it hands out
// no more chunks, and it returns that error once every call has returned.
func inParallel(n, chunk, workers int, fn func(worker, lo, hi int) error) error {
	var next atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				lo := int(next.Add(int64(chunk))) - chunk
				if lo >= n || firstErr.Load() != nil {
					return
				}
				if err := fn(w, lo, min(lo+chunk, n)); err != nil {
					firstErr.CompareAndSwap(nil, err)
				}
			}
		}()
	}
	wg.Wait()
	if e := firstErr.Load(); e != nil {
		return e.(error)
	}
	return nil
}

func (r *run) countEnded(ctx context.Context) (int, error) {
	tasks, _ := r.servers()
	n := 0
	for _, state := range []warrenv1.TaskState{warrenv1.TaskState_TASK_STATE_SUCCEEDED, warrenv1.TaskState_TASK_STATE_FAILED, warrenv1.TaskState_TASK_STATE_CANCELLED} {
		if err := cluster.EachTask(ctx, tasks, state, func(*warrenv1.Task) { n++ }); err != nil {
			return 0, err
		}
	}
	return n, nil
}

// check verifies the invariants on CheckLogs task logs (all when 0):
// succeeded, gapless from 1, epochs never going back, every step's effect
// recorded exactly once and its result present.
func (r *run) check(ctx context.Context, ids []string) {
	sample := ids
	if r.o.CheckLogs > 0 && r.o.CheckLogs < len(ids) {
		rng := rand.New(rand.NewPCG(r.o.Seed, 11))
		sample = slices.Clone(ids)
		rng.Shuffle(len(sample), func(i, j int) { sample[i], sample[j] = sample[j], sample[i] })
		sample = sample[:r.o.CheckLogs]
	}
	tasks, _ := r.servers()
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	events := 0
	for _, id := range sample {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			n, problems := checkLog(ctx, tasks, id, r.o.Steps, r.o.Finish == "cancel")
			mu.Lock()
			events += n
			r.rep.Violations = append(r.rep.Violations, problems...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	r.rep.CheckedLogs, r.rep.CheckedEvents = len(sample), events
	succeeded := 0
	if err := cluster.EachTask(ctx, tasks, warrenv1.TaskState_TASK_STATE_SUCCEEDED, func(*warrenv1.Task) { succeeded++ }); err != nil {
		r.rep.Violations = append(r.rep.Violations, "list succeeded tasks: "+err.Error())
	}
	r.rep.Succeeded = succeeded
	if r.o.Finish == "cancel" {
		cancelled := 0
		if err := cluster.EachTask(ctx, tasks, warrenv1.TaskState_TASK_STATE_CANCELLED, func(*warrenv1.Task) { cancelled++ }); err != nil {
			r.rep.Violations = append(r.rep.Violations, "list cancelled tasks: "+err.Error())
		}
		r.rep.Cancelled = cancelled
		if succeeded+cancelled != len(ids) {
			r.rep.Violations = append(r.rep.Violations, fmt.Sprintf("%d of %d tasks succeeded and %d were cancelled", succeeded, len(ids), cancelled))
		}
	} else if succeeded != len(ids) {
		r.rep.Violations = append(r.rep.Violations, fmt.Sprintf("%d of %d tasks succeeded", succeeded, len(ids)))
	}
	r.logf("checked %d logs (%d events): %d violations", len(sample), events, len(r.rep.Violations))
}

// checkLog checks one task's log: gapless from 1, epochs never going back,
// ended in success (or, when cancelled is allowed, in cancellation), and
// each step's effect recorded exactly once with its result: every step of a
// task that succeeded, every step up to the last one with an effect of a
// task that was cancelled.
func checkLog(ctx context.Context, tasks warrenv1connect.TaskServiceClient, id string, steps int, cancelled bool) (int, []string) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	st, err := tasks.StreamEvents(ctx, connect.NewRequest(&warrenv1.StreamEventsRequest{TaskId: id}))
	if err != nil {
		return 0, []string{fmt.Sprintf("task %s: stream: %v", id, err)}
	}
	defer st.Close()
	var problems []string
	effects := map[string]int{}
	results := map[string]bool{}
	var n int
	var maxEpoch uint64
	ended := false
	for st.Receive() {
		e := st.Msg().GetEvent()
		n++
		if e.GetSeq() != uint64(n) {
			problems = append(problems, fmt.Sprintf("task %s: event %d has seq %d (lost or duplicated)", id, n, e.GetSeq()))
			break
		}
		if e.GetEpoch() != 0 {
			if e.GetEpoch() < maxEpoch {
				problems = append(problems, fmt.Sprintf("task %s: seq %d under epoch %d after epoch %d", id, e.GetSeq(), e.GetEpoch(), maxEpoch))
			}
			maxEpoch = max(maxEpoch, e.GetEpoch())
		}
		var p map[string]any
		_ = json.Unmarshal(e.GetPayload(), &p)
		switch e.GetKind() {
		case "effect":
			k, _ := p["idempotency_key"].(string)
			effects[k]++
		case "tool_result":
			c, _ := p["tool_call_id"].(string)
			results[c] = true
		case "state_changed":
			switch p["to"] {
			case "succeeded":
				ended = true
			case "cancelled":
				if cancelled {
					ended = true
					steps = 0
					for k := range effects {
						if s, err := strconv.Atoi(strings.TrimPrefix(k, id+"/step-")); err == nil {
							steps = max(steps, s)
						}
					}
				}
			}
		}
	}
	if err := st.Err(); err != nil {
		problems = append(problems, fmt.Sprintf("task %s: stream: %v", id, err))
	}
	if !ended {
		want := "success"
		if cancelled {
			want = "success or cancellation"
		}
		problems = append(problems, fmt.Sprintf("task %s: log does not end in %s", id, want))
	}
	for s := 1; s <= steps; s++ {
		k := id + "/step-" + strconv.Itoa(s)
		if effects[k] != 1 {
			problems = append(problems, fmt.Sprintf("task %s: effect of step %d recorded %d times", id, s, effects[k]))
		}
		if !results["step-"+strconv.Itoa(s)] {
			problems = append(problems, fmt.Sprintf("task %s: step %d has no result", id, s))
		}
	}
	return n, problems
}

// finish fills in the resources, the goals and the timeline.
func (r *run) finish() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.rep.Timeline = r.samples
	var fleet []int64
	for _, s := range r.cl.Nodes {
		r.rep.ServerRSSBytes = append(r.rep.ServerRSSBytes, r.peakRSS[s.ID])
		r.rep.LeaderRSSBytes = max(r.rep.LeaderRSSBytes, r.peakRSS[s.ID])
	}
	for _, d := range r.cl.Daemons {
		fleet = append(fleet, r.peakRSS[d.ID])
	}
	if len(fleet) > 0 {
		slices.Sort(fleet)
		r.rep.NodeProcessRSSBytes = fleet[len(fleet)/2]
	}
	g := func(name, target, measured string, met bool) {
		r.rep.Goals = append(r.rep.Goals, Goal{Name: name, Target: target, Measured: measured, Met: met})
	}
	g("placement", fmt.Sprintf("%d tasks placed and running within 20 s", r.o.Tasks),
		fmt.Sprintf("%.1f s (%.0f/s)", r.rep.AllRunningSeconds, r.rep.PlacementsPerSec), r.rep.AllRunningSeconds > 0 && r.rep.AllRunningSeconds <= 20)
	// The latency histogram holds only the appends that succeeded: an
	// append that failed or gave up after its retries is counted in Errors
	// alone, so the goal also needs none of them in the window.
	g("appends", "≥ 20,000 event appends/s sustained, p99 ≤ 100 ms, no append failed",
		fmt.Sprintf("%.0f events/s, p99 %.1f ms, %d failed appends", r.rep.Steady.EventsPerSec, r.rep.Steady.P99Ms, r.rep.Steady.Errors),
		r.rep.Steady.EventsPerSec >= 20000 && r.rep.Steady.P99Ms <= 100 && r.rep.Steady.Errors == 0)
	g("recovery", "p99 ≤ 3 s after killing 10% of the nodes, no healthy node declared down",
		fmt.Sprintf("p99 %.2f s over %d tasks, %d healthy nodes declared down", r.rep.RecoveryP99, r.rep.RecoveredTasks, r.rep.Fault1FalseDowns),
		r.rep.RecoveryP99 <= 3 && r.rep.RecoveredTasks > 0 && r.rep.Fault1FalseDowns == 0)
	g("failover", "≤ 2 s, zero nodes falsely down",
		fmt.Sprintf("%.2f s, %d false downs", r.rep.FailoverSeconds, r.rep.FalseDownNodes), r.rep.FailoverSeconds > 0 && r.rep.FailoverSeconds <= 2 && r.rep.FalseDownNodes == 0)
	g("leader memory", "RSS ≤ 4 GiB", fmt.Sprintf("%.0f MiB", float64(r.rep.LeaderRSSBytes)/(1<<20)), r.rep.LeaderRSSBytes > 0 && r.rep.LeaderRSSBytes <= 4<<30)
	g("invariants", "no event lost or duplicated, no effect twice, no task stuck",
		fmt.Sprintf("%d violations over %d logs", len(r.rep.Violations), r.rep.CheckedLogs), len(r.rep.Violations) == 0)
}

func machine() Machine {
	m := Machine{CPUs: runtime.NumCPU(), OS: runtime.GOOS + "/" + runtime.GOARCH}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	m.MemBytes = noded.HostMemoryBytes()
	return m
}

// Write saves the report as JSON, markdown and SVG under dir.
func Write(rep *Report, dir string) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	base := filepath.Join(dir, "capacity-"+rep.Preset)
	js, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return nil, err
	}
	files := map[string][]byte{base + ".json": js, base + ".md": []byte(rep.Markdown()), base + ".svg": []byte(rep.SVG())}
	var out []string
	for name, b := range files {
		if err := os.WriteFile(name, b, 0o644); err != nil {
			return nil, err
		}
		out = append(out, name)
	}
	slices.Sort(out)
	return out, nil
}

func firstLine(s string) string {
	first, _, _ := strings.Cut(s, "\n")
	return first
}
