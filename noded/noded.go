// Package noded is the node daemon: it joins memberlist gossip, keeps one
// session with the scheduler leader (heartbeats up, commands down), hosts
// task actors on actor/, and runs their sandboxes through a driver.
package noded

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"

	"github.com/warrenhq/warren/actor"
	"github.com/warrenhq/warren/agent"
	"github.com/warrenhq/warren/api"
	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
	"github.com/warrenhq/warren/client"
	"github.com/warrenhq/warren/internal/gossip"
	"github.com/warrenhq/warren/noded/driver"
)

// Config is one node daemon's configuration.
type Config struct {
	ID         string
	DataDir    string
	Servers    []string // API URLs of the servers
	GossipAddr string   // HOST:PORT for memberlist; "" runs without gossip (tests)
	JoinGossip []string
	// GossipFleet uses memberlist's slower fleet timing (many simulated
	// nodes per process) instead of the LAN tuning.
	GossipFleet bool
	Driver      driver.Driver
	// Egress, if set, is the node's egress policy; the driver was given it
	// as its Networks. The daemon binds each claimed sandbox's network to
	// its policy, sends its audit to the task's log, and closes it last.
	Egress *Egress
	// Models, if set, is the model gateway's settings for tasks that run
	// the agent loop (a task with a model_script needs none).
	Models *Models
	// Git is the node's git service (clone cache, diff checks, push,
	// forge); nil: one under DataDir/git with the default checks, pushing
	// anonymously and opening no pull request on a forge.
	Git *agent.GitService
	// ApprovalGrace is how long an agent task waiting for approval keeps
	// its sandbox and its room on the node; then it parks (its workspace
	// is the last checkpoint on the log), and the decision resumes it on
	// any node. 0 means DefaultApprovalGrace.
	ApprovalGrace time.Duration
	Capacity      *warrenv1.Resources
	Labels        map[string]string
	Templates     []string
	Address       string // informational, shown in `warren nodes list`
	// SandboxListen, if set, is the HOST:PORT the node serves its
	// SandboxService on; servers forward sandbox calls there. Port 0 picks
	// a free one.
	SandboxListen string

	// Heartbeat is used until the leader's Welcome names one; 0 means 500ms.
	Heartbeat time.Duration
	// OrphanSweep is how often the node looks for task sandboxes no actor
	// holds (orphanSweepEvery if 0); see sweepOrphans.
	OrphanSweep time.Duration
	Logger      *slog.Logger
	// Shared, if set, is the API client, appender and session transport of
	// a process that hosts many daemons (simulated fleets); otherwise each
	// daemon has its own. Partition works only without it.
	Shared *Shared
	// Metrics, if set, counts appends and their latency (may be shared).
	Metrics *Metrics
	// AfterRecord, if set, is called with the key of each agent event once
	// its append has landed ("agent/step-3/model"). It is a test knob:
	// `warren node` sets it from WARREN_TEST_CRASH_AFTER to kill itself at
	// an exact point of a task.
	AfterRecord func(key string)
	// AfterPublish, if set, is called with the finish step's context once
	// the branch is pushed and the pull request made, before they are
	// recorded. A test knob.
	AfterPublish func(ctx context.Context)
}

// Shared is what daemons in one process can share.
type Shared struct {
	Client   *client.Client
	Appender *client.Appender
	H2C      *http.Client
	HTTP     *http.Client
}

// NewShared makes a Shared for servers.
func NewShared(servers []string) (*Shared, error) {
	n := newNetFaults()
	cl, err := client.NewWith(strings.Join(servers, ","), n.client(false))
	if err != nil {
		return nil, err
	}
	return &Shared{Client: cl, Appender: cl.NewAppender(16, 1024), H2C: n.client(true), HTTP: n.client(false)}, nil
}

// Validate reports every problem at once.
func (c *Config) Validate() error {
	var errs []error
	if c.ID == "" {
		errs = append(errs, errors.New("id: required"))
	}
	if c.DataDir == "" {
		errs = append(errs, errors.New("data: required"))
	}
	if len(c.Servers) == 0 {
		errs = append(errs, errors.New("servers: at least one server URL is required"))
	}
	for _, s := range c.Servers {
		if !strings.HasPrefix(s, "http://") && !strings.HasPrefix(s, "https://") {
			errs = append(errs, fmt.Errorf("servers: %q must start with http:// or https://", s))
		}
	}
	if c.Driver == nil {
		errs = append(errs, errors.New("driver: required"))
	}
	if c.Capacity.GetMilliCpu() <= 0 || c.Capacity.GetMemoryBytes() <= 0 {
		errs = append(errs, fmt.Errorf("capacity: cpu and memory must both be positive, got %dm and %d B",
			c.Capacity.GetMilliCpu(), c.Capacity.GetMemoryBytes()))
	}
	return errors.Join(errs...)
}

