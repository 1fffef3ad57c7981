package microvm

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/warrenhq/warren/guest"
	"github.com/warrenhq/warren/internal/atomicfile"
	"github.com/warrenhq/warren/noded/driver"
)

// VM is one microVM: a sandbox once claimed, or a member of a warm pool.
type VM struct {
	driver.AgentCalls // exec and files, through client()

	d         *Driver
	id        string // VM id: directory, cgroup and QEMU -name
	spec      vmSpec
	template  string // name@version
	snapState string // the snapshot state file a paused-to-disk VM resumes from ("" for fresh)
	memShared bool
	from      *snapshot // the snapshot a clone was launched for

	mu        sync.Mutex // serialises lifecycle changes (pause, resume, destroy)
	p         *proc
	qmp       *QMP
	agent     *guest.Client
	state     string // "standby", "pool", "running", "paused", "destroyed"
	sandboxID string
	start     driver.Start
	limits    driver.Limits
	created   time.Time
	expires   time.Time
	claimTime time.Duration
	phases    ClaimPhases
	env       map[string]string
	ttl       *time.Timer
	net       driver.Network // nil: the VM's NIC has no backend
	netNS     string         // at re-adoption: the namespace to take back
	// pausedSize is paused.state's size, recorded in meta.json while
	// paused.
	pausedSize int64
	// bound is closed once a pipelined bind's answer is in (nil: the bind,
	// if any, was waited for); bindErr is why it failed.
	bound   chan struct{}
	bindErr error
	// busy is what Info reports while a pause or resume holds mu.
	busy atomic.Pointer[driver.Info]
	// gone is closed when a destroy has finished (made by the first);
	// another destroy waits for it, so a Destroy or Close that finds one
	// under way (the TTL's, watchExit's) returns once QEMU, the overlay,
	// the tap and the cgroup are gone, not before.
	gone chan struct{}
}

// Network is the VM's network, nil when it has none.
func (vm *VM) Network() driver.Network { return vm.net }

// attachNetwork gives a new VM a network of the node's egress policy, when
// the node has one.
func (vm *VM) attachNetwork(ctx context.Context) error {
	if vm.d.cfg.Networks == nil {
		return nil
	}
	nw, err := vm.d.cfg.Networks.Attach(ctx)
	if err != nil {
		return fmt.Errorf("network: %w", err)
	}
	vm.net = nw
	return nil
}

// vmMeta is what survives a node restart, in <vm dir>/meta.json.
type vmMeta struct {
	ID        string            `json:"id"`
	SandboxID string            `json:"sandbox_id"`
	Template  string            `json:"template"`
	State     string            `json:"state"`
	Start     driver.Start      `json:"start"`
	Limits    driver.Limits     `json:"limits"`
	Created   time.Time         `json:"created"`
	Expires   time.Time         `json:"expires"`
	Spec      vmSpec            `json:"spec"`
	Env       map[string]string `json:"env,omitempty"`
	PausedTo  string            `json:"paused_to,omitempty"`
	// PausedSize is paused.state's size when the pause wrote it: a start
	// that finds the file shorter (or longer) destroys the sandbox
	// instead of keeping one no resume can load. 0 (a pause by an older
	// node): not checked.
	PausedSize int64 `json:"paused_size,omitempty"`
	// NetNS is the sandbox's network namespace, taken back at re-adoption.
	NetNS string `json:"netns,omitempty"`
}

func (d *Driver) vmDir(id string) string { return filepath.Join(d.cfg.StateDir, "vms", id) }

func (vm *VM) cgLimits() cgLimits {
	return cgLimits{CPUs: vm.limits.VCPUs, MemBytes: int64(vm.limits.MemMB+vm.spec.tbSize()+160) << 20, Pids: 256}
}

// launch starts the VM's QEMU in its cgroup and connects QMP; state is
// the saved state an Incoming VM is to load ("" for none).
func (vm *VM) launch(ctx context.Context, state string) error {
	var procs []string
	if vm.d.cg != nil {
		var err error
		if procs, err = vm.d.cg.create(vm.id, vm.cgLimits()); err != nil {
			return err
		}
		if vm.sandboxID == "" { // a warm-pool member: low CPU weight until claimed
			_ = vm.d.cg.setLow(vm.id, true)
		}
	}
	var tap *os.File
	vm.spec.Tap = false
	if vm.net != nil {
		var err error
		if tap, err = vm.net.OpenTap(); err != nil {
			return fmt.Errorf("network: %w", err)
		}
		defer tap.Close() // QEMU holds its own copy
		vm.spec.Tap = true
	}
	p, err := start(vm.d.cfg.QEMU, vm.spec, procs, tap, state)
	if err != nil {
		return err
	}
	vm.p = p
	// A QEMU that exits before its QMP socket answers (or a shell that
	// could not put it in its cgroup) ends the wait, instead of leaving
	// it to the caller's deadline.
	qctx, cancel := whileRunning(ctx, p.exited)
	defer cancel()
	q, err := DialQMP(qctx, vm.spec.qmpPath())
	if err != nil {
		select {
		case <-p.exited:
			return fmt.Errorf("qemu exited before QMP answered: %s", tail(filepath.Join(vm.spec.Dir, "qemu.log")))
		default:
		}
		return fmt.Errorf("%w: %s", err, tail(filepath.Join(vm.spec.Dir, "qemu.log")))
	}
	vm.qmp = q
	return nil
}

