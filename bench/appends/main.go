// Command appends measures event appends per second, with p50, p99 and
// p99.9 latency, on a 3-server warren cluster on loopback, for several
// counts of concurrent writers (goal: ≥ 20,000 events/s with 1024 writers,
// p99 ≤ 50 ms).
//
// Each writer loops over AppendEvents of one event (~256 B payload) to one
// of min(writers, 256) pending tasks; each writer sends its calls to the
// three servers in turn, so two thirds of the writes are forwarded by a
// follower to the leader. Only acknowledged appends count. Each level runs
// a 1 s warm-up and then -duration, -runs times; the table shows medians.
//
// Run from the repository root:
//
//	go run ./bench/appends                       # builds cmd/warren itself
//	go run ./bench/appends -warren bin/warren -writers 1,64,1024 -duration 10s -runs 3 -out appends.md
//	go run ./bench/appends -h2c                  # HTTP/2 cleartext instead of HTTP/1.1
//	go run ./bench/appends -targets followers    # only forwarded writes
//
// With -rate R the writers are open loop: together they offer R events/s,
// each on a fixed schedule, and an append's latency runs from when it was
// due. That is latency at a given load; the goal above is judged on the
// closed loop, where each writer sends again as soon as it is answered.
//
// Before each run it waits (up to -quiet-wait) until other processes leave
// the machine nearly idle, and it reports the CPU the bench, the servers
// and everything else used, since all share the same cores.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"

	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
	"github.com/warrenhq/warren/api/gen/warren/v1/warrenv1connect"
	"github.com/warrenhq/warren/api/textcut"
	"github.com/warrenhq/warren/bench/internal/cluster"
	"github.com/warrenhq/warren/client"
)

type config struct {
	binary     string
	writers    []int
	duration   time.Duration
	warmup     time.Duration
	runs       int
	payload    int
	batch      int
	appenders  int
	inflight   int
	maxTasks   int
	positioned bool
	h2c        bool
	gzip       bool
	out        string
	serverArgs []string
	keep       bool
	quiet      float64
	quietWait  time.Duration
	targets    string
	rate       float64
	cpuProfile string
}