// Daemon is a running node daemon.
type Daemon struct {
	cfg         Config
	log         *slog.Logger
	incarnation string
	cl          *client.Client
	app         *client.Appender
	h2c, plain  *http.Client
	sys         *actor.System
	gossip      *gossip.Member
	net         *netFaults

	mu     sync.Mutex
	actors map[string]*taskRef // task id -> its actor
	// early holds requests to give a task back that came before the
	// task's actor under their epoch: the leader asks as soon as it sees
	// the placement applied, which can be before the placement's StartTask
	// reaches the node. startTask hands each to its actor.
	early map[string]earlyYield
	stats Stats

	ctx       context.Context
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	closeOnce sync.Once
	closing   bool // Close began (under mu)
	closeErr  error

	git        *agent.GitService
	sandboxSrv *http.Server
	sandboxURL string
	// Sandboxes serves the node's SandboxService (nil without SandboxListen).
	Sandboxes *SandboxAPI
	// poolFit checks the pool targets of a node without a sandbox API
	// (Sandboxes has its own).
	poolFit poolFit
	// poolQ holds the session's pool targets not yet applied, and
	// poolBusy says a goroutine applies them (applyPoolsLater); under mu.
	poolQ    []func()
	poolBusy bool
	// verifying counts, per task, the verification sandboxes its finish
	// step holds now (verify.go); heartbeats report the tasks. Under mu.
	verifying map[string]int
}

// Stats counts what the daemon did (tests and benchmarks read them).
type Stats struct {
	Started, Finished, Yielded, StoppedStale, Stopped int
	Parked                                            int // agent tasks parked to wait for approval
	Sessions                                          int // sessions opened
	// Requests to give a task back (drain) recorded, and those withdrawn
	// before the task's actor acted on them (uncordon, or the session's
	// end; see MetricsSnapshot).
	YieldAsked, YieldWithdrawn int
}

type taskRef struct {
	ref    *actor.Ref
	epoch  uint64
	cancel context.CancelFunc
	yield  *atomic.Pointer[yieldRequest] // shared with the actor: see taskActor.yield
}

// Start runs a node daemon until Close.
func Start(cfg Config) (*Daemon, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("data: %w", err)
	}
	// Task workspaces a previous run left (a task that moved to another
	// node while this one was down keeps no actor here to remove its
	// checkout): an actor makes its own afresh, so none is needed.
	if err := os.RemoveAll(workRoot(cfg.DataDir)); err != nil {
		return nil, fmt.Errorf("data: remove the last run's workspaces: %w", err)
	}
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	d := &Daemon{cfg: cfg, log: cfg.Logger.With("node", cfg.ID), incarnation: hex.EncodeToString(b),
		actors: map[string]*taskRef{}, net: newNetFaults(), git: cfg.Git, poolFit: poolFit{mem: nodeMemBytes(cfg.Capacity.GetMemoryBytes())}}
	if d.git == nil {
		d.git = agent.NewGitService(filepath.Join(cfg.DataDir, "git"), nil, nil, agent.CheckConfig{}, false)
		d.git.AllowLocal = true // no forge: a test's or a demo's node
	}
	if cfg.Shared != nil {
		d.cl, d.app, d.h2c, d.plain = cfg.Shared.Client, cfg.Shared.Appender, cfg.Shared.H2C, cfg.Shared.HTTP
	} else {
		cl, err := client.NewWith(strings.Join(cfg.Servers, ","), d.net.client(false))
		if err != nil {
			return nil, fmt.Errorf("servers: %w", err)
		}
		d.cl, d.app, d.h2c, d.plain = cl, cl.NewAppender(8, 1024), d.net.client(true), d.net.client(false)
	}
	if cfg.Metrics == nil {
		cfg.Metrics = &Metrics{}
		d.cfg.Metrics = cfg.Metrics
	}
	var err error
	d.sys = actor.NewSystem(actor.Config{Logger: d.log, OnEscalate: d.actorFailed})
	d.ctx, d.cancel = context.WithCancel(context.Background())
	if cfg.GossipAddr != "" {
		if d.gossip, err = gossip.Start(gossip.Config{Role: gossip.RoleNode, ID: cfg.ID, Addr: cfg.GossipAddr,
			Join: cfg.JoinGossip, Logger: d.log, Wrap: d.net.wrapGossip, Fleet: cfg.GossipFleet}); err != nil {
			if cfg.Shared == nil {
				d.app.Close()
			}
			return nil, err
		}
	}
	d.destroyForeignSandboxes()
	if cfg.SandboxListen != "" {
		if err := d.serveSandboxes(); err != nil {
			d.cancel()
			if d.gossip != nil {
				d.gossip.Close()
			}
			if cfg.Shared == nil {
				d.app.Close()
			}
			return nil, err
		}
	}
	d.wg.Add(1)
	go d.sessionLoop()
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		sweepBlobs(d.ctx, blobDir(cfg), blobSweepEvery, blobRetain, d.log.With("component", "blobgc"))
	}()
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		d.sweepOrphans(orDuration(cfg.OrphanSweep, orphanSweepEvery))
	}()
	d.log.Info("node daemon started", "driver", cfg.Driver.Name(), "servers", cfg.Servers, "gossip", cfg.GossipAddr)
	return d, nil
}