// restore starts a clone of snap, loaded but paused: in one of the
// template's standby QEMUs when standby is set and one is ready, else in
// a QEMU it launches.
func (d *Driver) restore(ctx context.Context, ts *tplState, snap *snapshot, sandboxID string, lim driver.Limits, standby bool) (*VM, error) {
	var vm *VM
	if standby {
		vm = d.takeStandby(ts, snap)
	}
	if vm != nil {
		vm.mu.Lock()
		vm.sandboxID, vm.limits, vm.created, vm.state = sandboxID, lim, time.Now(), "running"
		vm.phases = ClaimPhases{Standby: true}
		vm.mu.Unlock()
		if d.cg != nil && sandboxID != "" {
			_ = d.cg.setLow(vm.id, false)
		}
		err := vm.load(ctx)
		switch {
		case err == nil:
			return vm, nil
		case ctx.Err() != nil:
			return nil, err
		}
		d.log.Warn("a standby QEMU did not load the snapshot; launching another", "vm", vm.id, "err", err)
	}
	vm, err := d.launchClone(ctx, ts, snap, sandboxID, lim)
	if err == nil {
		err = vm.load(ctx)
	}
	if err != nil {
		return nil, err
	}
	return vm, nil
}

// load loads the VM's snapshot state into its waiting QEMU (destroying the
// VM if that fails).
func (vm *VM) load(ctx context.Context) error {
	t0 := time.Now()
	if err := loadState(ctx, vm.qmp, vm.spec.incomingURI(), true); err != nil {
		vm.destroy()
		return fmt.Errorf("restore: %w", err)
	}
	vm.phases.Load = time.Since(t0)
	vm.d.log.Debug("restored", "vm", vm.id, "standby", vm.phases.Standby, "overlay", vm.phases.Overlay, "launch", vm.phases.Launch, "load", vm.phases.Load)
	return nil
}

// launchClone makes a VM for a clone of snap up to the snapshot's load:
// its directory, network, root disk's overlay, cgroup and QEMU, which
// waits (-incoming defer) to load snap's state.
func (d *Driver) launchClone(ctx context.Context, ts *tplState, snap *snapshot, sandboxID string, lim driver.Limits) (*VM, error) {
	id := d.newVMID()
	d.track(id, true)
	vm := &VM{d: d, id: id, template: ts.t.Name + "@" + ts.t.Version, sandboxID: sandboxID, limits: lim, created: time.Now(),
		state: "running", snapState: snap.state(), memShared: true, from: snap}
	vm.Agent, vm.CallErr = vm.client, vm.callErr
	vm.spec = vmSpec{ID: id, Dir: d.vmDir(id), Kernel: kernelPath(ts.t, snap.Meta.VCPUs), Initramfs: ts.t.Path(ts.t.Initramfs),
		Disk: filepath.Join(d.vmDir(id), "disk.qcow2"), MemMB: snap.Meta.MemMB, VCPUs: snap.Meta.VCPUs,
		MemFile: snap.mem(), Accel: d.accel, Incoming: true, Cmdline: snap.Meta.Cmdline, CPU: snap.Meta.CPU, TBSizeMB: d.cfg.TCGCacheMB, NIC: snap.Meta.NIC, AgentWire: snap.Meta.AgentWire,
		NoTHP: d.noTHP()}
	if err := os.MkdirAll(vm.spec.Dir, 0o755); err != nil {
		d.track(id, false)
		return nil, err
	}
	if err := vm.attachNetwork(ctx); err != nil {
		vm.destroy()
		return nil, err
	}
	t0 := time.Now()
	if err := d.blanks.overlay(ctx, snap.disk(), "qcow2", vm.spec.Disk); err != nil {
		vm.destroy()
		return nil, err
	}
	t1 := time.Now()
	if err := vm.launch(ctx, snap.state()); err != nil {
		vm.destroy()
		return nil, err
	}
	vm.phases = ClaimPhases{Overlay: t1.Sub(t0), Launch: time.Since(t1)}
	return vm, nil
}