func main() {
	var c config
	var writers, serverArgs string
	flag.StringVar(&c.binary, "warren", "", "path to the warren binary (default: go build ./cmd/warren into a temp dir)")
	flag.StringVar(&writers, "writers", "1,64,1024", "comma-separated counts of concurrent writers")
	flag.DurationVar(&c.duration, "duration", 10*time.Second, "measured time per run")
	flag.DurationVar(&c.warmup, "warmup", time.Second, "unmeasured time before each run")
	flag.IntVar(&c.runs, "runs", 3, "runs per writer count; the table shows medians")
	flag.IntVar(&c.payload, "payload", 256, "event payload size in bytes (a JSON object)")
	flag.IntVar(&c.inflight, "appender-inflight", 4, "calls each client.Appender keeps in flight (node daemons use 8)")
	flag.IntVar(&c.appenders, "appenders", 0, "send writers' appends through this many shared client.Appenders (as that many node daemons would: each batches its writers' appends into AppendEventsBatch calls); 0: one AppendEvents call per append")
	flag.IntVar(&c.batch, "batch", 1, "events per AppendEvents call (a node sending several of its actors' events at once); events/s counts events")
	flag.IntVar(&c.maxTasks, "tasks", 256, "at most this many tasks per level; writers share them")
	flag.BoolVar(&c.positioned, "positioned", false, "each writer is the only writer of its own task and names the seq its events go at (expected_seq), so a retry is found at that seq; -tasks is ignored")
	flag.BoolVar(&c.h2c, "h2c", false, "use HTTP/2 cleartext (multiplexed) instead of one HTTP/1.1 connection per writer")
	flag.BoolVar(&c.gzip, "gzip", true, "accept gzip-compressed responses, as connect-go clients (and warren's client package) do by default")
	flag.StringVar(&c.out, "out", "", "also write the markdown report to this file")
	flag.StringVar(&serverArgs, "server-args", "--log-level=warn", "extra flags for every server, space-separated")
	flag.BoolVar(&c.keep, "keep", false, "keep the cluster's data directories and logs")
	flag.Float64Var(&c.quiet, "quiet", 0.3, "before each run, wait until other processes use fewer than this many cores")
	flag.DurationVar(&c.quietWait, "quiet-wait", 3*time.Minute, "wait at most this long for -quiet, then run anyway (0: never wait)")
	flag.Float64Var(&c.rate, "rate", 0, "open loop: offer this many events/s in all, each writer sending on its own fixed schedule, and time each append from when it was due (so waiting behind a slow one counts); 0: closed loop, each writer sends its next append when the last returns")
	flag.StringVar(&c.targets, "targets", "all", "servers the writers call: all, leader or followers (to isolate forwarding cost)")
	flag.StringVar(&c.cpuProfile, "cpuprofile", "", "write the bench client's own CPU profile (the writers and appenders, not the servers: give them --pprof in -server-args) to this file")
	flag.Parse()
	var errs []error
	for _, s := range strings.Split(writers, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			errs = append(errs, fmt.Errorf("-writers: %q is not a positive count", s))
			continue
		}
		c.writers = append(c.writers, n)
	}
	if c.duration <= 0 || c.runs < 1 || c.maxTasks < 1 {
		errs = append(errs, errors.New("-duration, -runs and -tasks must be positive"))
	}
	if c.inflight < 1 || c.inflight > 64 {
		errs = append(errs, fmt.Errorf("-appender-inflight: %d is not in 1..64", c.inflight))
	}
	if c.appenders < 0 || c.appenders > 1024 {
		errs = append(errs, fmt.Errorf("-appenders: %d is not in 0..1024", c.appenders))
	}
	if c.batch < 1 || c.batch > 256 {
		errs = append(errs, fmt.Errorf("-batch: %d is not in 1..256", c.batch))
	}
	if c.payload < len(`{"msg":""}`) || c.payload > 64<<10 {
		errs = append(errs, fmt.Errorf("-payload: %d is not in %d..65536", c.payload, len(`{"msg":""}`)))
	}
	if c.rate < 0 || c.rate > 1e6 {
		errs = append(errs, fmt.Errorf("-rate: %g is not in 0..1000000", c.rate))
	}
	if c.targets != "all" && c.targets != "leader" && c.targets != "followers" {
		errs = append(errs, fmt.Errorf("-targets: %q is not all, leader or followers", c.targets))
	}
	if err := errors.Join(errs...); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	c.serverArgs = strings.Fields(serverArgs)
	if c.cpuProfile != "" {
		f, err := os.Create(c.cpuProfile)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "-cpuprofile: %v\n", err)
			os.Exit(2)
		}
	}
	code := cluster.Run(func(ctx context.Context) error { return run(ctx, c) })
	if c.cpuProfile != "" {
		pprof.StopCPUProfile()
	}
	os.Exit(code)
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, time.Now().Format("15:04:05.000 ")+format+"\n", args...)
}

// result is one measured run.
type result struct {
	acked      int
	perSec     float64
	lat        []time.Duration // sorted
	errors     int
	errSamples map[string]int
	perEntry   float64 // acked appends per raft log entry
	perCall    float64 // appends per AppendEventsBatch call of the client.Appenders (0: none)
	cpuBench   float64 // cores used by this process
	cpuServers float64 // cores used by the servers together
	cpuOther   float64 // cores used by everything else on the machine
	ioWait     float64 // cores idle while a disk request was outstanding
}

