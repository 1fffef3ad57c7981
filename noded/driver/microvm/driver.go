package microvm

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/warrenhq/warren/guest"
	"github.com/warrenhq/warren/noded/driver"
)

// Config is the driver's configuration.
type Config struct {
	ImageDir string // template store (DefaultImageDir if empty)
	StateDir string // this node's VMs and snapshots (required)
	QEMU     string // "qemu-system-x86_64" if empty
	Accel    string // "auto" (probe KVM once), "kvm" or "tcg"
	// DefaultTemplate is used when a claim names none ("default").
	DefaultTemplate string
	// SnapshotMemMB is the memory of snapshots and of sandboxes restored
	// from them (256). A claim asking for other memory or vCPUs boots cold.
	SnapshotMemMB int
	// DefaultTTL applies when a claim gives none (1h); MaxTTL bounds it (24h).
	DefaultTTL, MaxTTL time.Duration
	// TCGCacheMB is TCG's translation cache per VM (DefaultTCGCacheMB).
	TCGCacheMB int
	// TCGHugePages keeps transparent huge pages for clones' QEMUs under
	// TCG. Off by default: QEMU asks for them on its translation cache,
	// which then is resident in 2 MiB steps, about 2.8 MiB more per idle
	// clone (see noTHP).
	TCGHugePages bool
	// TCGASLR keeps address-space layout randomization inside guests
	// under TCG. Off by default (the guest's command line gets
	// norandmaps): QEMU 7.2 keys translated code by the guest's virtual
	// address, so with randomization every new process translates the
	// dynamic loader and libc afresh: /bin/true took about 37 ms in a
	// guest here, 12.5 ms without. The sandbox's boundary is the VM, not
	// ASLR between the processes inside it.
	TCGASLR bool
	// TCGGuestLSM keeps the guest kernel's default security modules
	// (Debian's: AppArmor and TOMOYO among them) and its pressure stall
	// accounting under TCG. Off by default: guests boot with
	// guestLSMs and psi=0. Their hooks run on every exec, open and context
	// switch and, under TCG, cost translation in every fresh clone and
	// emulated instructions in every command: a restore translated about
	// 3% fewer blocks without them and /bin/true ran about a fifth faster
	// back to back. The default template loads no policy for them (a
	// template that installs AppArmor profiles needs this); the sandbox's
	// boundary is the VM.
	TCGGuestLSM bool
	// TCGPeriodicTick keeps guests under TCG on their kernel's periodic
	// 250 Hz tick. By default, where the host's TSC is reliable (constant
	// and nonstop), guests stop their tick while idle: they get QEMU's
	// default CPU model with ARAT (Driver.tcgCPU) and tsc=reliable, so their
	// kernel keeps the TSC as its clock source and switches to one-shot
	// timers. An idle guest then wakes about 25 times a second instead of
	// 250, and its QEMU uses a third to a fifth of the CPU.
	TCGPeriodicTick bool
	// TCGNoRDRAND gives guests under TCG QEMU's default CPU model without
	// RDRAND. By default they have it (QEMU's TCG serves it from the host's
	// getrandom), and a restored clone reaches its first command about a
	// fifth sooner with it: paired runs of bench/sandbox, 12 restores
	// each, medians 269, 277 and 242 ms against 372, 323 and 357 ms; the
	// claim call's part 31-33 against 48-65 ms. Steady commands run as fast
	// either way (bench/README.md, twentieth session).
	TCGNoRDRAND bool
	// StandbyQEMUs is how many QEMU processes per template the driver
	// keeps launched ahead, each with its root disk's overlay, cgroup and
	// network ready and waiting (-incoming defer) to load the template's
	// snapshot. A cold claim (no warm VM ready) takes one and only loads
	// the snapshot into it, instead of paying for QEMU's start (about 45
	// ms here) on its path: as Firecracker's snapshot load is a call into
	// a VMM process that runs already. A standby runs no guest code, so
	// it costs a QEMU process's memory and no CPU. 0 means
	// DefaultStandbyQEMUs; a negative value keeps none.
	StandbyQEMUs int
	// Networks, if set, gives every VM (pool members included) a network
	// of the node's egress policy behind its NIC; without it the NIC has
	// no backend and the guest reaches nothing.
	Networks driver.Networks
	// CgroupRoot is the cgroup mount ("/sys/fs/cgroup"); "none" runs QEMU
	// without cgroups (tests without root only).
	CgroupRoot string
	// ReapInterval is how often orphaned QEMUs, VM directories and cgroups
	// are looked for (30s).
	ReapInterval time.Duration
	Logger       *slog.Logger
}