// boot starts a fresh VM from the template's kernel and root file system.
func (d *Driver) boot(ctx context.Context, ts *tplState, sandboxID string, lim driver.Limits) (*VM, error) {
	id := d.newVMID()
	d.track(id, true)
	vm := &VM{d: d, id: id, template: ts.t.Name + "@" + ts.t.Version, sandboxID: sandboxID, limits: lim, created: time.Now(),
		state: "running", start: driver.StartBoot}
	vm.Agent, vm.CallErr = vm.client, vm.callErr
	vm.spec = vmSpec{ID: id, Dir: d.vmDir(id), Kernel: kernelPath(ts.t, lim.VCPUs), Initramfs: ts.t.Path(ts.t.Initramfs),
		Disk: filepath.Join(d.vmDir(id), "disk.qcow2"), MemMB: lim.MemMB, VCPUs: lim.VCPUs, Accel: d.accel, TBSizeMB: d.cfg.TCGCacheMB,
		Cmdline: d.cmdline("warren.pids=" + strconv.Itoa(lim.Pids)), CPU: d.cpu(), NIC: true}
	if err := os.MkdirAll(vm.spec.Dir, 0o755); err != nil {
		d.track(id, false)
		return nil, err
	}
	if err := vm.attachNetwork(ctx); err != nil {
		vm.destroy()
		return nil, err
	}
	if err := d.blanks.overlay(ctx, ts.t.Path(ts.t.Rootfs), "raw", vm.spec.Disk); err != nil {
		vm.destroy()
		return nil, err
	}
	if err := vm.launch(ctx, ""); err != nil {
		vm.destroy()
		return nil, err
	}
	bctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	c, err := waitAgent(bctx, vm.spec, vm.p.exited, bootAgentWait, d.log)
	if err != nil {
		vm.destroy()
		return nil, fmt.Errorf("boot: %w", err)
	}
	vm.agent = c
	return vm, nil
}

// cont runs a loaded or paused VM and makes sure its agent answers.
func (vm *VM) cont(ctx context.Context) error {
	if _, err := vm.qmp.Run(ctx, "cont", nil); err != nil {
		return err
	}
	if vm.agent != nil {
		return nil
	}
	actx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	c, err := waitAgent(actx, vm.spec, vm.p.exited, resumeAgentWait, vm.d.log)
	if err != nil {
		return err
	}
	vm.agent = c
	return nil
}

// ClaimPhases is where one claim's time went, for logs and the sandbox
// bench. A phase the claim did not go through is zero.
type ClaimPhases struct {
	// Restores (cold claims and pool refills) only: the root disk's
	// overlay, QEMU's start until its QMP socket answers, and loading the
	// snapshot's device state.
	Overlay, Launch, Load time.Duration
	// Resume is QMP cont until the guest agent answers; for a warm VM,
	// whose agent is connected already, the cont alone.
	Resume time.Duration
	// Bind is the claim call into the guest: clock, entropy, hostname,
	// environment, process limit and network.
	Bind time.Duration
	// Standby is set when a restore loaded the snapshot into a standby
	// QEMU (Config.StandbyQEMUs): its overlay and launch were made before
	// the claim, and are zero here.
	Standby bool
}

// ClaimPhases reports where this sandbox's claim spent its time. It waits
// for a pipelined bind's answer, which is part of the claim.
func (vm *VM) ClaimPhases() ClaimPhases {
	vm.awaitBind()
	vm.mu.Lock()
	defer vm.mu.Unlock()
	return vm.phases
}

// logAttrs is the non-zero phases as slog attributes.
func (p ClaimPhases) logAttrs() []any {
	var a []any
	for _, f := range []struct {
		k string
		v time.Duration
	}{{"overlay", p.Overlay}, {"launch", p.Launch}, {"load", p.Load}, {"resume", p.Resume}, {"bind", p.Bind}} {
		if f.v > 0 {
			a = append(a, f.k, f.v)
		}
	}
	if p.Standby {
		a = append(a, "standby_qemu", true)
	}
	return a
}