func run(ctx context.Context, c config) error {
	if c.binary == "" {
		bin, err := cluster.Build(ctx, logf)
		if err != nil {
			return err
		}
		c.binary = bin
	}
	cl, err := cluster.Start(ctx, cluster.Options{Binary: c.binary, ServerArgs: c.serverArgs, Keep: c.keep, Logf: logf})
	if err != nil {
		return err
	}
	defer cl.Close()

	maxW := slices.Max(c.writers)
	hc := cluster.HTTPClient(c.h2c, maxW)
	var tasks []warrenv1connect.TaskServiceClient
	var opts []connect.ClientOption
	if !c.gzip {
		opts = append(opts, connect.WithAcceptCompression("gzip", nil, nil))
	}
	for _, u := range cl.URLs() {
		tasks = append(tasks, warrenv1connect.NewTaskServiceClient(hc, u, opts...))
	}
	targets := tasks
	if c.targets != "all" {
		leader, err := cl.WaitStable(ctx, 30*time.Second)
		if err != nil {
			return err
		}
		targets = nil
		for i, n := range cl.Nodes {
			if (n == leader) == (c.targets == "leader") {
				targets = append(targets, tasks[i])
			}
		}
		logf("writers call the %s only (%d servers)", c.targets, len(targets))
	}
	payload := makePayload(c.payload)

	results := map[int][]result{}
	for _, w := range c.writers {
		n := min(w, c.maxTasks)
		if c.positioned {
			n = w
		}
		ids, err := createTasks(ctx, tasks, n)
		if err != nil {
			return err
		}
		for r := range c.runs {
			if _, err := cl.WaitStable(ctx, 30*time.Second); err != nil {
				return fmt.Errorf("before run: %w\n%s", err, cl.LogTails(15))
			}
			if c.quietWait > 0 {
				if ok, other := cl.WaitQuiet(ctx, c.quiet, c.quietWait); !ok && ctx.Err() == nil {
					logf("warning: other processes still use %.2f cores after %s; measuring anyway", other, c.quietWait)
				}
			}
			res, err := measure(ctx, c, cl, targets, ids, w, payload, fmt.Sprintf("w%d-r%d", w, r))
			if err != nil {
				return err
			}
			logf("writers=%d run %d/%d: %.0f events/s, p50 %s, p99 %s, p99.9 %s, errors %d, %.1f events/raft entry, %.1f appends/call, cpu bench %.2f servers %.2f other %.2f cores, iowait %.2f cores",
				w, r+1, c.runs, res.perSec, ms(pct(res.lat, 0.50)), ms(pct(res.lat, 0.99)), ms(pct(res.lat, 0.999)),
				res.errors, res.perEntry, res.perCall, res.cpuBench, res.cpuServers, res.cpuOther, res.ioWait)
			for msg, n := range res.errSamples {
				logf("  %d× %s", n, msg)
			}
			results[w] = append(results[w], res)
		}
	}
	report := render(c, results)
	fmt.Print(report)
	if c.out != "" {
		if err := os.WriteFile(c.out, []byte(report), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// makePayload returns a JSON object of exactly n bytes.
func makePayload(n int) []byte {
	pad := n - len(`{"msg":""}`)
	return []byte(`{"msg":"` + strings.Repeat("x", pad) + `"}`)
}

// createTasks creates n pending tasks, spread over the servers.
func createTasks(ctx context.Context, tasks []warrenv1connect.TaskServiceClient, n int) ([]string, error) {
	ids := make([]string, n)
	errs := make([]error, n)
	sem := make(chan struct{}, 32)
	var wg sync.WaitGroup
	for i := range n {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			resp, err := tasks[i%len(tasks)].CreateTask(cctx, connect.NewRequest(&warrenv1.CreateTaskRequest{
				RequestId: fmt.Sprintf("bench-%d-%d", time.Now().UnixNano(), i),
				Spec:      &warrenv1.TaskSpec{Repo: "https://example.com/r.git", Base: "main", IssueTitle: "bench appends"},
			}))
			if err != nil {
				errs[i] = fmt.Errorf("create task %d: %w", i, err)
				return
			}
			ids[i] = resp.Msg.GetTask().GetId()
		})
	}
	wg.Wait()
	return ids, errors.Join(errs...)
}

// nextSeq returns the task's next seq, the highest any server reports
// (GetTask reads a server's local state, and a follower may lag), or 0
// when no server answers (the writer then tries again on its next turn).
func nextSeq(ctx context.Context, srvs []warrenv1connect.TaskServiceClient, id string) uint64 {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var next uint64
	for _, srv := range srvs {
		if r, err := srv.GetTask(cctx, connect.NewRequest(&warrenv1.GetTaskRequest{Id: id})); err == nil {
			next = max(next, r.Msg.GetTask().GetNextSeq())
		}
	}
	return next
}

// measure runs w writers for warmup+duration and returns what was
// acknowledged inside the measured window.
func measure(ctx context.Context, c config, cl *cluster.Cluster, tasks []warrenv1connect.TaskServiceClient,
	ids []string, w int, payload []byte, prefix string) (result, error) {
	start := time.Now()
	t0 := start.Add(c.warmup)
	t1 := t0.Add(c.duration)
	events := make([]*warrenv1.EventInput, c.batch)
	for i := range events {
		events[i] = &warrenv1.EventInput{Kind: "log", Payload: payload}
	}

	type writerOut struct {
		lat  []time.Duration
		errs map[string]int
	}
	outs := make([]writerOut, w)
	// Simulated node daemons: each Appender starts on a different server
	// and fails over to the others.
	var apps []*client.Appender
	for i := 0; i < c.appenders; i++ {
		urls := cl.URLs()
		rot := append(append([]string(nil), urls[i%len(urls):]...), urls[:i%len(urls)]...)
		wc, err := client.New(strings.Join(rot, ","))
		if err != nil {
			return result{}, err
		}
		app := wc.NewAppender(c.inflight, 1024)
		defer app.Close()
		apps = append(apps, app)
	}
	var stop atomic.Bool
	var wg sync.WaitGroup
	for i := range w {
		wg.Go(func() {
			task := ids[i%len(ids)]
			o := &outs[i]
			o.errs = map[string]int{}
			// With -positioned the writer owns its task and tracks where its
			// next events go; after an error it asks the log.
			var next uint64
			// Open loop: this writer's appends are due every interval,
			// from a phase of its own.
			var interval time.Duration
			var due time.Time
			if c.rate > 0 {
				interval = time.Duration(float64(w*c.batch) / c.rate * float64(time.Second))
				due = start.Add(time.Duration(rand.Int64N(int64(interval) + 1)))
			}
			for n := 0; !stop.Load() && ctx.Err() == nil; n++ {
				if c.rate > 0 {
					if d := time.Until(due); d > 0 {
						time.Sleep(d)
					}
				}
				srv := tasks[(i+n)%len(tasks)] // every writer rotates over the servers
				if c.positioned && next == 0 {
					if next = nextSeq(ctx, tasks, task); next == 0 {
						continue
					}
				}
				req := connect.NewRequest(&warrenv1.AppendEventsRequest{
					TaskId:      task,
					RequestId:   prefix + "-" + strconv.Itoa(i) + "-" + strconv.Itoa(n),
					Events:      events,
					ExpectedSeq: next,
				})
				// A direct call gets a deadline of its own; client.Appender
				// bounds its calls and retries itself (15 s a call, its
				// retry window), as a node daemon's writers rely on.
				cctx, cancel := ctx, context.CancelFunc(func() {})
				if len(apps) == 0 {
					cctx, cancel = context.WithTimeout(ctx, 10*time.Second)
				}
				s := time.Now()
				if c.rate > 0 {
					s = due // a late start is part of the latency
					due = due.Add(interval)
				}
				var err error
				var last uint64
				if len(apps) > 0 {
					var r *warrenv1.AppendEventsResponse
					if r, err = apps[i%len(apps)].Append(cctx, req.Msg); err == nil {
						last = r.GetLastSeq()
					}
				} else {
					var r *connect.Response[warrenv1.AppendEventsResponse]
					if r, err = srv.AppendEvents(cctx, req); err == nil {
						last = r.Msg.GetLastSeq()
					}
				}
				e := time.Now()
				cancel()
				if c.positioned {
					next = 0 // ask the log after an error
					if err == nil {
						next = last + 1
					}
				}
				if e.Before(t0) || e.After(t1) {
					continue
				}
				if err != nil {
					if ctx.Err() == nil {
						o.errs[errKey(err)]++
					}
					continue
				}
				o.lat = append(o.lat, e.Sub(s))
			}
		})
	}

	leaderIndex := func() (uint64, error) {
		leader, err := cl.WaitStable(ctx, 10*time.Second)
		if err != nil {
			return 0, err
		}
		st, err := leader.Status(ctx)
		return st.GetLastLogIndex(), err
	}
	var idx0, idx1 uint64
	var cpu0, cpu1 [4]time.Duration
	appStats := func() (s client.AppenderStats) {
		for _, a := range apps {
			st := a.Stats()
			s.Calls += st.Calls
			s.Appends += st.Appends
		}
		return s
	}
	sleepUntil(ctx, t0)
	idx0, err0 := leaderIndex()
	cpu0 = cpuTimes(cl)
	app0 := appStats()
	sleepUntil(ctx, t1)
	idx1, err1 := leaderIndex()
	cpu1 = cpuTimes(cl)
	app1 := appStats()
	stop.Store(true)
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		return result{}, errors.New("writers did not stop 20s after the run ended")
	}
	if err := ctx.Err(); err != nil {
		return result{}, err
	}

	res := result{errSamples: map[string]int{}}
	for _, o := range outs {
		res.lat = append(res.lat, o.lat...)
		for k, n := range o.errs {
			res.errors += n
			res.errSamples[k] += n
		}
	}
	slices.Sort(res.lat)
	res.acked = len(res.lat) * c.batch
	secs := c.duration.Seconds()
	res.perSec = float64(res.acked) / secs
	if err0 == nil && err1 == nil && idx1 > idx0 {
		res.perEntry = float64(res.acked) / float64(idx1-idx0)
	}
	if app1.Calls > app0.Calls {
		res.perCall = float64(app1.Appends-app0.Appends) / float64(app1.Calls-app0.Calls)
	}
	res.cpuBench = (cpu1[0] - cpu0[0]).Seconds() / secs
	res.cpuServers = (cpu1[1] - cpu0[1]).Seconds() / secs
	res.cpuOther = max(0, (cpu1[2]-cpu0[2]).Seconds()/secs-res.cpuBench-res.cpuServers)
	res.ioWait = (cpu1[3] - cpu0[3]).Seconds() / secs
	return res, nil
}