// Driver is the microvm driver.
type Driver struct {
	cfg      Config
	log      *slog.Logger
	scope    string // this driver's mark in VM ids: the reaper touches only its own
	qver     string
	hostTSC  bool // the host's TSC is constant and nonstop (see TCGPeriodicTick)
	accel    string
	accelWhy string
	cg       *cgroups
	blanks   blanks
	// failSnapshot, if set, fails a snapshot attempt before it starts
	// when it returns an error (tests).
	failSnapshot func() error
	// breakBind, if set, spoils a claim's request so that the guest
	// refuses it (tests).
	breakBind bool
	// slowBindAnswer, if set, holds a pipelined bind's answer that long
	// before the host takes it in (tests: the race between it and a
	// refused call's answer).
	slowBindAnswer time.Duration

	mu        sync.Mutex
	templates map[string]*tplState
	live      map[string]*VM  // by sandbox id
	known     map[string]bool // VM ids with a process or directory being made
	// making is the snapshot directories being made now (their .tmp-
	// names): pruneSnapshots removes any other, left by a node stopped
	// while it made one.
	making   map[string]bool
	closed   bool
	stop     chan struct{}
	wg       sync.WaitGroup
	standbys int // QEMUs to keep on standby per template (Config.StandbyQEMUs)
}

type tplState struct {
	t        *guest.Template
	snap     *snapshot
	snapWhy  string // why there is no snapshot
	snapping bool
	// snapNext is when the next snapshot attempt may start after a
	// failure (the backoff, see snapshotRetry): claims before it boot
	// cold without starting one.
	snapNext time.Time
	// snapFails counts snapshot attempts that failed in a row; while the
	// pool has a target, each failure schedules another attempt.
	snapFails int
	target    int
	pool      []*VM // paused, restored, ready to claim
	filling   int
	// standby are QEMUs launched for the snapshot, waiting to load it
	// (Config.StandbyQEMUs); standbyFilling counts those being launched.
	standby        []*VM
	standbyFilling int
	// refillFails counts pool refills that failed in a row (reset when a
	// member joins the pool); refillRetrying is set while a retry of a
	// failed refill waits, so that refills started meanwhile by claims or
	// targets that fail too do not start more retries.
	refillFails    int
	refillRetrying bool
}

// CheckAccel refuses an accelerator that is not Config.Accel's: auto, kvm
// or tcg.
func CheckAccel(a string) error {
	switch a {
	case "auto", "kvm", "tcg":
		return nil
	}
	return fmt.Errorf("%q is not auto, kvm or tcg", a)
}

// DefaultStandbyQEMUs is Config.StandbyQEMUs's default.
const DefaultStandbyQEMUs = 1