// bind gives a claimed VM its identity: the host's clock, fresh entropy,
// its hostname, its environment and its process limit.
//
// A VM whose agent orders claims (its first ping said so) is bound
// pipelined: bind returns once the claim is sent, with finish, which the
// caller runs (in its own goroutine) once the sandbox is registered;
// finish waits for the guest's answer and destroys the sandbox if the bind
// failed. finish is nil when bind waited for the answer itself. Either way
// bind times the phase (ClaimPhases.Bind).
func (vm *VM) bind(ctx context.Context, req driver.ClaimRequest) (finish func(), err error) {
	seed := make([]byte, 64)
	_, _ = rand.Read(seed)
	vm.mu.Lock()
	vm.sandboxID, vm.env, vm.state = req.ID, req.Env, "running"
	vm.mu.Unlock()
	creq := guest.ClaimRequest{Now: time.Now(), Entropy: seed, Hostname: driver.Hostname(req.ID), Env: req.Env, Pids: vm.limits.Pids}
	if vm.net != nil && vm.spec.NIC {
		nc := vm.net.GuestConfig(true)
		creq.Net = &nc
	}
	if vm.d.breakBind {
		creq.Net = &guest.NetConfig{} // no interface name: refused
	}
	tb := time.Now()
	if !vm.agent.Ordered() {
		_, err := vm.agent.Claim(ctx, creq)
		if err != nil {
			return nil, fmt.Errorf("claim: %w", err)
		}
		vm.mu.Lock()
		vm.phases.Bind = time.Since(tb)
		vm.mu.Unlock()
		return nil, nil
	}
	// Pipelined: the agent applies the claim before any call opened after
	// this one, and refuses them if it fails, so the sandbox is handed out
	// as soon as the claim is sent; its first command follows it to the
	// guest instead of waiting a round trip for the answer. The answer is
	// awaited by finish: a failed bind destroys the sandbox. The wait
	// outlives the claim's context (often a request's).
	bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), bindWait)
	wait, err := vm.agent.StartClaim(bctx, creq)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("claim: %w", err)
	}
	vm.bound = make(chan struct{})
	return func() {
		_, err := wait()
		cancel()
		if vm.d.slowBindAnswer > 0 {
			time.Sleep(vm.d.slowBindAnswer)
		}
		vm.mu.Lock()
		vm.phases.Bind = time.Since(tb)
		gone := vm.state == "destroyed"
		vm.bindErr = err
		vm.mu.Unlock()
		close(vm.bound)
		if err != nil && !gone && !vm.d.isClosed() {
			vm.d.log.Warn("sandbox's identity not bound in the guest; destroying it", "sandbox", req.ID, "err", err)
			vm.destroy()
		}
	}, nil
}

// bindWait bounds a pipelined bind's wait for the guest's answer.
const bindWait = time.Minute

// bindAnswerWait bounds how long a failed call waits for a pipelined bind's
// answer (callErr), which the guest sent before it refused the call.
const bindAnswerWait = 2 * time.Second

// awaitBind waits for a pipelined bind's answer, if one is under way.
func (vm *VM) awaitBind() {
	if b := vm.bound; b != nil {
		<-b
	}
}

// prewarm runs a claim's calls once in a restored clone before it is
// frozen in the pool. Under TCG a clone starts with an empty translation
// cache; this fills it for the paths a claim and a first command take, so
// the real claim does not pay for translating them.
func (vm *VM) prewarm(ctx context.Context) error {
	seed := make([]byte, 64)
	_, _ = rand.Read(seed)
	req := guest.ClaimRequest{Now: time.Now(), Entropy: seed, Hostname: "warm", Pids: DefaultPids}
	if vm.net != nil && vm.spec.NIC {
		// The pool VM keeps this network, and its claim sends it again.
		// The snapshot set it already, so an agent that remembers skips
		// it both times; an older one sets it here, and the claim then
		// runs that path translated.
		nc := vm.net.GuestConfig(true)
		req.Net = &nc
	}
	for i := 0; i < 2; i++ {
		if _, err := vm.agent.Claim(ctx, req); err != nil {
			return fmt.Errorf("prewarm: %w", err)
		}
		for _, argv := range [][]string{{"/bin/sh", "-c", "true"}, {"true"}} {
			if _, _, err := vm.agent.Output(ctx, argv...); err != nil {
				return fmt.Errorf("prewarm: %w", err)
			}
		}
	}
	return nil
}

// save writes meta.json, what a node restart re-adopts the VM from.
func (vm *VM) save() {
	vm.mu.Lock()
	m := vm.metaLocked()
	vm.mu.Unlock()
	vm.writeMeta(m)
}

// saveLocked is save with vm.mu held: a pause or resume records its
// outcome before another lifecycle change can begin.
func (vm *VM) saveLocked() error { return vm.writeMeta(vm.metaLocked()) }

