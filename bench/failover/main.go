// Command failover measures how long a 3-server warren cluster on loopback
// refuses writes after its leader dies: the time from the leader's SIGKILL
// (T0) to the first acknowledged append on the new leader (T1), as the
// median of -runs runs (goal: ≤ 2 s).
//
// A light steady load (a few writers appending through the followers) runs
// throughout. Each run finds the leader with Status, sends it SIGKILL, and
// from then on sends probe appends straight to both survivors, a new one
// every -probe-every; the first append issued after T0 and acknowledged
// ends the run, and Status must then show a different leader with a higher
// term. The killed server is restarted (same id, ports and data directory)
// and must catch up before the next run.
//
// Run from the repository root:
//
//	go run ./bench/failover                  # builds cmd/warren itself
//	go run ./bench/failover -warren bin/warren -runs 10 -out failover.md
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
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
)

type config struct {
	binary      string
	runs        int
	loadWriters int
	loadPause   time.Duration
	probeEvery  time.Duration
	runTimeout  time.Duration
	out         string
	serverArgs  []string
	keep        bool
	quiet       float64
	quietWait   time.Duration
}

func main() {
	var c config
	var serverArgs string
	flag.StringVar(&c.binary, "warren", "", "path to the warren binary (default: go build ./cmd/warren into a temp dir)")
	flag.IntVar(&c.runs, "runs", 10, "leader kills")
	flag.IntVar(&c.loadWriters, "load-writers", 4, "writers appending through the followers throughout")
	flag.DurationVar(&c.loadPause, "load-pause", 10*time.Millisecond, "pause between one load writer's appends")
	flag.DurationVar(&c.probeEvery, "probe-every", 20*time.Millisecond, "after the kill, start a probe append to a survivor this often")
	flag.DurationVar(&c.runTimeout, "run-timeout", 30*time.Second, "give up on a run (kill to ack, or restart to caught up) after this long")
	flag.StringVar(&c.out, "out", "", "also write the markdown report to this file")
	flag.StringVar(&serverArgs, "server-args", "--log-level=warn", "extra flags for every server, space-separated")
	flag.BoolVar(&c.keep, "keep", false, "keep the cluster's data directories and logs")
	flag.Float64Var(&c.quiet, "quiet", 0.3, "before each run, wait until other processes use fewer than this many cores")
	flag.DurationVar(&c.quietWait, "quiet-wait", 3*time.Minute, "wait at most this long for -quiet, then run anyway (0: never wait)")
	flag.Parse()
	if c.runs < 1 || c.loadWriters < 0 || c.probeEvery <= 0 || c.runTimeout <= 0 {
		fmt.Fprintln(os.Stderr, "-runs, -probe-every and -run-timeout must be positive, -load-writers not negative")
		os.Exit(2)
	}
	c.serverArgs = strings.Fields(serverArgs)
	os.Exit(cluster.Run(func(ctx context.Context) error { return run(ctx, c) }))
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, time.Now().Format("15:04:05.000 ")+format+"\n", args...)
}

// outcome is one run.
type outcome struct {
	killed, newLeader string
	oldTerm, newTerm  uint64
	elected           time.Duration // T0 to a survivor first naming a new leader
	firstAck          time.Duration // T0 to T1
	ackVia            string        // the server that acknowledged first
	catchUp           time.Duration // restart to caught up
}

// ackTracker records the first append issued after T0 and acknowledged.
type ackTracker struct {
	mu    sync.Mutex
	t0    time.Time
	first time.Time
	via   string
	done  chan struct{}
}

func (a *ackTracker) arm(t0 time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.t0, a.first, a.via, a.done = t0, time.Time{}, "", make(chan struct{})
}

func (a *ackTracker) disarm() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.t0 = time.Time{}
}