// Close stops the actors (their tasks stay leased to this node until it is
// declared down, or until the daemon comes back), leaves gossip and
// destroys the sandboxes. Later calls return the first's result.
func (d *Daemon) Close() error {
	d.closeOnce.Do(func() { d.closeErr = d.close() })
	return d.closeErr
}

func (d *Daemon) close() error {
	d.mu.Lock()
	d.closing = true // no goroutine joins d.wg from now on
	d.mu.Unlock()
	d.cancel()
	d.wg.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	errs := []error{d.sys.Shutdown(ctx)}
	if d.sandboxSrv != nil {
		errs = append(errs, d.sandboxSrv.Close())
	}
	if d.cfg.Shared == nil {
		d.app.Close()
	}
	if d.gossip != nil {
		errs = append(errs, d.gossip.Close())
	}
	errs = append(errs, d.cfg.Driver.Close())
	errs = append(errs, d.cfg.Egress.Close())
	return errors.Join(errs...)
}

// Running returns the number of task actors.
func (d *Daemon) Running() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.actors)
}

// Stats returns a copy of the counters.
func (d *Daemon) Stats() Stats {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.stats
}

// Partition cuts (true) or restores (false) all of the daemon's traffic
// to the servers and the other gossip members, as a network partition
// would. It is for tests.
func (d *Daemon) Partition(cut bool) { d.net.set(cut) }

func (d *Daemon) node() *warrenv1.Node {
	drv := d.cfg.Driver
	templates := d.cfg.Templates
	if lt, ok := drv.(interface{ Templates() []string }); ok && len(templates) == 0 {
		// A name the servers refuse would get every hello refused: such
		// a template (made by hand, or by an older `warren image
		// build`) is left out, with a warning.
		for _, t := range lt.Templates() {
			if api.TemplateNameRE.MatchString(t) {
				templates = append(templates, t)
			} else {
				d.log.Warn("template left out of what this node advertises: its name "+api.TemplateNameRule, "template", t)
			}
		}
	}
	return &warrenv1.Node{
		Id: d.cfg.ID, Drivers: []string{drv.Name()}, Templates: templates, Labels: d.cfg.Labels,
		Capacity: d.cfg.Capacity, Accelerator: drv.Accelerator(), Address: d.cfg.Address, SandboxUrl: d.sandboxURL,
	}
}

func (d *Daemon) running() []*warrenv1.RunningTask {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]*warrenv1.RunningTask, 0, len(d.actors))
	for id, r := range d.actors {
		out = append(out, &warrenv1.RunningTask{TaskId: id, Epoch: r.epoch})
	}
	return out
}