func (vm *VM) metaLocked() vmMeta {
	m := vmMeta{ID: vm.id, SandboxID: vm.sandboxID, Template: vm.template, State: vm.state, Start: vm.start, Limits: vm.limits,
		Created: vm.created, Expires: vm.expires, Spec: vm.spec, Env: vm.env}
	if vm.net != nil {
		m.NetNS = vm.net.NSPath()
	}
	if vm.state == "paused" {
		m.PausedTo = filepath.Join(vm.spec.Dir, "paused.state")
		m.PausedSize = vm.pausedSize
	}
	return m
}

func (vm *VM) writeMeta(m vmMeta) error {
	b, _ := json.MarshalIndent(m, "", "  ")
	// 0600: it holds the sandbox's environment, where its secrets are.
	// A pause's "paused" is synced: it must outlive a power loss. Any
	// other state is not (a claim would wait about 1 ms for the sync): a
	// power loss ends a running VM's QEMU, and the start after it
	// destroys the sandbox whatever its record says.
	write := atomicfile.Replace
	if m.State == "paused" {
		write = atomicfile.WriteFile
	}
	err := write(filepath.Join(vm.spec.Dir, "meta.json"), b, 0o600)
	if err != nil && vm.d != nil {
		vm.d.log.Warn("meta.json not written: a restart will not find the sandbox as it is", "vm", vm.id, "sandbox", m.SandboxID, "state", m.State, "err", err)
	}
	return err
}

// armTTL destroys the sandbox at its deadline, servers or not.
func (vm *VM) armTTL() {
	vm.mu.Lock()
	defer vm.mu.Unlock()
	if vm.ttl != nil {
		vm.ttl.Stop()
	}
	vm.ttl = time.AfterFunc(time.Until(vm.expires), func() {
		vm.d.log.Info("sandbox expired; destroying", "sandbox", vm.sandboxID, "ttl_end", vm.expires)
		_ = vm.Destroy()
	})
}

// watchExit destroys a claimed sandbox whose QEMU ends on its own (the
// guest powered off or panicked, with -no-reboot; the OOM killer): it
// leaves the list, and calls to it get not_found, as a container whose
// agent died does. Else it stayed "running", every call failing as an
// internal error, until its TTL. Call it whenever vm.p starts (a claim,
// a resume, a re-adoption); a pause's own quit, which leaves vm.p nil
// and the state paused, is not such an end.
func (vm *VM) watchExit() {
	vm.mu.Lock()
	p := vm.p
	vm.mu.Unlock()
	if p == nil {
		return
	}
	go func() {
		<-p.exited
		vm.d.mu.Lock()
		closed := vm.d.closed // Close destroys it anyway; after Detach another run owns it
		vm.d.mu.Unlock()
		vm.mu.Lock()
		ours := vm.p == p && vm.state == "running"
		vm.mu.Unlock()
		if closed || !ours {
			return
		}
		vm.d.log.Warn("sandbox's QEMU exited on its own; destroying the sandbox", "sandbox", vm.ID(), "vm", vm.id,
			"qemu_log", tail(filepath.Join(vm.spec.Dir, "qemu.log")))
		vm.destroy()
	}()
}

// ID is the sandbox id.
func (vm *VM) ID() string { vm.mu.Lock(); defer vm.mu.Unlock(); return vm.sandboxID }

// Warm reports whether the sandbox came from a warm pool.
func (vm *VM) Warm() bool { return vm.start == driver.StartWarm }

// Info describes the sandbox.
func (vm *VM) Info() driver.Info {
	if in := vm.busy.Load(); in != nil {
		return *in
	}
	vm.mu.Lock()
	defer vm.mu.Unlock()
	return vm.infoLocked()
}

// infoLocked is Info with vm.mu held.
func (vm *VM) infoLocked() driver.Info {
	return driver.Info{ID: vm.sandboxID, Template: vm.template, State: vm.state, Start: vm.start, Limits: vm.limits,
		Created: vm.created, Expires: vm.expires, ClaimTime: vm.claimTime, Accelerator: vm.d.accel}
}