// acked reports an acknowledged append issued at issued through via.
func (a *ackTracker) acked(issued, at time.Time, via string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.t0.IsZero() || issued.Before(a.t0) || !a.first.IsZero() {
		return
	}
	a.first, a.via = at, via
	close(a.done)
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

	hc := cluster.HTTPClient(false, 64)
	tasks := map[string]warrenv1connect.TaskServiceClient{}
	for _, n := range cl.Nodes {
		tasks[n.ID] = warrenv1connect.NewTaskServiceClient(hc, n.URL)
	}
	taskIDs := make([]string, max(c.loadWriters, 1))
	for i := range taskIDs {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		resp, err := tasks[cl.Nodes[i%len(cl.Nodes)].ID].CreateTask(cctx, connect.NewRequest(&warrenv1.CreateTaskRequest{
			RequestId: fmt.Sprintf("failover-%d-%d", time.Now().UnixNano(), i),
			Spec:      &warrenv1.TaskSpec{Repo: "https://example.com/r.git", Base: "main", IssueTitle: "bench failover"},
		}))
		cancel()
		if err != nil {
			return fmt.Errorf("create task: %w", err)
		}
		taskIDs[i] = resp.Msg.GetTask().GetId()
	}

	var seq atomic.Int64
	appendVia := func(ctx context.Context, id string, task string, timeout time.Duration) error {
		cctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		_, err := tasks[id].AppendEvents(cctx, connect.NewRequest(&warrenv1.AppendEventsRequest{
			TaskId:    task,
			RequestId: "fo-" + strconv.FormatInt(seq.Add(1), 10),
			Events:    []*warrenv1.EventInput{{Kind: "log", Payload: []byte(`{"msg":"failover bench"}`)}},
		}))
		return err
	}

	// The load: a few writers appending through the current followers.
	var acks ackTracker
	var followers atomic.Pointer[[]string]
	leader, err := cl.WaitStable(ctx, c.runTimeout)
	if err != nil {
		return err
	}
	fs := survivors(cl, leader)
	followers.Store(&fs)
	var loadOK, loadErr atomic.Int64
	var loadErrsMu sync.Mutex
	loadErrs := map[string]int{}
	loadCtx, stopLoad := context.WithCancel(ctx)
	var loadWG sync.WaitGroup
	defer func() { stopLoad(); loadWG.Wait() }()
	for i := range c.loadWriters {
		loadWG.Go(func() {
			for n := i; loadCtx.Err() == nil; n++ {
				fs := *followers.Load()
				via := fs[n%len(fs)]
				issued := time.Now()
				err := appendVia(loadCtx, via, taskIDs[i], 5*time.Second)
				if err == nil {
					loadOK.Add(1)
					acks.acked(issued, time.Now(), via)
				} else if loadCtx.Err() == nil {
					loadErr.Add(1)
					loadErrsMu.Lock()
					loadErrs[fmt.Sprintf("via %s: %v", via, err)]++
					loadErrsMu.Unlock()
				}
				select {
				case <-loadCtx.Done():
				case <-time.After(c.loadPause):
				}
			}
		})
	}

	var outs []outcome
	moved := 0
	for r := 0; r < c.runs; r++ {
		leader, err := cl.WaitStable(ctx, c.runTimeout)
		if err != nil {
			return fmt.Errorf("run %d: %w\n%s", r+1, err, cl.LogTails(20))
		}
		if c.quietWait > 0 {
			if ok, other := cl.WaitQuiet(ctx, c.quiet, c.quietWait); !ok && ctx.Err() == nil {
				logf("warning: other processes still use %.2f cores after %s; measuring anyway", other, c.quietWait)
			}
		}
		o, err := killOnce(ctx, c, cl, leader, &acks, &followers, appendVia, taskIDs[0])
		if errors.Is(err, errLeaderMoved) && moved < 10 {
			moved++
			logf("run %d: %v; trying again", r+1, err)
			r--
			continue
		}
		if err != nil {
			return fmt.Errorf("run %d: %w\n%s", r+1, err, cl.LogTails(20))
		}
		logf("run %d/%d: killed %s (term %d); %s named leader after %s; first ack via %s after %s; new leader %s (term %d); restarted %s caught up in %s",
			r+1, c.runs, o.killed, o.oldTerm, o.newLeader, ms(o.elected), o.ackVia, ms(o.firstAck), o.newLeader, o.newTerm, o.killed, ms(o.catchUp))
		outs = append(outs, o)
	}
	stopLoad()
	loadWG.Wait()
	for msg, n := range loadErrs {
		logf("load error %d×: %s", n, msg)
	}
	report := render(c, outs, loadOK.Load(), loadErr.Load(), moved)
	fmt.Print(report)
	if c.out != "" {
		return os.WriteFile(c.out, []byte(report), 0o644)
	}
	return nil
}