// startTask spawns the task's actor unless one runs it already under the
// same or a newer epoch; an actor under an older epoch is stopped first.
func (d *Daemon) startTask(m *warrenv1.StartTask) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if cur, ok := d.actors[m.GetTaskId()]; ok {
		if cur.epoch >= m.GetEpoch() {
			return
		}
		cur.cancel()
		cur.ref.Stop()
		delete(d.actors, m.GetTaskId())
	}
	ctx, cancel := context.WithCancel(d.ctx)
	id, epoch, resume, task := m.GetTaskId(), m.GetEpoch(), m.GetResume(), m.GetTask()
	if task.GetId() != id || task.GetLease().GetEpoch() != epoch {
		task = nil // not this lease's: read it
	}
	var spawned bool // the factory runs again for each restart after a panic
	yield := new(atomic.Pointer[yieldRequest])
	if y := d.takeEarly(id, epoch); y != nil {
		yield.Store(y)
	}
	ref, err := d.sys.Spawn(fmt.Sprintf("task-%s-e%d", id, epoch),
		func() actor.Behavior {
			// Only the first actor starts from the task StartTask carried:
			// a restarted one reads it afresh, with the steps since done
			// (the snapshot would have it rerun them all).
			given := task
			if spawned {
				given = nil
			}
			spawned = true
			return &taskActor{d: d, id: id, epoch: epoch, resume: resume, given: given, ctx: ctx, yield: yield}
		},
		actor.WithMailbox(16),
		actor.WithPolicy(actor.RestartPolicy{MaxRestarts: 3, Window: time.Minute}))
	if err != nil {
		cancel()
		d.log.Error("spawn task actor", "task", m.GetTaskId(), "err", err)
		return
	}
	d.actors[m.GetTaskId()] = &taskRef{ref: ref, epoch: m.GetEpoch(), cancel: cancel, yield: yield}
	d.stats.Started++
}

// earlyYield is a request to give a task back under a lease whose actor
// has not started yet.
type earlyYield struct {
	epoch uint64
	why   string
}

// stopTask handles a StopTask command.
func (d *Daemon) stopTask(m *warrenv1.StopTask) {
	if m.GetYield() {
		d.yieldTask(m)
		return
	}
	d.mu.Lock()
	cur, ok := d.actors[m.GetTaskId()]
	if !ok || cur.epoch > m.GetEpoch() {
		d.mu.Unlock()
		return
	}
	delete(d.actors, m.GetTaskId())
	d.stats.Stopped++
	d.mu.Unlock()
	d.log.Info("stopping task actor", "task", m.GetTaskId(), "epoch", m.GetEpoch(), "reason", m.GetReason())
	cur.cancel()
	cur.ref.Stop()
}

// yieldTask records a request to give a task back (StopTask with yield)
// for the task's actor to act on at its next step boundary. The leader
// asks once per lease, so a request for a lease whose actor is not
// running yet is kept for it.
func (d *Daemon) yieldTask(m *warrenv1.StopTask) {
	why := m.GetReason()
	if why == "" {
		why = "asked to yield"
	}
	id, epoch := m.GetTaskId(), m.GetEpoch()
	d.mu.Lock()
	defer d.mu.Unlock()
	cur, ok := d.actors[id]
	switch {
	case ok && cur.epoch > epoch:
		// An older lease's request.
	case ok && cur.epoch == epoch:
		if cur.yield.CompareAndSwap(nil, &yieldRequest{why: why}) {
			d.stats.YieldAsked++
		}
	default:
		if e, dup := d.early[id]; dup && e.epoch >= epoch {
			return
		}
		if d.early == nil {
			d.early = make(map[string]earlyYield)
		}
		d.early[id] = earlyYield{epoch: epoch, why: why}
		d.stats.YieldAsked++
	}
}

// takeEarly returns the request to give the task back that came before
// its actor under epoch, if one did, and forgets requests for older
// leases. d.mu is held.
func (d *Daemon) takeEarly(id string, epoch uint64) *yieldRequest {
	e, ok := d.early[id]
	if !ok || e.epoch > epoch {
		return nil
	}
	delete(d.early, id)
	if e.epoch < epoch {
		return nil
	}
	return &yieldRequest{why: e.why}
}

// dropYields drops every request to give a task back that no actor has
// taken yet, when the session they came on ends: only its leader could
// withdraw them, and it no longer can (an uncordon committed meanwhile
// would not reach the node). If the node is still draining, the next
// session's leader asks again within a liveness round.
func (d *Daemon) dropYields() {
	d.mu.Lock()
	n := len(d.early)
	clear(d.early)
	for _, r := range d.actors {
		if withdrawYield(r) {
			n++
		}
	}
	d.stats.YieldWithdrawn += n
	d.mu.Unlock()
	if n > 0 {
		d.log.Info("session ended: dropped requests to give tasks back", "tasks", n)
	}
}