// callErr names a failed bind as the reason a call failed: the guest
// refuses calls behind it, and the sandbox is destroyed.
func (vm *VM) callErr(err error) error {
	// The guest answers a bind before it refuses the calls behind it, but
	// each answer comes on its own stream, so a refused call can be read
	// before the bind's answer: give that answer a moment, so that the error
	// names the bind's failure, not the guest's bare refusal.
	if b := vm.bound; b != nil {
		t := time.NewTimer(bindAnswerWait)
		select {
		case <-b:
		case <-t.C:
		}
		t.Stop()
	}
	vm.mu.Lock() // after a pause or destroy that cut the call off, if one did
	defer vm.mu.Unlock()
	if e := vm.unbound(); e != nil {
		return e
	}
	// A call the sandbox's end or pause cut off says so, not the channel's
	// "guest: EOF".
	switch vm.state {
	case "destroyed", "destroying":
		return driver.Errorf(driver.ErrNotFound, "sandbox %s was destroyed while the call ran", vm.sandboxID)
	case "paused":
		return driver.Errorf(driver.ErrUnavailable, "sandbox %s was paused while the call ran; resume it and call again", vm.sandboxID)
	}
	return err
}

// unbound is the error for calls on a sandbox whose bind failed (nil if it
// did not). vm.mu is held.
func (vm *VM) unbound() error {
	if vm.bindErr == nil {
		return nil
	}
	return driver.Errorf(driver.ErrUnavailable, "sandbox %s: its identity could not be bound in the guest, so it was destroyed: %v", vm.sandboxID, vm.bindErr)
}

// client returns the agent of a running sandbox.
func (vm *VM) client() (*guest.Client, error) {
	vm.mu.Lock()
	defer vm.mu.Unlock()
	if err := vm.unbound(); err != nil {
		return nil, err
	}
	switch {
	case vm.state == "destroyed", vm.state == "destroying":
		return nil, driver.Errorf(driver.ErrNotFound, "sandbox %s is destroyed", vm.sandboxID)
	case vm.state == "paused":
		return nil, driver.Errorf(driver.ErrInvalid, "sandbox %s is paused; resume it first", vm.sandboxID)
	case vm.agent == nil:
		return nil, driver.Errorf(driver.ErrUnavailable, "sandbox %s has no agent connection", vm.sandboxID)
	}
	return vm.agent, nil
}

// syncWait bounds the guest's disk flush before a pause.
const syncWait = time.Minute

// Pause flushes the guest's disks, saves memory and devices to
// paused.state in the VM's directory, and ends QEMU. The overlay stays.
// Once the VM is stopped, the pause runs to its end (or is undone, the
// guest running again) whether or not the caller still waits: a caller
// that gives up mid-save must not leave the guest frozen.
func (vm *VM) Pause(ctx context.Context) error {
	vm.awaitBind()
	vm.mu.Lock()
	defer vm.mu.Unlock()
	switch vm.state {
	case "paused":
		return nil
	case "destroyed", "destroying":
		return driver.Errorf(driver.ErrNotFound, "sandbox %s is destroyed", vm.sandboxID)
	}
	vm.setBusy("pausing")
	defer vm.setBusy("")
	// The guest may not answer (its agent taken over, or hung): the sync
	// is bounded, since vm.mu held here holds a destroy, the TTL's too.
	sctx, scancel := context.WithTimeout(ctx, syncWait)
	err := vm.agent.Sync(sctx)
	scancel()
	if err != nil {
		return fmt.Errorf("pause: sync: %w", err)
	}
	// From the stop on, the caller's deadline no longer applies: a stop
	// whose answer came after it would leave the guest stopped while the
	// sandbox says running.
	bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), lifecycleWait)
	defer cancel()
	if _, err := vm.qmp.Run(bctx, "stop", nil); err != nil {
		return fmt.Errorf("pause: %w", err)
	}
	state := filepath.Join(vm.spec.Dir, "paused.state")
	// Memory is migrated in full: a clone's mapping is private, and a
	// booted VM's is anonymous.
	// Owner-only: it holds the guest's memory, and so its env.
	if err := saveState(bctx, vm.qmp, state, 0o600, false); err != nil {
		vm.undoSave(bctx, state)
		return fmt.Errorf("pause: %w", err)
	}
	// The VM's directory's own entry, made at its launch (maybe moments
	// ago), so a power loss leaves the whole directory: the state (synced
	// by saveState), the overlay and, once written, meta.json.
	if err := durable(vm.spec.Dir); err != nil {
		vm.undoSave(bctx, state)
		return fmt.Errorf("pause: sync: %w", err)
	}
	fi, err := os.Stat(state)
	if err != nil {
		vm.undoSave(bctx, state)
		return fmt.Errorf("pause: %w", err)
	}
	vm.pausedSize = fi.Size()
	// Recorded before QEMU ends: a node that dies from here on finds the
	// sandbox paused, its state whole, and ends a QEMU still there
	// (adopt). Recorded after QEMU's end, as it was, a death between the
	// two left a record saying running with no QEMU, and the next start
	// destroyed the sandbox.
	vm.state = "paused"
	if err := vm.saveLocked(); err != nil {
		// Not recorded, the pause would not outlive a restart: the
		// record says running, with no QEMU, and the start after a
		// crash would destroy the sandbox. The guest runs on instead.
		vm.state = "running"
		vm.undoSave(bctx, state)
		return fmt.Errorf("pause: recording it: %w", err)
	}
	vm.agent.Close()
	vm.agent = nil
	_, _ = vm.qmp.Run(bctx, "quit", nil)
	vm.qmp.Close()
	vm.qmp = nil
	select {
	case <-vm.p.exited:
	case <-time.After(10 * time.Second):
		vm.p.kill()
	}
	vm.p = nil
	return nil
}