// cpuTimes returns the CPU time used so far by this process, by all
// servers together, and by the whole machine, and the machine's iowait.
func cpuTimes(cl *cluster.Cluster) [4]time.Duration {
	var s time.Duration
	for _, n := range cl.Nodes {
		d, _ := n.CPUTime()
		s += d
	}
	return [4]time.Duration{cluster.SelfCPUTime(), s, cluster.MachineBusy(), cluster.MachineIOWait()}
}

func errKey(err error) string {
	return textcut.Ellipsis(err.Error(), 160)
}

func sleepUntil(ctx context.Context, t time.Time) {
	select {
	case <-ctx.Done():
	case <-time.After(time.Until(t)):
	}
}

// pct returns the q-quantile of sorted durations (nearest rank).
func pct(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted))+0.999999) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

func ms(d time.Duration) string {
	v := float64(d) / float64(time.Millisecond)
	switch {
	case v < 10:
		return fmt.Sprintf("%.2f ms", v)
	case v < 100:
		return fmt.Sprintf("%.1f ms", v)
	}
	return fmt.Sprintf("%.0f ms", v)
}

func median[T int | float64 | time.Duration](xs []T) T {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func collect[T any](rs []result, f func(result) T) []T {
	out := make([]T, len(rs))
	for i, r := range rs {
		out[i] = f(r)
	}
	return out
}

// how says how writers reach the cluster.
func how(c config, who, proto string) string {
	s := fmt.Sprintf("writers share up to %d tasks", c.maxTasks)
	if c.positioned {
		s = "each writer owns one task and names the seq of its events (expected_seq)"
	}
	if c.appenders > 0 {
		return fmt.Sprintf("%s; writers share %d client.Appenders (simulated node daemons, each starting on a different server) that batch their appends into AppendEventsBatch calls, %s", s, c.appenders, proto)
	}
	return fmt.Sprintf("%s; one AppendEvents call per append, each writer's calls round-robin over %s, %s", s, who, proto)
}

// render returns the markdown report.
func render(c config, results map[int][]result) string {
	var b strings.Builder
	proto := "HTTP/1.1, one connection per writer"
	if c.h2c {
		proto = "HTTP/2 cleartext (h2c), multiplexed"
	}
	if !c.gzip {
		proto += ", gzip responses not accepted"
	}
	host, _ := os.Hostname()
	who := map[string]string{"all": "the 3 servers", "leader": "the leader only", "followers": "the 2 followers only"}[c.targets]
	fmt.Fprintf(&b, "\n## Event appends, 3 servers on loopback\n\n")
	if c.rate > 0 {
		fmt.Fprintf(&b, "**Open loop**: %.0f events/s offered in all, each writer on a fixed schedule of its own; latency runs from when an append was due, so one that waited behind a slow one counts its wait. The events/s column is what was acknowledged.\n\n", c.rate)
	}
	fmt.Fprintf(&b, "%s: %d cores (GOMAXPROCS %d), %s, %s. Bench client on the same machine. "+
		"%d event(s) of %d B per append (latency is per append), %s; "+
		"%s measured after %s warm-up, median of %d runs. Server flags: %s.\n\n",
		host, runtime.NumCPU(), runtime.GOMAXPROCS(0), runtime.GOOS+"/"+runtime.GOARCH, runtime.Version(),
		c.batch, c.payload, how(c, who, proto), c.duration, c.warmup, c.runs, strings.Join(c.serverArgs, " "))
	b.WriteString("| writers | events/s | p50 | p99 | p99.9 | errors | events/raft entry | appends/call | CPU cores: bench / servers / other | iowait cores |\n")
	b.WriteString("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, w := range c.writers {
		rs := results[w]
		errs := 0
		for _, r := range rs {
			errs += r.errors
		}
		perCall := "–"
		if c.appenders > 0 {
			perCall = fmt.Sprintf("%.1f", median(collect(rs, func(r result) float64 { return r.perCall })))
		}
		fmt.Fprintf(&b, "| %d | %.0f | %s | %s | %s | %d | %.1f | %s | %.2f / %.2f / %.2f | %.2f |\n", w,
			median(collect(rs, func(r result) float64 { return r.perSec })),
			ms(median(collect(rs, func(r result) time.Duration { return pct(r.lat, 0.50) }))),
			ms(median(collect(rs, func(r result) time.Duration { return pct(r.lat, 0.99) }))),
			ms(median(collect(rs, func(r result) time.Duration { return pct(r.lat, 0.999) }))),
			errs,
			median(collect(rs, func(r result) float64 { return r.perEntry })),
			perCall,
			median(collect(rs, func(r result) float64 { return r.cpuBench })),
			median(collect(rs, func(r result) float64 { return r.cpuServers })),
			median(collect(rs, func(r result) float64 { return r.cpuOther })),
			median(collect(rs, func(r result) float64 { return r.ioWait })))
	}
	b.WriteString("\nerrors: total over all runs. events/raft entry: acknowledged appends per leader log entry (group commit batch size). appends/call: appends per AppendEventsBatch call of the client.Appenders (their batch size; – without -appenders). " +
		"CPU: cores busy during the window; other = the rest of the machine (e.g. unrelated builds), which skews the figures when not ~0. " +
		"iowait: cores idle while a disk request was outstanding, that is time the machine waited on its disk (synced raft writes); well above its usual level it marks a disk stall.\n\n")
	const goalW, goalRate, goalP99 = 1024, 20000.0, 50 * time.Millisecond
	if c.rate > 0 {
		b.WriteString("Goal (≥ 20,000 events/s with 1024 writers, p99 ≤ 50 ms): judged on closed-loop runs (without -rate), not on this one.\n")
		return b.String()
	}
	if rs, ok := results[goalW]; ok {
		rate := median(collect(rs, func(r result) float64 { return r.perSec }))
		p99 := median(collect(rs, func(r result) time.Duration { return pct(r.lat, 0.99) }))
		var verdict string
		var miss []string
		if rate < goalRate {
			miss = append(miss, fmt.Sprintf("%.0f events/s is below 20,000", rate))
		}
		if p99 > goalP99 {
			miss = append(miss, fmt.Sprintf("p99 %s is over 50 ms", ms(p99)))
		}
		if len(miss) > 0 {
			verdict = "NOT met: " + strings.Join(miss, "; ")
		} else {
			verdict = fmt.Sprintf("met (%.0f events/s, p99 %s)", rate, ms(p99))
		}
		fmt.Fprintf(&b, "Goal: ≥ 20,000 events/s with 1024 writers, p99 ≤ 50 ms: %s.\n", verdict)
	} else {
		b.WriteString("Goal: ≥ 20,000 events/s with 1024 writers, p99 ≤ 50 ms: not measured (1024 not in -writers).\n")
	}
	return b.String()
}