// New checks QEMU and the template store, chooses the accelerator (probing
// KVM once), re-adopts or destroys the VMs a previous run left, and starts
// the reaper.
func New(cfg Config) (*Driver, error) {
	if cfg.StateDir == "" {
		return nil, errors.New("microvm: state dir: required")
	}
	if cfg.ImageDir == "" {
		cfg.ImageDir = DefaultImageDir
	}
	if cfg.QEMU == "" {
		cfg.QEMU = "qemu-system-x86_64"
	}
	if cfg.Accel == "" {
		cfg.Accel = "auto"
	}
	if cfg.DefaultTemplate == "" {
		cfg.DefaultTemplate = "default"
	}
	if cfg.SnapshotMemMB == 0 {
		cfg.SnapshotMemMB = 256
	}
	if cfg.DefaultTTL == 0 {
		cfg.DefaultTTL = driver.DefaultTTL
	}
	if cfg.MaxTTL == 0 {
		cfg.MaxTTL = driver.MaxTTL
	}
	switch {
	case cfg.StandbyQEMUs == 0:
		cfg.StandbyQEMUs = DefaultStandbyQEMUs
	case cfg.StandbyQEMUs < 0:
		cfg.StandbyQEMUs = 0
	}
	if cfg.ReapInterval == 0 {
		cfg.ReapInterval = 30 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if err := CheckAccel(cfg.Accel); err != nil {
		return nil, fmt.Errorf("microvm: accel: %w", err)
	}
	qemu, err := exec.LookPath(cfg.QEMU)
	if err != nil {
		return nil, fmt.Errorf("microvm: %s: %w (apt-get install qemu-system-x86)", cfg.QEMU, err)
	}
	cfg.QEMU = qemu
	if _, err := exec.LookPath("qemu-img"); err != nil {
		return nil, fmt.Errorf("microvm: qemu-img: %w (apt-get install qemu-utils)", err)
	}
	t, err := guest.LoadTemplate(cfg.ImageDir, cfg.DefaultTemplate)
	if err != nil {
		return nil, fmt.Errorf("microvm: %w (run `make image`)", err)
	}
	// 0700: a sandbox's files hold its environment and its disk.
	if err := os.MkdirAll(filepath.Join(cfg.StateDir, "vms"), 0o700); err != nil {
		return nil, err
	}
	if err := os.Chmod(filepath.Join(cfg.StateDir, "vms"), 0o700); err != nil { // made by an older node
		return nil, err
	}
	abs, _ := filepath.Abs(cfg.StateDir)
	h := sha256.Sum256([]byte(abs))
	d := &Driver{cfg: cfg, log: cfg.Logger, scope: hex.EncodeToString(h[:])[:8], templates: map[string]*tplState{},
		live: map[string]*VM{}, known: map[string]bool{}, stop: make(chan struct{}), blanks: blanks{dir: filepath.Join(cfg.StateDir, "blanks")},
		standbys: cfg.StandbyQEMUs}
	if d.qver, err = qemuVersion(qemu); err != nil {
		return nil, err
	}
	d.hostTSC = hostTSCReliable()
	if cfg.CgroupRoot != "none" {
		if d.cg, err = detectCgroups(cfg.CgroupRoot); err != nil {
			return nil, fmt.Errorf("microvm: %w", err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	d.accel, d.accelWhy = chooseAccel(ctx, cfg.Accel, qemu, d.qver, t, cfg.ImageDir, cfg.StateDir)
	cancel()
	d.log.Info("microvm driver", "accelerator", d.accel, "why", d.accelWhy, "qemu", d.qver, "template", t.Name+"@"+t.Version, "tickless_idle", d.tickless(), "cpu", d.cpu())
	d.templates[t.Name] = &tplState{t: t}
	d.adoptAll()
	d.wg.Add(1)
	go d.reapLoop()
	return d, nil
}

// noTHP reports whether clones' QEMUs run without transparent huge pages:
// under TCG, unless TCGHugePages. QEMU madvises its translation cache for
// huge pages, so every 2 MiB step of translated code becomes resident at
// once; with 4 KiB pages, 50 idle clones measured a median of 32.2 MiB
// PSS each against 35.0 MiB (bench/README.md). A clone's guest memory is
// a private file mapping, which gets no huge pages either way. Cold boots
// keep them: their guest memory is anonymous, and they boot 10-20%
// faster with it.
func (d *Driver) noTHP() bool { return d.accel == "tcg" && !d.cfg.TCGHugePages }

// guestLSMs is the guest kernel's security modules under TCG unless
// TCGGuestLSM: Landlock (which programs inside a sandbox may use to
// confine themselves), lockdown and Yama; capabilities are always on.
const guestLSMs = "landlock,lockdown,yama"

// cmdline is a guest's kernel command line on this driver: under TCG,
// unless TCGASLR, without address-space randomization (see TCGASLR),
// unless TCGGuestLSM, with fewer security modules and no pressure stall
// accounting (see TCGGuestLSM), and with tsc=reliable when guests run
// tickless (see TCGPeriodicTick).
func (d *Driver) cmdline(extra string) string {
	if d.accel == "tcg" && !d.cfg.TCGGuestLSM {
		extra = strings.TrimSpace("lsm=" + guestLSMs + " psi=0 " + extra)
	}
	if d.accel == "tcg" && !d.cfg.TCGASLR {
		extra = strings.TrimSpace("norandmaps " + extra)
	}
	if d.tickless() {
		extra = strings.TrimSpace("tsc=reliable " + extra)
	}
	return kernelCmdline(extra)
}

// tcgCPU is the guests' CPU model under TCG: QEMU's default, qemu64,
// plus RDRAND unless TCGNoRDRAND (see there), plus ARAT when they run
// tickless (the local APIC timer keeps running in deep idle states).
// Without ARAT the guest kernel will not use the APIC timer in one-shot
// mode unless there is a broadcast timer, which a microvm machine lacks,
// so it ticks periodically.
func (d *Driver) tcgCPU() string {
	m := "qemu64"
	if d.tickless() {
		m += ",+arat"
	}
	if !d.cfg.TCGNoRDRAND {
		m += ",+rdrand"
	}
	return m
}

// tickless reports whether guests stop their tick while idle: unless
// TCGPeriodicTick, under TCG on a host with a reliable TSC (the guest's TSC
// is the host's, read by QEMU). Under KVM the guest has the host's CPU
// model and its own clock.
func (d *Driver) tickless() bool { return d.accel == "tcg" && d.hostTSC && !d.cfg.TCGPeriodicTick }

// TicklessIdle reports whether this driver's guests stop their tick while
// idle (see Config.TCGPeriodicTick).
func (d *Driver) TicklessIdle() bool { return d.tickless() }

// CPUModel is the guests' -cpu under TCG ("" under KVM, where they have
// the host's).
func (d *Driver) CPUModel() string { return d.cpu() }

// cpu is the guests' -cpu under TCG ("" under KVM: the host's model).
func (d *Driver) cpu() string {
	if d.accel != "tcg" {
		return ""
	}
	return d.tcgCPU()
}

// hostTSCReliable reports whether the host's TSC runs at a constant rate
// through idle states (constant_tsc and nonstop_tsc in /proc/cpuinfo).
func hostTSCReliable() bool {
	f := strings.Fields(cpuinfo("flags"))
	return slices.Contains(f, "constant_tsc") && slices.Contains(f, "nonstop_tsc")
}

// Name is "microvm".
func (d *Driver) Name() string { return "microvm" }

// Accelerator is "kvm" or "tcg".
func (d *Driver) Accelerator() string { return d.accel }

// AcceleratorReason says why the accelerator was chosen.
func (d *Driver) AcceleratorReason() string { return d.accelWhy }

// Templates lists the template names in the store.
func (d *Driver) Templates() []string { return guest.ListTemplates(d.cfg.ImageDir) }

func (d *Driver) newVMID() string { return d.scope + "-" + randID() }

// track marks a VM id as known to this driver (so the reaper spares it)
// or forgets it.
func (d *Driver) track(id string, on bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if on {
		d.known[id] = true
	} else {
		delete(d.known, id)
	}
}

// template returns the loaded state of a template, loading (and checking)
// it on first use.
func (d *Driver) template(name string) (*tplState, error) {
	if name == "" {
		name = d.cfg.DefaultTemplate
	}
	d.mu.Lock()
	ts, ok := d.templates[name]
	d.mu.Unlock()
	if ok {
		return ts, nil
	}
	t, err := guest.LoadTemplate(d.cfg.ImageDir, name)
	if err != nil {
		if errors.Is(err, guest.ErrNoTemplate) {
			return nil, driver.Errorf(driver.ErrNotFound, "template %q: not in %s (have: %v)", name, d.cfg.ImageDir, d.Templates())
		}
		return nil, driver.Errorf(driver.ErrInvalid, "%v", err)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if ts, ok := d.templates[name]; ok {
		return ts, nil
	}
	ts = &tplState{t: t}
	d.templates[name] = ts
	return ts, nil
}

// snapshotFor returns the template's snapshot, starting to make one in the
// background when there is none (callers boot cold meanwhile). After a
// failed attempt it starts none until the backoff is over (ts.snapNext):
// a claim would otherwise start another snapshot boot at once, each one
// back to back on a host that may be why the last one failed.
func (d *Driver) snapshotFor(ts *tplState) *snapshot {
	d.mu.Lock()
	if ts.snap != nil || d.closed || ts.snapping || time.Now().Before(ts.snapNext) {
		defer d.mu.Unlock()
		return ts.snap
	}
	d.mu.Unlock()
	// Read off the lock (files: heartbeats read the pools under it), then
	// decide under it again: another caller may have got there first.
	s, err := d.loadSnapshot(ts.t)
	d.mu.Lock()
	if ts.snap != nil || d.closed || ts.snapping || time.Now().Before(ts.snapNext) {
		defer d.mu.Unlock()
		return ts.snap
	}
	if err == nil {
		ts.snap = s
		d.mu.Unlock()
		return s
	}
	ts.snapWhy = err.Error()
	ts.snapping = true
	// Logged off the lock, once the maker is under way (it takes the
	// lock itself, after seconds).
	defer d.log.Info("no usable snapshot; booting cold until one is made", "template", ts.t.Name, "reason", err)
	defer d.mu.Unlock()
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		ctx, cancel := d.stopContext(5 * time.Minute)
		defer cancel()
		var s *snapshot
		var err error
		if d.failSnapshot != nil {
			err = d.failSnapshot()
		}
		if err == nil {
			s, err = d.makeSnapshot(ctx, ts.t)
		}
		d.mu.Lock()
		ts.snapping = false
		if err != nil {
			ts.snapWhy = "making the snapshot failed: " + err.Error()
			ts.snapFails++
			// Try again later (a failure under load, such as a boot
			// that timed out, may not repeat), backing off up to
			// snapshotRetryMax; no claim starts an attempt before.
			// A pool waits for the snapshot: its refill is the retry.
			retry := ts.target > 0 && !d.closed
			delay := min(snapshotRetry<<min(ts.snapFails-1, 8), snapshotRetryMax)
			ts.snapNext = time.Now().Add(delay)
			d.mu.Unlock()
			if retry {
				d.log.Warn("snapshot failed; trying again for the warm pool", "template", ts.t.Name, "err", err, "in", delay)
				d.goRefill(ts, delay)
			} else {
				d.log.Warn("snapshot failed; claims boot cold until the next attempt", "template", ts.t.Name, "err", err, "in", delay)
			}
			return
		}
		ts.snapFails, ts.snapNext = 0, time.Time{}
		ts.snap = s
		d.mu.Unlock()
		d.log.Info("snapshot ready", "template", ts.t.Name, "took", time.Duration(s.Meta.TookMS)*time.Millisecond)
		d.refill(ts)
	}()
	return nil
}

// EnsureSnapshot makes the template's snapshot now if it has none, and
// returns when it exists (benchmarks and tests use it to start warm). After
// a failed attempt, until its backoff is over, it returns that failure.
func (d *Driver) EnsureSnapshot(ctx context.Context, template string) error {
	ts, err := d.template(template)
	if err != nil {
		return err
	}
	for {
		if d.snapshotFor(ts) != nil {
			return nil
		}
		d.mu.Lock()
		snapping, why := ts.snapping, ts.snapWhy
		d.mu.Unlock()
		if !snapping {
			return errors.New(why)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// isClosed reports whether Close or Detach was called.
func (d *Driver) isClosed() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.closed
}

func (d *Driver) stopContext(timeout time.Duration) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	go func() {
		select {
		case <-d.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

// checkLimits fills defaults and rejects what this host cannot give.
func (d *Driver) checkLimits(ts *tplState, l driver.Limits) (driver.Limits, error) {
	var errs []error
	if l.VCPUs == 0 {
		l.VCPUs = 1
	}
	if l.MemMB == 0 {
		l.MemMB = d.cfg.SnapshotMemMB
	}
	if l.Pids == 0 {
		l.Pids = DefaultPids
	}
	diskMB := int(ts.t.DiskBytes >> 20)
	if l.VCPUs < 1 || l.VCPUs > runtime.NumCPU() {
		errs = append(errs, fmt.Errorf("limits.vcpus %d: must be between 1 and %d (this node's CPUs)", l.VCPUs, runtime.NumCPU()))
	}
	if l.MemMB < 128 || l.MemMB > 64<<10 {
		errs = append(errs, fmt.Errorf("limits.memory_mb %d: must be between 128 and 65536", l.MemMB))
	} else if err := driver.CheckMemoryMB(l.MemMB); err != nil {
		errs = append(errs, err)
	}
	if l.DiskMB != 0 && l.DiskMB != diskMB {
		errs = append(errs, fmt.Errorf("limits.disk_mb %d: template %s's disk is %d MiB and this driver cannot change it (build a template with --free-mb)", l.DiskMB, ts.t.Name, diskMB))
	}
	l.DiskMB = diskMB
	if l.Pids < 16 || l.Pids > 1<<20 {
		errs = append(errs, fmt.Errorf("limits.pids %d: must be between 16 and 1048576", l.Pids))
	}
	if err := errors.Join(errs...); err != nil {
		return l, driver.Errorf(driver.ErrInvalid, "%v", err)
	}
	return l, nil
}

// Claim returns a running sandbox: warm from the pool when one is ready,
// restored from the template's snapshot otherwise, or booted cold when
// there is no snapshot or the limits differ from it.
func (d *Driver) Claim(ctx context.Context, req driver.ClaimRequest) (driver.Sandbox, error) {
	t0 := time.Now()
	if req.ID == "" {
		return nil, driver.Errorf(driver.ErrInvalid, "id: required")
	}
	// The guest would refuse a bad environment too, but a claim does
	// not wait for its answer (see VM.bind).
	if err := guest.CheckExec([]string{"env"}, req.Env); err != nil {
		return nil, driver.Errorf(driver.ErrInvalid, "%v", err)
	}
	ts, err := d.template(req.Template)
	if err != nil {
		return nil, err
	}
	lim, err := d.checkLimits(ts, req.Limits)
	if err != nil {
		return nil, err
	}
	ttl := req.TTL
	if ttl == 0 {
		ttl = d.cfg.DefaultTTL
	}
	if ttl < 0 || ttl > d.cfg.MaxTTL {
		return nil, driver.Errorf(driver.ErrInvalid, "ttl_seconds %d: must be between 1 and %d (%v)", int64(ttl/time.Second), int64(d.cfg.MaxTTL/time.Second), d.cfg.MaxTTL)
	}
	// A caller that gave up already would leave the sandbox to its TTL,
	// and a warm pool member would be spent on it.
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("claim %s: %w", req.ID, context.Cause(ctx))
	}
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil, driver.Errorf(driver.ErrUnavailable, "driver closed")
	}
	if _, dup := d.live[req.ID]; dup {
		d.mu.Unlock()
		return nil, driver.Errorf(driver.ErrExists, "sandbox %q exists", req.ID)
	}
	d.live[req.ID] = nil // reserved
	// Close waits for the claim, and ends it early: else a claim under
	// way when the node stops could leave a QEMU behind after Close.
	d.wg.Add(1)
	d.mu.Unlock()
	defer d.wg.Done()
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go func() {
		select {
		case <-d.stop:
			cancel(driver.Errorf(driver.ErrUnavailable, "driver closed"))
		case <-ctx.Done():
		}
	}()
	vm, err := d.claim(ctx, ts, req, lim)
	if err != nil {
		// It may have taken a pool member or a standby and destroyed it
		// (one that did not resume, a restore that failed): the pool is
		// refilled as after a claim that succeeded, else it stayed short
		// until the next one.
		d.goRefill(ts, refillDelay)
		d.mu.Lock()
		delete(d.live, req.ID)
		d.mu.Unlock()
		if cause := context.Cause(ctx); cause != nil && errors.Is(err, ctx.Err()) {
			return nil, fmt.Errorf("claim %s: %w", req.ID, cause)
		}
		return nil, err
	}
	vm.expires = time.Now().Add(ttl)
	finish, err := vm.bind(ctx, req)
	if finish != nil {
		defer func() { go finish() }() // once the sandbox is registered (or destroyed)
	}
	if err != nil {
		vm.destroy()
		d.mu.Lock()
		delete(d.live, req.ID)
		d.mu.Unlock()
		d.goRefill(ts, refillDelay) // as above
		return nil, err
	}
	vm.mu.Lock()
	vm.claimTime = time.Since(t0)
	phases := vm.phases
	vm.mu.Unlock()
	d.mu.Lock()
	if d.closed { // closed while this claim was under way: Close did not see it
		delete(d.live, req.ID)
		d.mu.Unlock()
		vm.destroy()
		return nil, driver.Errorf(driver.ErrUnavailable, "driver closed")
	}
	d.live[req.ID] = vm
	d.mu.Unlock()
	vm.armTTL()
	vm.watchExit()
	vm.save()
	d.log.Info("sandbox claimed", append([]any{"sandbox", req.ID, "start", vm.start, "took", vm.claimTime, "template", ts.t.Name}, phases.logAttrs()...)...)
	// The refill starts a moment later, so the new sandbox's first
	// commands do not share the CPU with a restore.
	d.goRefill(ts, refillDelay)
	return vm, nil
}

const refillDelay = 250 * time.Millisecond

// After a failed snapshot, no attempt starts before snapshotRetry has
// passed, doubling with each failure in a row up to snapshotRetryMax; a
// template with a pool target then tries again. (Variables for tests.)
var (
	snapshotRetry    = 15 * time.Second
	snapshotRetryMax = 5 * time.Minute
)

// After a failed refill (a restore whose QEMU did not start under load, a
// disk full for a moment), a pool short of its target tries again after
// refillRetry, doubling up to refillRetryMax. (Variables for tests.)
var (
	refillRetry    = 2 * time.Second
	refillRetryMax = time.Minute
)

func (d *Driver) claim(ctx context.Context, ts *tplState, req driver.ClaimRequest, lim driver.Limits) (*VM, error) {
	snapShape := lim.VCPUs == 1 && lim.MemMB == d.cfg.SnapshotMemMB && req.Force != driver.StartBoot
	if snapShape {
		d.mu.Lock()
		var vm *VM
		if n := len(ts.pool); n > 0 && req.Force == "" {
			vm = ts.pool[n-1]
			ts.pool = ts.pool[:n-1]
		}
		d.mu.Unlock()
		if vm != nil {
			if d.cg != nil {
				_ = d.cg.setLow(vm.id, false)
			}
			tc := time.Now()
			if err := vm.cont(ctx); err == nil {
				vm.mu.Lock()
				vm.sandboxID, vm.start, vm.limits, vm.created = req.ID, driver.StartWarm, lim, time.Now()
				vm.phases = ClaimPhases{Resume: time.Since(tc)}
				vm.mu.Unlock()
				return vm, nil
			} else {
				vm.destroy()
				if ctx.Err() != nil {
					return nil, err
				}
				d.log.Warn("warm sandbox did not resume; restoring another", "err", err)
			}
		}
		if snap := d.snapshotFor(ts); snap != nil {
			vm, err := d.restore(ctx, ts, snap, req.ID, lim, true)
			if err == nil {
				tc := time.Now()
				if err = vm.cont(ctx); err == nil {
					vm.start = driver.StartRestore
					vm.phases.Resume = time.Since(tc)
					return vm, nil
				}
				vm.destroy()
			}
			if ctx.Err() != nil {
				return nil, err
			}
			d.log.Warn("restore failed; booting cold", "template", ts.t.Name, "err", err)
		}
	} else {
		d.log.Info("booting cold: limits differ from the snapshot's", "sandbox", req.ID, "vcpus", lim.VCPUs, "memory_mb", lim.MemMB)
	}
	return d.boot(ctx, ts, req.ID, lim)
}

// SetPoolTarget sets how many warm sandboxes of template to keep. The pool
// fills in the background. A negative target is 0 (a node's pools.json
// could hold one, and the pool's trim indexed past its start).
func (d *Driver) SetPoolTarget(template string, n int) {
	ts, err := d.template(template)
	if err != nil {
		d.log.Warn("pool target for an unknown template", "template", template, "err", err)
		return
	}
	if n < 0 {
		d.log.Warn("negative pool target taken as 0", "template", template, "target", n)
		n = 0
	}
	d.mu.Lock()
	ts.target = n
	var drop []*VM
	for len(ts.pool) > n {
		drop = append(drop, ts.pool[len(ts.pool)-1])
		ts.pool = ts.pool[:len(ts.pool)-1]
	}
	d.mu.Unlock()
	for _, vm := range drop {
		vm.destroy()
	}
	d.goRefill(ts, 0)
}

// goRefill refills ts's pool in the background after delay (Close ends the
// wait). Close waits for the refill (a refill under way destroys its VM
// when the driver closes: a QEMU still starting when the process exits
// would outlive it).
func (d *Driver) goRefill(ts *tplState, delay time.Duration) {
	d.goAfter(delay, func() { d.refill(ts) })
}

// goRetryRefill is goRefill for the retry of a failed refill: it clears
// ts.refillRetrying when the wait is over.
func (d *Driver) goRetryRefill(ts *tplState, delay time.Duration) {
	d.goAfter(delay, func() {
		d.mu.Lock()
		ts.refillRetrying = false
		d.mu.Unlock()
		d.refill(ts)
	})
}

// goAfter calls fn from a goroutine after delay, unless the driver closes
// first; Close waits for fn.
func (d *Driver) goAfter(delay time.Duration, fn func()) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return
	}
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		t := time.NewTimer(delay)
		defer t.Stop()
		select {
		case <-t.C:
		case <-d.stop: // Close does not wait out a long delay
			return
		}
		fn()
	}()
}

// Pools reports every template's pool.
func (d *Driver) Pools() []driver.PoolStatus {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []driver.PoolStatus
	for name, ts := range d.templates {
		st := driver.PoolStatus{Template: name, Target: ts.target, Ready: len(ts.pool), Filling: ts.filling, Standby: len(ts.standby)}
		switch {
		case ts.snap != nil:
			st.Snapshot = "ready"
		case ts.snapping:
			st.Snapshot = "making"
		default:
			st.Snapshot = ts.snapWhy
		}
		out = append(out, st)
	}
	return out
}

// refill launches the template's standby QEMUs, then restores clones until
// the pool has its target.
func (d *Driver) refill(ts *tplState) {
	d.refillStandby(ts)
	d.refillPool(ts)
}

// poolLimits are the limits of a VM made ahead of its claim (a warm-pool
// member or a standby QEMU): the snapshot's shape.
func (d *Driver) poolLimits(ts *tplState) driver.Limits {
	return driver.Limits{VCPUs: 1, MemMB: d.cfg.SnapshotMemMB, Pids: DefaultPids, DiskMB: int(ts.t.DiskBytes >> 20)}
}

// DefaultPids is a sandbox's process limit when its claim gives none. The
// template's snapshot sets it in the guest, so a clone's claim with it
// leaves the limit as it is.
const DefaultPids = 4096

// refillStandby launches standby QEMUs for the template's snapshot until
// it has Config.StandbyQEMUs of them, one at a time. It does not start a
// snapshot: without one there is nothing to wait for.
func (d *Driver) refillStandby(ts *tplState) {
	for {
		d.mu.Lock()
		snap := ts.snap
		if d.closed || snap == nil || ts.standbyFilling > 0 || len(ts.standby) >= d.standbys {
			d.mu.Unlock()
			return
		}
		ts.standbyFilling++
		d.mu.Unlock()
		ctx, cancel := d.stopContext(time.Minute)
		vm, err := d.launchClone(ctx, ts, snap, "", d.poolLimits(ts))
		cancel()
		if err == nil {
			vm.state = "standby"
			vm.save() // so that the state dir tells it apart; never re-adopted
		}
		d.mu.Lock()
		ts.standbyFilling--
		if err != nil || d.closed || ts.snap != snap || len(ts.standby) >= d.standbys {
			closed := d.closed
			d.mu.Unlock()
			if vm != nil {
				vm.destroy()
			}
			if err != nil && !closed {
				d.log.Warn("standby QEMU not launched", "template", ts.t.Name, "err", err)
			}
			return
		}
		ts.standby = append(ts.standby, vm)
		d.mu.Unlock()
	}
}

// takeStandby returns one of the template's standby QEMUs launched for
// snap, nil if there is none. Standbys of another snapshot, or whose QEMU
// has exited, are destroyed.
func (d *Driver) takeStandby(ts *tplState, snap *snapshot) *VM {
	d.mu.Lock()
	defer d.mu.Unlock()
	for len(ts.standby) > 0 {
		vm := ts.standby[len(ts.standby)-1]
		ts.standby = ts.standby[:len(ts.standby)-1]
		exited := false
		select {
		case <-vm.p.exited:
			exited = true
		default:
			if vm.from == snap {
				return vm
			}
		}
		// Off the claim's path and off the lock (the log's tail is a
		// file read); Close waits for it. (The list was emptied by Close
		// if the driver is closed.)
		d.wg.Add(1)
		go func() {
			defer d.wg.Done()
			if exited {
				d.log.Warn("standby QEMU had exited; destroying it", "vm", vm.id, "qemu_log", tail(filepath.Join(vm.spec.Dir, "qemu.log")))
			}
			vm.destroy()
		}()
	}
	return nil
}

// SetStandbyQEMUs sets how many standby QEMUs each template keeps (see
// Config.StandbyQEMUs; here 0 keeps none) and launches or destroys them
// to match in the background.
func (d *Driver) SetStandbyQEMUs(n int) {
	d.mu.Lock()
	d.standbys = max(n, 0)
	var drop []*VM
	var tss []*tplState
	for _, ts := range d.templates {
		for len(ts.standby) > d.standbys {
			drop = append(drop, ts.standby[len(ts.standby)-1])
			ts.standby = ts.standby[:len(ts.standby)-1]
		}
		tss = append(tss, ts)
	}
	d.mu.Unlock()
	for _, vm := range drop {
		vm.destroy()
	}
	for _, ts := range tss {
		d.goRefill(ts, 0)
	}
}

// refillPool restores clones until the pool has its target, one at a time per
// template (restores compete with claims for the CPU).
func (d *Driver) refillPool(ts *tplState) {
	for {
		d.mu.Lock()
		if d.closed || ts.filling > 0 || len(ts.pool) >= ts.target {
			d.mu.Unlock()
			return
		}
		ts.filling++
		d.mu.Unlock()
		snap := d.snapshotFor(ts)
		var vm *VM
		var err error
		if snap != nil {
			ctx, cancel := d.stopContext(time.Minute)
			// Not from a standby QEMU: those are for cold claims.
			vm, err = d.restore(ctx, ts, snap, "", d.poolLimits(ts), false)
			if err == nil {
				// Run it once so the agent is connected and answering,
				// then freeze it until a claim.
				if err = vm.cont(ctx); err == nil {
					err = vm.prewarm(ctx)
				}
				if err == nil {
					_, err = vm.qmp.Run(ctx, "stop", nil)
				}
				if err != nil {
					vm.destroy()
				}
			}
			cancel()
		}
		d.mu.Lock()
		ts.filling--
		if err == nil && vm != nil && len(ts.pool) >= ts.target {
			// The target dropped while this one was being made.
			d.mu.Unlock()
			vm.destroy()
			return
		}
		if snap == nil || err != nil || d.closed {
			closed := d.closed
			// A failed refill is tried again while the pool is short,
			// backing off up to refillRetryMax; one retry waits at a time.
			var delay time.Duration
			retry, pending := false, ts.refillRetrying
			if err != nil && !closed {
				ts.refillFails++
				delay = min(refillRetry<<min(ts.refillFails-1, 8), refillRetryMax)
				retry = !pending && len(ts.pool) < ts.target
				if retry {
					ts.refillRetrying = true
				}
			}
			// No snapshot, none being made: a failed one's backoff is
			// not over. Its failure scheduled a refill only if the pool
			// had a target then; one set since waits for the backoff's
			// end here, or the pool stayed empty until a claim came.
			backoff := snap == nil && err == nil && !closed && !ts.snapping && ts.snap == nil &&
				!pending && len(ts.pool) < ts.target && time.Now().Before(ts.snapNext)
			if backoff {
				ts.refillRetrying = true
				delay = time.Until(ts.snapNext)
			}
			d.mu.Unlock()
			switch {
			case backoff:
				d.log.Info("warm pool waits for the snapshot's next attempt", "template", ts.t.Name, "in", delay.Round(time.Millisecond))
				d.goRetryRefill(ts, delay)
			case retry:
				d.log.Warn("warm pool refill failed; trying again", "template", ts.t.Name, "err", err, "in", delay)
				d.goRetryRefill(ts, delay)
			case err != nil && !closed && pending:
				d.log.Warn("warm pool refill failed; a retry is already waiting", "template", ts.t.Name, "err", err)
			case err != nil && !closed:
				d.log.Warn("warm pool refill failed", "template", ts.t.Name, "err", err)
			}
			if vm != nil && closed {
				vm.destroy()
			}
			return // the snapshot's completion calls refill again
		}
		d.mu.Unlock()
		// Recorded before the pool has it: saved after, a claim could
		// take it in between and this late "pool" record replace the
		// claim's, and a node started again on it (after a crash, or an
		// upgrade in place) would destroy the claimed sandbox as a pool
		// member.
		vm.mu.Lock()
		vm.state = "pool"
		vm.mu.Unlock()
		vm.save()
		d.mu.Lock()
		if d.closed || len(ts.pool) >= ts.target {
			d.mu.Unlock()
			vm.destroy()
			return
		}
		ts.pool = append(ts.pool, vm)
		ts.refillFails = 0
		d.mu.Unlock()
	}
}

// Sandboxes lists the claimed sandboxes.
func (d *Driver) Sandboxes() []driver.Sandbox {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]driver.Sandbox, 0, len(d.live))
	for _, vm := range d.live {
		if vm != nil {
			out = append(out, vm)
		}
	}
	return out
}

// Get returns a claimed sandbox.
func (d *Driver) Get(id string) (driver.Sandbox, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	vm := d.live[id]
	return vm, vm != nil
}

// Close destroys every sandbox and pool and stops the reaper.
func (d *Driver) Close() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	d.closed = true
	close(d.stop)
	var all []*VM
	for _, vm := range d.live {
		if vm != nil {
			all = append(all, vm)
		}
	}
	for _, ts := range d.templates {
		all = append(all, ts.pool...)
		all = append(all, ts.standby...)
		ts.pool, ts.standby = nil, nil
	}
	d.mu.Unlock()
	var wg sync.WaitGroup
	for _, vm := range all {
		wg.Add(1)
		go func() { defer wg.Done(); vm.destroy() }()
	}
	wg.Wait()
	d.wg.Wait()
	return nil
}