// yieldRequest is a request to give a task back. taken marks one its actor
// has started acting on: its append of state_changed to pending may have
// landed even if the actor saw an error, so from then on the actor goes on
// giving the task back and nothing withdraws the request. The actor takes
// it by swapping in a taken copy, so a withdrawal and the taking cannot
// both succeed.
type yieldRequest struct {
	why   string
	taken bool
}

// withdrawYield removes r's request to give its task back unless its
// actor took it, and reports whether it did.
func withdrawYield(r *taskRef) bool {
	p := r.yield.Load()
	return p != nil && !p.taken && r.yield.CompareAndSwap(p, nil)
}

// keepTask handles a KeepTask command: it withdraws a request to give the
// task back, unless the actor already acted on it (then the task has left,
// or is leaving, under this epoch).
func (d *Daemon) keepTask(m *warrenv1.KeepTask) {
	id, epoch := m.GetTaskId(), m.GetEpoch()
	d.mu.Lock()
	withdrawn := false
	if e, ok := d.early[id]; ok && e.epoch == epoch {
		delete(d.early, id)
		withdrawn = true
	} else if cur, ok := d.actors[id]; ok && cur.epoch == epoch {
		withdrawn = withdrawYield(cur)
	}
	if withdrawn {
		d.stats.YieldWithdrawn++
	}
	d.mu.Unlock()
	if withdrawn {
		d.log.Info("request to give the task back withdrawn", "task", id, "epoch", epoch)
	}
}

// actorFailed ends the task of an actor that failed more often than its
// restart policy allows (it is stopped, its sandbox destroyed): the task
// leaves the node and fails, saying why. Left alone, it would stay leased
// here with nothing running it, as the node still heartbeats.
func (d *Daemon) actorFailed(ref *actor.Ref, err error) {
	d.mu.Lock()
	var id string
	var epoch uint64
	for tid, cur := range d.actors {
		if cur.ref == ref {
			id, epoch = tid, cur.epoch
			break
		}
	}
	d.mu.Unlock()
	if id == "" {
		return
	}
	d.actorDone(id, epoch, &d.stats.Finished)
	if d.ctx.Err() != nil {
		return // closing: the task stays leased here, as Close says
	}
	reason := failedReason("the node's task actor kept failing: " + err.Error())
	d.mu.Lock()
	if d.closing { // Close is waiting on d.wg: it must not grow now
		d.mu.Unlock()
		return
	}
	d.wg.Add(1)
	d.mu.Unlock()
	go func() { // OnEscalate must not block
		defer d.wg.Done()
		// Until it lands, is refused for good (the lease moved on, say),
		// or the node closes: one failed attempt left the task leased here
		// with nothing running it until the session was cut. The request
		// id makes the attempts one append.
		wait := time.Second
		for {
			ctx, cancel := context.WithTimeout(d.ctx, time.Minute)
			_, aerr := d.app.Append(ctx, leaseAppend(id, epoch, "actor-failed", ev("state_changed", map[string]any{"to": "failed", "reason": reason})))
			cancel()
			if aerr == nil {
				return
			}
			if !retryableAppend(aerr) || d.ctx.Err() != nil {
				d.log.Warn("record a failed task actor", "task", id, "epoch", epoch, "err", aerr)
				return
			}
			d.log.Warn("record a failed task actor: trying again", "task", id, "epoch", epoch, "err", aerr, "in", wait)
			select {
			case <-d.ctx.Done():
				return
			case <-time.After(wait):
			}
			wait = min(2*wait, 30*time.Second)
		}
	}()
}

// retryableAppend reports whether an append that failed with err may land
// if sent again: the servers were unreachable, busy or without a leader,
// or the call ran out of time. A refusal (a lease that moved on, a task
// that ended, a bad request) is for good.
func retryableAppend(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	switch connect.CodeOf(err) {
	case connect.CodeUnavailable, connect.CodeDeadlineExceeded, connect.CodeResourceExhausted, connect.CodeAborted:
		return true
	}
	return false
}

// actorDone removes a task actor that ended by itself.
func (d *Daemon) actorDone(id string, epoch uint64, how *int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if cur, ok := d.actors[id]; ok && cur.epoch == epoch {
		cur.cancel()
		delete(d.actors, id)
	}
	if how != nil {
		*how++
	}
}