// lifecycleWait bounds the part of a pause or resume that runs to its end
// once begun, whether or not the caller waits. A variable for tests.
var lifecycleWait = 5 * time.Minute

// undoWait bounds undoing a pause's failed save.
const undoWait = time.Minute

// undoSave cancels a pause's save that failed, removes what it wrote, and
// lets the guest run again. vm.mu is held. It has its own time (undoWait):
// the pause's own may be what ended the save, and under it not one of
// the commands that let the guest run again was sent.
func (vm *VM) undoSave(ctx context.Context, state string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), undoWait)
	defer cancel()
	_, _ = vm.qmp.Run(ctx, "migrate_cancel", nil)
	_ = waitMigrationEnd(ctx, vm.qmp, "active")
	_ = os.Remove(state)
	if _, err := vm.qmp.Run(ctx, "cont", nil); err != nil {
		vm.d.log.Warn("pause failed and the guest did not run again", "sandbox", vm.sandboxID, "err", err)
	}
}

// setBusy shows a pause or resume under way in Info, which does not wait
// for vm.mu meanwhile (a save or load takes seconds). "" ends it. vm.mu is
// held.
func (vm *VM) setBusy(state string) {
	if state == "" {
		vm.busy.Store(nil)
		return
	}
	in := vm.infoLocked()
	in.State = state
	vm.busy.Store(&in)
}

// freshSession hangs up on the guest agent, now that the guest runs, and
// connects again once the guest has ended its session.
//
// A paused VM was frozen with the session of the host that paused it, often
// with that session's last stream half-closed (the host's close had not
// reached the guest). Resumed, the guest can take the new host's session as
// more of the old one, since it may never see the old host go; when the new
// session's stream ids reach the stale one, yamux refuses the reused id,
// ends the session, and the call waits out the stream close timeout
// (TestPauseLeavesNoStaleSession). A hang-up while the guest runs ends the
// stale session. Waiting hangUpQuiet before it lets the guest's last
// writes (the close of the call that found it answering) leave first;
// waitAgent copes with a write that meets the hang-up anyway
// (docs/sandboxes.md).
func (vm *VM) freshSession(ctx context.Context) error {
	time.Sleep(hangUpQuiet)
	vm.agent.Close()
	vm.agent = nil
	time.Sleep(hangUpGrace)
	rctx, cancel := context.WithTimeout(ctx, adoptTimeout)
	defer cancel()
	c, err := waitAgent(rctx, vm.spec, vm.p.exited, reconnectAgentWait, vm.d.log)
	if err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	vm.agent = c
	return nil
}

// hangUpQuiet is how long a host waits after a call before it hangs up on
// purpose, so the guest's close of that call is not in flight.
const hangUpQuiet = 50 * time.Millisecond

// Resume starts QEMU again from paused.state, on this node. Until the
// guest runs again, a failure (or the caller giving up) leaves the sandbox
// paused, with no QEMU, to be resumed again. Once it runs, it may write to
// its disk, so paused.state no longer matches the disk: the resume then
// runs to its end whether or not the caller waits, and if the guest does
// not answer, the sandbox is destroyed.
func (vm *VM) Resume(ctx context.Context) error {
	broken, err := vm.resume(ctx)
	if broken {
		vm.d.log.Warn("resumed sandbox did not answer; destroying it", "sandbox", vm.ID(), "err", err)
		vm.destroy()
		return driver.Errorf(driver.ErrUnavailable, "resume: the guest ran again but did not answer, so the sandbox was destroyed: %v", err)
	}
	return err
}