// Detach stops the driver's background work and closes its connections
// but leaves every claimed sandbox running, for the next run of the node
// to re-adopt (an upgrade in place). Warm-pool members and standby QEMUs
// are destroyed.
func (d *Driver) Detach() {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return
	}
	d.closed = true
	close(d.stop)
	var pool, live []*VM
	for _, ts := range d.templates {
		pool = append(pool, ts.pool...)
		pool = append(pool, ts.standby...)
		ts.pool, ts.standby = nil, nil
	}
	for _, vm := range d.live {
		if vm != nil {
			live = append(live, vm)
		}
	}
	d.mu.Unlock()
	for _, vm := range pool {
		vm.destroy()
	}
	for _, vm := range live {
		vm.awaitBind() // the next run re-adopts it with its identity
		vm.mu.Lock()
		if vm.ttl != nil {
			vm.ttl.Stop()
		}
		if vm.agent != nil {
			vm.agent.Close()
		}
		if vm.qmp != nil {
			vm.qmp.Close()
		}
		vm.mu.Unlock()
	}
	d.wg.Wait()
}

// PoolMemberBytes is the guest memory of one warm pool member of template
// (the snapshot's, Config.SnapshotMemMB), which it can fill once claimed;
// 0 for a template the driver does not have. An idle member is much less
// (its untouched pages are the snapshot file's), and QEMU's own memory and
// TCG's cache come on top of it.
func (d *Driver) PoolMemberBytes(template string) int64 {
	if d.HasTemplate(template) != nil {
		return 0
	}
	return int64(d.cfg.SnapshotMemMB) << 20
}

var _ driver.PoolSizer = (*Driver)(nil)

// HasTemplate reports whether the template exists (a pool for it can be set).
func (d *Driver) HasTemplate(name string) error {
	_, err := d.template(name)
	return err
}