// errLeaderMoved means leadership changed before the kill; the run is
// tried again.
var errLeaderMoved = errors.New("leadership moved before the kill")

func survivors(cl *cluster.Cluster, leader *cluster.Node) []string {
	var out []string
	for _, n := range cl.Nodes {
		if n != leader {
			out = append(out, n.ID)
		}
	}
	return out
}

// killOnce kills the leader, measures until the first acknowledged write
// on a new leader, then restarts the old leader and waits for it to catch
// up.
func killOnce(ctx context.Context, c config, cl *cluster.Cluster, leader *cluster.Node, acks *ackTracker,
	followers *atomic.Pointer[[]string], appendVia func(context.Context, string, string, time.Duration) error, task string) (outcome, error) {
	o := outcome{killed: leader.ID}
	surv := survivors(cl, leader)
	followers.Store(&surv)
	// Let the load settle on the new followers, and kill at a random point
	// of the heartbeat cycle.
	if err := sleep(ctx, 300*time.Millisecond+rand.N(400*time.Millisecond)); err != nil {
		return o, err
	}
	// Make sure it still leads right before the kill.
	st, err := leader.Status(ctx)
	if err != nil {
		return o, err
	}
	if st.GetRaftState() != "leader" {
		return o, fmt.Errorf("%w: %s is %s in term %d", errLeaderMoved, leader.ID, st.GetRaftState(), st.GetTerm())
	}
	o.oldTerm = st.GetTerm()

	runCtx, cancel := context.WithTimeout(ctx, c.runTimeout)
	defer cancel()
	t0 := leader.Kill()
	acks.arm(t0)
	defer acks.disarm()

	// Watch the survivors' Status for the first one naming a new leader.
	elected := make(chan time.Duration, 1)
	var bg sync.WaitGroup
	defer func() { cancel(); bg.Wait() }()
	bg.Go(func() {
		for runCtx.Err() == nil {
			for _, id := range surv {
				s, err := cl.Node(id).Status(runCtx)
				if err == nil && s.GetLeaderId() != "" && s.GetLeaderId() != leader.ID {
					elected <- time.Since(t0)
					return
				}
			}
			_ = sleep(runCtx, 5*time.Millisecond)
		}
	})
	// Probes: a new append to a survivor every probeEvery, alternating.
	bg.Go(func() {
		var probes sync.WaitGroup
		defer probes.Wait()
		tick := time.NewTicker(c.probeEvery)
		defer tick.Stop()
		for i := 0; ; i++ {
			via := surv[i%len(surv)]
			probes.Go(func() {
				issued := time.Now()
				if err := appendVia(runCtx, via, task, 5*time.Second); err == nil {
					acks.acked(issued, time.Now(), via)
				}
			})
			select {
			case <-runCtx.Done():
				return
			case <-acks.done:
				return
			case <-tick.C:
			}
		}
	})
	select {
	case <-acks.done:
	case <-runCtx.Done():
		return o, fmt.Errorf("no append acknowledged within %s of killing %s", c.runTimeout, leader.ID)
	}
	acks.mu.Lock()
	o.firstAck, o.ackVia = acks.first.Sub(t0), acks.via
	acks.mu.Unlock()
	select {
	case d := <-elected:
		o.elected = d
	case <-time.After(time.Second):
		o.elected = -1 // the Status watcher never saw it
	}

	// Check that a different leader with a higher term is in place.
	for _, id := range surv {
		s, err := cl.Node(id).Status(runCtx)
		if err != nil {
			return o, fmt.Errorf("after the ack: %w", err)
		}
		if s.GetLeaderId() == "" || s.GetLeaderId() == leader.ID || s.GetTerm() <= o.oldTerm {
			return o, fmt.Errorf("after the ack, %s names leader %q in term %d (killed %s in term %d)",
				id, s.GetLeaderId(), s.GetTerm(), leader.ID, o.oldTerm)
		}
		if o.newLeader != "" && s.GetLeaderId() != o.newLeader {
			return o, fmt.Errorf("survivors disagree on the leader: %s and %s", o.newLeader, s.GetLeaderId())
		}
		o.newLeader, o.newTerm = s.GetLeaderId(), s.GetTerm()
	}
	cancel() // stop probes and the Status watcher
	bg.Wait()
	acks.disarm()

	// Restart the killed server and wait until it has caught up.
	if err := leader.WaitExit(5 * time.Second); err != nil {
		return o, err
	}
	restarted := time.Now()
	if err := leader.Restart(); err != nil {
		return o, err
	}
	newLeader := cl.Node(o.newLeader)
	catchCtx, cancelCatch := context.WithTimeout(ctx, c.runTimeout)
	defer cancelCatch()
	var target uint64
	for {
		if target == 0 {
			if s, err := newLeader.Status(catchCtx); err == nil && leader.Running() {
				if _, err := leader.Status(catchCtx); err == nil { // answering: sample the leader now
					target = s.GetCommitIndex()
				}
			}
		}
		if target != 0 {
			if s, err := leader.Status(catchCtx); err == nil && s.GetAppliedIndex() >= target && s.GetLeaderId() == o.newLeader {
				break
			}
		}
		if !leader.Running() {
			return o, fmt.Errorf("restarted %s exited", leader.ID)
		}
		if err := sleep(catchCtx, 10*time.Millisecond); err != nil {
			if ctx.Err() != nil {
				return o, ctx.Err()
			}
			return o, fmt.Errorf("restarted %s did not catch up to index %d within %s", leader.ID, target, c.runTimeout)
		}
	}
	o.catchUp = time.Since(restarted)
	return o, nil
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

func ms(d time.Duration) string {
	if d < 0 {
		return "–"
	}
	return fmt.Sprintf("%.0f ms", float64(d)/float64(time.Millisecond))
}

func stats(ds []time.Duration) (lo, med, hi time.Duration) {
	s := slices.Clone(ds)
	slices.Sort(s)
	med = s[len(s)/2]
	if len(s)%2 == 0 {
		med = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return s[0], med, s[len(s)-1]
}

func render(c config, outs []outcome, loadOK, loadErr int64, moved int) string {
	var b strings.Builder
	host, _ := os.Hostname()
	fmt.Fprintf(&b, "\n## Leader failover, 3 servers on loopback\n\n")
	fmt.Fprintf(&b, "%s: %d cores, %s, %s. Server flags: %s. Load: %d writers through the followers, %s apart; "+
		"probes to both survivors every %s after the kill.\n\n",
		host, runtime.NumCPU(), runtime.GOOS+"/"+runtime.GOARCH, runtime.Version(), strings.Join(c.serverArgs, " "),
		c.loadWriters, c.loadPause, c.probeEvery)
	b.WriteString("| run | killed | new leader | term | new leader named | first ack (T1−T0) | ack via | restart caught up |\n")
	b.WriteString("|---:|---|---|---:|---:|---:|---|---:|\n")
	var acks, named []time.Duration
	for i, o := range outs {
		fmt.Fprintf(&b, "| %d | %s | %s | %d→%d | %s | %s | %s | %s |\n", i+1, o.killed, o.newLeader, o.oldTerm, o.newTerm,
			ms(o.elected), ms(o.firstAck), o.ackVia, ms(o.catchUp))
		acks = append(acks, o.firstAck)
		if o.elected >= 0 {
			named = append(named, o.elected)
		}
	}
	lo, med, hi := stats(acks)
	b.WriteString("\n| | min | median | max |\n|---|---:|---:|---:|\n")
	fmt.Fprintf(&b, "| kill → first acknowledged write | %s | %s | %s |\n", ms(lo), ms(med), ms(hi))
	if len(named) > 0 {
		l, m, h := stats(named)
		fmt.Fprintf(&b, "| kill → a survivor names the new leader | %s | %s | %s |\n", ms(l), ms(m), ms(h))
	}
	fmt.Fprintf(&b, "\nBackground load: %d appends acknowledged, %d failed (failures are expected around a kill). "+
		"Runs retried because leadership moved on its own before the kill: %d.\n\n", loadOK, loadErr, moved)
	verdict := "met"
	if med > 2*time.Second {
		verdict = "NOT met"
	}
	fmt.Fprintf(&b, "Goal: median kill → first acknowledged write on the new leader ≤ 2 s over %d runs: %s (median %s).\n", len(outs), verdict, ms(med))
	return b.String()
}