// resume is Resume under vm.mu; broken reports a guest that ran again
// but did not answer.
func (vm *VM) resume(ctx context.Context) (broken bool, err error) {
	vm.mu.Lock()
	defer vm.mu.Unlock()
	switch vm.state {
	case "running":
		return false, nil
	case "destroyed", "destroying":
		return false, driver.Errorf(driver.ErrNotFound, "sandbox %s is destroyed", vm.sandboxID)
	}
	vm.setBusy("resuming")
	defer vm.setBusy("")
	state := filepath.Join(vm.spec.Dir, "paused.state")
	vm.spec.Incoming = true
	err = vm.launch(ctx, state)
	if err == nil {
		err = loadState(ctx, vm.qmp, vm.spec.incomingURI(), false)
	}
	if err != nil {
		vm.endQEMU()
		return false, fmt.Errorf("resume: %w", err)
	}
	bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), lifecycleWait)
	defer cancel()
	// QEMU holds the state now. Gone before the guest runs, it cannot be
	// resumed again over a disk the guest has written to since: a node
	// that dies before this resume ends destroys the sandbox on its next
	// start ("paused, but its state file is gone").
	if err := os.Remove(state); err != nil {
		vm.endQEMU()
		return false, fmt.Errorf("resume: %w", err)
	}
	// On disk too: a removal a power loss undid would have the next start
	// resume this old memory over the disk the guest is about to write.
	if err := atomicfile.SyncDir(vm.spec.Dir); err != nil {
		vm.endQEMU()
		return false, fmt.Errorf("resume: sync: %w", err)
	}
	ranAndFailed := func(err error) (bool, error) {
		// Under vm.mu, so no other call finds the sandbox paused (and
		// starts a second QEMU) before Resume destroys it.
		vm.endQEMU()
		vm.state = "destroying"
		return true, err
	}
	if err := vm.cont(bctx); err != nil {
		return ranAndFailed(fmt.Errorf("resume: %w", err))
	}
	if err := vm.freshSession(bctx); err != nil {
		return ranAndFailed(fmt.Errorf("resume: %w", err))
	}
	// The clock stood still while the VM was on disk.
	if _, err := vm.agent.Claim(bctx, guest.ClaimRequest{Now: time.Now(), Hostname: driver.Hostname(vm.sandboxID), Env: vm.env}); err != nil {
		return ranAndFailed(fmt.Errorf("resume: set clock: %w", err))
	}
	vm.state = "running"
	vm.saveLocked()
	go vm.watchExit() // takes vm.mu, held here
	return false, nil
}

// endQEMU ends a resume's QEMU that did not get as far as running the
// guest, so the sandbox is paused with no process, as before. vm.mu is
// held.
func (vm *VM) endQEMU() {
	if vm.agent != nil {
		vm.agent.Close()
		vm.agent = nil
	}
	if vm.qmp != nil {
		vm.qmp.Close()
		vm.qmp = nil
	}
	if vm.p != nil {
		vm.p.kill()
		vm.p = nil
	}
}

// Destroy stops the VM and removes its process, files and cgroup. One
// that finds a destroy under way returns once that one has finished.
func (vm *VM) Destroy() error {
	vm.destroy()
	return nil
}

func (vm *VM) destroy() {
	vm.mu.Lock()
	if vm.gone == nil {
		vm.gone = make(chan struct{})
	}
	gone := vm.gone
	if vm.state == "destroyed" {
		vm.mu.Unlock()
		<-gone // under way: wait for it
		return
	}
	vm.state = "destroyed"
	defer close(gone)
	if vm.ttl != nil {
		vm.ttl.Stop()
	}
	if vm.agent != nil {
		vm.agent.Close()
	}
	if vm.qmp != nil {
		vm.qmp.Close()
	}
	p := vm.p
	vm.mu.Unlock()
	if p != nil {
		p.kill()
	} else {
		// A paused sandbox's: a QEMU of a pause or resume a previous run
		// did not finish, which its pid file may not name (qemusNamed).
		for _, pid := range qemusNamed(vm.id) {
			adopt(pid).kill()
		}
	}
	if vm.d.cg != nil {
		if err := vm.d.cg.remove(vm.id); err != nil {
			vm.d.log.Warn("cgroup not removed", "vm", vm.id, "err", err)
		}
	}
	if vm.net != nil { // after QEMU, whose tap pins the namespace
		if err := vm.net.Close(); err != nil {
			vm.d.log.Warn("network not removed", "vm", vm.id, "err", err)
		}
	}
	_ = os.RemoveAll(vm.spec.Dir)
	d := vm.d
	d.mu.Lock()
	if cur, ok := d.live[vm.sandboxID]; ok && cur == vm {
		delete(d.live, vm.sandboxID)
	}
	delete(d.known, vm.id)
	d.mu.Unlock()
}

func readPid(dir string) int {
	b, err := os.ReadFile(filepath.Join(dir, "pid"))
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(string(bytes.TrimSpace(b)))
	return pid
}
