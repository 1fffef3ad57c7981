package container

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/containerd"
	"github.com/containerd/containerd/cio"
	"github.com/containerd/containerd/contrib/seccomp"
	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/oci"
	"github.com/containerd/containerd/runtime/v2/runc/options"
	"github.com/moby/sys/mountinfo"
	"github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/guest"
	"github.com/warrenhq/warren/noded/driver"
)

// DefaultSocket is containerd's socket unless configured otherwise.
const DefaultSocket = "/run/containerd/containerd.sock"

// Config is the driver's configuration.
type Config struct {
	Socket    string // containerd's socket (DefaultSocket)
	Namespace string // containerd namespace ("warren")
	// Runtime is "runc" (default) or "runsc": gVisor, run through the runc
	// shim (Debian's runsc ships no shim of its own) with a wrapper that
	// calls runsc with the flags warren needs (see runscWrapper).
	Runtime string
	// RuncBinary, if set, is the OCI runtime binary the runc shim runs
	// instead: for runsc, a wrapper of one's own, which must pass
	// --network=none and --host-uds=create as the driver's own does.
	RuncBinary string
	ImageDir   string // template store (the root file systems)
	// Agent is the static warren-guest binary bind-mounted into every
	// container as its init, so the agent matches the node and not the
	// template's copy (default: warren-guest next to this executable, else
	// the template's /usr/local/bin/warren-guest).
	Agent           string
	StateDir        string // this node's containers (required)
	DefaultTemplate string // "default"
	// DefaultMemMB is a sandbox's memory unless it asks (512).
	DefaultMemMB       int
	DefaultTTL, MaxTTL time.Duration
	// Networks, if set, gives every container a network namespace of the
	// node's egress policy; without it a container has only loopback.
	Networks driver.Networks
	Logger   *slog.Logger
}

// Driver is the container driver.
type Driver struct {
	cfg    Config
	log    *slog.Logger
	client *containerd.Client
	scope  string // label value marking this driver's containers
	ver    string
	// logWriter is the script the shim runs to keep each agent's output
	// (see agentlog.go).
	logWriter string

	mu   sync.Mutex
	live map[string]*Box
	// lowers are the templates' read-only mounts, by mount point, with
	// the boxes using each; curLower is, per template name, the last one
	// a claim used (the template's current version), kept while unused.
	lowers   map[string]*lowerMount
	curLower map[string]string
	closed   bool
	claims   sync.WaitGroup // claims under way; Close waits for them

	// blankMu guards blanks, the blank disk images made this run by when
	// each was last used (blankUse counts uses), and serialises copying
	// them (disk.go).
	blankMu  sync.Mutex
	blanks   map[string]uint64
	blankUse uint64
}

// CheckRuntime refuses a runtime that is not Config.Runtime's: runc or
// runsc.
func CheckRuntime(r string) error {
	if r != "runc" && r != "runsc" {
		return fmt.Errorf("%q is not runc or runsc", r)
	}
	return nil
}

// New connects to containerd and destroys every container a previous run
// of this node left (containers are not re-adopted: see Detach).
func New(cfg Config) (*Driver, error) {
	if cfg.StateDir == "" {
		return nil, errors.New("container: state dir: required")
	}
	if cfg.Socket == "" {
		cfg.Socket = DefaultSocket
	}
	if cfg.Namespace == "" {
		cfg.Namespace = "warren"
	}
	if cfg.Runtime == "" {
		cfg.Runtime = "runc"
	}
	if err := CheckRuntime(cfg.Runtime); err != nil {
		return nil, fmt.Errorf("container: runtime: %w", err)
	}
	if cfg.Runtime == "runsc" && cfg.Networks != nil {
		// runsc's own network stack sends the sandbox's frames through a
		// packet socket, which skips the namespace's nftables hooks: the
		// egress policy would not hold.
		return nil, errors.New("container: runtime runsc cannot run under the egress policy yet: turn it off (--egress off) or use runc or microvm")
	}
	if cfg.DefaultTemplate == "" {
		cfg.DefaultTemplate = "default"
	}
	if cfg.DefaultMemMB == 0 {
		cfg.DefaultMemMB = 512
	}
	if cfg.DefaultTTL == 0 {
		cfg.DefaultTTL = driver.DefaultTTL
	}
	if cfg.MaxTTL == 0 {
		cfg.MaxTTL = driver.MaxTTL
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Agent == "" {
		if exe, err := os.Executable(); err == nil {
			if p := filepath.Join(filepath.Dir(exe), "warren-guest"); fileExists(p) {
				cfg.Agent = p
			}
		}
	} else if !fileExists(cfg.Agent) {
		return nil, fmt.Errorf("container: agent %s: not found", cfg.Agent)
	} else if abs, err := filepath.Abs(cfg.Agent); err == nil {
		cfg.Agent = abs // the runtime resolves mount sources from its bundle
	}
	if _, err := os.Stat(cfg.Socket); err != nil {
		return nil, fmt.Errorf("container: containerd socket %s: %w (apt-get install containerd runc, and start containerd)", cfg.Socket, err)
	}
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		return nil, fmt.Errorf("container: mkfs.ext4, which makes each sandbox's disk: %w (apt-get install e2fsprogs)", err)
	}
	// The state directory as the kernel names it: mount points under it
	// are found in /proc/self/mountinfo by that name (a relative or
	// symlinked one matched nothing, and a box's mounts were left), and
	// runc takes no relative root. The scope hashes that name too, so the
	// same directory has one scope however it is given.
	absState, err := filepath.Abs(cfg.StateDir)
	if err != nil {
		return nil, fmt.Errorf("container: state dir %s: %w", cfg.StateDir, err)
	}
	// Only root may enter the boxes: a sandbox's root is mounted in its
	// box, and a set-user-ID file its code made there (it runs as root
	// in the container) would otherwise give any user of the host root.
	boxes := filepath.Join(absState, "boxes")
	if err := os.MkdirAll(boxes, 0o700); err != nil {
		return nil, err
	}
	if err := os.Chmod(boxes, 0o700); err != nil { // made by an older run
		return nil, fmt.Errorf("container: %w", err)
	}
	if cfg.StateDir, err = filepath.EvalSymlinks(absState); err != nil {
		return nil, fmt.Errorf("container: state dir %s: %w", absState, err)
	}
	if _, err := guest.LoadTemplate(cfg.ImageDir, cfg.DefaultTemplate); err != nil {
		return nil, fmt.Errorf("container: %w (run `make image`)", err)
	}
	client, err := containerd.New(cfg.Socket, containerd.WithDefaultNamespace(cfg.Namespace), containerd.WithTimeout(5*time.Second))
	if err != nil {
		return nil, fmt.Errorf("container: containerd at %s: %w", cfg.Socket, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	v, err := client.Version(ctx)
	if err != nil {
		client.Close()
		return nil, fmt.Errorf("container: containerd at %s: %w", cfg.Socket, err)
	}
	h := sha256.Sum256([]byte(cfg.StateDir))
	d := &Driver{cfg: cfg, log: cfg.Logger, client: client, scope: hex.EncodeToString(h[:])[:12], ver: v.Version,
		live: map[string]*Box{}, lowers: map[string]*lowerMount{}, curLower: map[string]string{}, blanks: map[string]uint64{}}
	if d.logWriter, err = writeAgentLogWriter(cfg.StateDir); err != nil {
		client.Close()
		return nil, err
	}
	if cfg.Runtime == "runsc" && cfg.RuncBinary == "" {
		w, err := writeRunscWrapper(cfg.StateDir)
		if err != nil {
			client.Close()
			return nil, err
		}
		d.cfg.RuncBinary = w
	}
	d.cleanLeftovers()
	d.log.Info("container driver", "containerd", v.Version, "runtime", cfg.Runtime)
	return d, nil
}

// Name is "container".
func (d *Driver) Name() string { return "container" }

// Accelerator is "": containers are not virtualised.
func (d *Driver) Accelerator() string { return "" }

// Templates lists the template names in the store.
func (d *Driver) Templates() []string { return guest.ListTemplates(d.cfg.ImageDir) }

// SetPoolTarget is accepted and ignored: this driver keeps no warm pool (a
// container starts in a few hundred milliseconds).
func (d *Driver) SetPoolTarget(template string, n int) {
	if n > 0 {
		d.log.Info("the container driver keeps no warm pool; ignoring the target", "template", template, "target", n)
	}
}

// PoolMemberBytes is 0: the driver keeps no warm pool, so a target holds
// no memory.
func (d *Driver) PoolMemberBytes(string) int64 { return 0 }

var _ driver.PoolSizer = (*Driver)(nil)

const label = "warren.scope"

// cleanLeftovers destroys this driver's containers and box directories
// from a previous run. Each container has a time of its own (up to
// leftoverWait, a few at a time): they shared the start's 10 s, so after
// a crash with many sandboxes running (or one slow to stop) the rest were
// left running, with no TTL, until a later restart.
func (d *Driver) cleanLeftovers() {
	cs, err := listLeftovers(d)
	if err != nil {
		// Which boxes have a container is unknown: each box stays, its
		// id taken, until a listing in the background says (before,
		// their directories went from under containers that may still
		// have run, and their ids were free for a claim to collide with).
		d.log.Warn("listing leftover containers; their boxes are kept and the listing tried again in the background", "err", err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	kept := map[string]bool{}
	sem := make(chan struct{}, 8)
	for _, c := range cs {
		d.log.Info("destroying a container left by a previous run", "container", c.ID())
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			ctx, cancel := context.WithTimeout(context.Background(), leftoverWait)
			defer cancel()
			if d.destroyContainer(ctx, c) {
				return
			}
			// Its task would not stop in time: it still runs, on its
			// box's disk. The box stays, its id taken and its state
			// "destroyed", and the driver tries again in the background,
			// as for a destroy (Box.destroy). Before, the container was
			// forgotten and ran on with no TTL, its directory removed
			// under it.
			b := d.leftoverBox(c.ID())
			mu.Lock()
			kept[b.id] = true
			mu.Unlock()
			d.mu.Lock()
			d.live[b.id] = b
			d.mu.Unlock()
			d.log.Warn("a container left by a previous run is not deleted yet; trying again in the background", "container", b.id)
			d.retryDestroy(c, b.teardown)
		}()
	}
	wg.Wait()
	ents, _ := os.ReadDir(filepath.Join(d.cfg.StateDir, "boxes"))
	if err != nil {
		var held []*Box
		d.mu.Lock()
		for _, e := range ents {
			if e.IsDir() {
				b := d.leftoverBox(e.Name())
				d.live[b.id] = b
				held = append(held, b)
			}
		}
		d.mu.Unlock()
		go d.retryLeftovers(held)
		ents = nil
	}
	for _, e := range ents {
		if kept[e.Name()] {
			continue
		}
		dir := filepath.Join(d.cfg.StateDir, "boxes", e.Name())
		if err := unmountBox(dir); err != nil {
			d.log.Warn("unmounting a leftover box", "dir", dir, "err", err)
		}
		_ = os.RemoveAll(dir)
	}
	// Blank disks are made again in each run (disk.go).
	_ = os.RemoveAll(filepath.Join(d.cfg.StateDir, "blank"))
	// The templates' read-only mounts of a run that did not close (the
	// containers using them are gone): mounted again when needed.
	ents, _ = os.ReadDir(filepath.Join(d.cfg.StateDir, "lower"))
	for _, e := range ents {
		if m := filepath.Join(d.cfg.StateDir, "lower", e.Name()); isMounted(m) {
			_ = unix.Unmount(m, unix.MNT_DETACH)
		}
	}
}

// agentWait bounds a claim's wait for its container's agent to answer (a
// variable for tests).
var agentWait = 30 * time.Second

// listLeftovers lists the containers of d's scope (a variable for tests).
var listLeftovers = func(d *Driver) ([]containerd.Container, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return d.client.Containers(ctx, fmt.Sprintf("labels.%q==%s", label, d.scope))
}

// leftoverBox stands for box id of a previous run until it is gone: its
// id taken, its state "destroyed", its directory kept.
func (d *Driver) leftoverBox(id string) *Box {
	gone := make(chan struct{})
	close(gone)
	b := &Box{d: d, id: id, dir: filepath.Join(d.cfg.StateDir, "boxes", id), state: "destroyed", mounted: true, gone: gone, created: time.Now()}
	b.Agent, b.CallErr = b.client, b.callErr
	return b
}

// retryLeftovers lists the previous run's containers again every
// retryDestroyEvery, after the start's listing failed, and then destroys
// them as the start would have, freeing the boxes held meanwhile. It
// gives up when the driver closes (the next start's cleanup takes over).
func (d *Driver) retryLeftovers(held []*Box) {
	for d.waitToRetry() {
		cs, err := listLeftovers(d)
		if err != nil {
			continue
		}
		byID := map[string]containerd.Container{}
		for _, c := range cs {
			byID[c.ID()] = c
		}
		destroy := func(c containerd.Container, then func()) {
			ctx, cancel := context.WithTimeout(context.Background(), leftoverWait)
			defer cancel()
			if d.destroyContainer(ctx, c) {
				then()
			} else {
				d.retryDestroy(c, then)
			}
		}
		for _, b := range held {
			if c, ok := byID[b.id]; ok {
				delete(byID, b.id)
				destroy(c, b.teardown)
			} else {
				b.teardown()
			}
		}
		for _, c := range byID {
			destroy(c, func() {})
		}
		d.log.Info("leftover containers listed and destroyed on a later try", "containers", len(cs), "boxes", len(held))
		return
	}
}

// leftoverWait bounds the destroy of one container a previous run left (a
// variable for tests).
var leftoverWait = 60 * time.Second

// retryDeleteWait bounds each of retryDestroy's tries.
const retryDeleteWait = 60 * time.Second

// destroyContainer kills and deletes container c and its task; it reports
// whether they are gone by the time ctx ends.
func (d *Driver) destroyContainer(ctx context.Context, c containerd.Container) bool {
	if t, err := c.Task(ctx, nil); err == nil {
		_ = t.Kill(ctx, syscall.SIGKILL, containerd.WithKillAll)
		if ch, err := t.Wait(ctx); err == nil {
			select {
			case <-ch:
			case <-time.After(10 * time.Second):
			}
		}
		// The task can take longer to stop than the wait above on a busy
		// host (gVisor tearing down a fork bomb's processes), and a task
		// that has not stopped cannot be deleted, nor its container. Try
		// again until ctx ends rather than leave both behind.
		forced := false
		for {
			_, err := t.Delete(ctx, containerd.WithProcessKill)
			if err == nil || errdefs.IsNotFound(err) {
				break
			}
			if d.cfg.Runtime == "runsc" && !forced {
				// runsc cannot signal a container still in "created"
				// (its start failed), so the shim cannot kill it;
				// runsc can delete it by force, and then the shim sees
				// it exit.
				d.runscForceDelete(ctx, c.ID())
				forced = true
				continue
			}
			select {
			case <-ctx.Done():
				d.log.Warn("container task not deleted", "container", c.ID(), "err", err)
				return false
			case <-time.After(250 * time.Millisecond):
			}
		}
	}
	if err := c.Delete(ctx); err != nil && !errdefs.IsNotFound(err) {
		d.log.Warn("container not deleted", "container", c.ID(), "err", err)
		return false
	}
	return true
}

// lowerMount is one template version's read-only mount.
type lowerMount struct {
	name string // the template's
	refs int
}

// lower mounts a template's root file system read-only, once, and counts
// the caller (a box, which gives it back with releaseLower) as using it.
// Other versions' mounts that no box uses any more are unmounted: a
// template rebuilt replaces its version, and each old version's mount
// held a loop device and the old image's disk space (its file deleted by
// the build's --keep) until the node restarted.
func (d *Driver) lower(t *guest.Template) (string, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	// "@", which no template name has: with "-", template a-b at version
	// c and template a at version b-c shared a mount point, and a claim
	// of one got the other's root.
	m := filepath.Join(d.cfg.StateDir, "lower", t.Name+"@"+t.Version)
	if l, ok := d.lowers[m]; ok {
		l.refs++
		d.useLowerLocked(m)
		return m, nil
	}
	if err := os.MkdirAll(m, 0o755); err != nil {
		return "", err
	}
	if !isMounted(m) {
		out, err := exec.Command("mount", "-o", "loop,ro", t.Path(t.Rootfs), m).CombinedOutput()
		if err != nil {
			return "", fmt.Errorf("mount %s: %v: %s", t.Path(t.Rootfs), err, strings.TrimSpace(string(out)))
		}
	}
	d.lowers[m] = &lowerMount{name: t.Name, refs: 1}
	d.useLowerLocked(m)
	return m, nil
}

// useLowerLocked makes m its template's current lower mount and unmounts
// that template's other versions no box uses (d.mu held). Other
// templates' mounts stay: each has a current version of its own.
func (d *Driver) useLowerLocked(m string) {
	name := d.lowers[m].name
	if d.curLower[name] == m {
		return
	}
	d.curLower[name] = m
	for o, l := range d.lowers {
		if o != m && l.name == name && l.refs == 0 {
			d.unmountLowerLocked(o)
		}
	}
}

// releaseLower gives back a box's use of mount m ("" is none); an unused
// mount of a version other than its template's current one is unmounted.
func (d *Driver) releaseLower(m string) {
	if m == "" {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	l, ok := d.lowers[m]
	if !ok {
		return
	}
	l.refs--
	if l.refs <= 0 && m != d.curLower[l.name] {
		d.unmountLowerLocked(m)
	}
}

func (d *Driver) unmountLowerLocked(m string) {
	delete(d.lowers, m)
	if err := unix.Unmount(m, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
		d.log.Warn("unmount a template's old version", "mount", m, "err", err)
		return
	}
	_ = os.Remove(m)
}

func fileExists(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && !fi.IsDir()
}

// agentPath is where the agent is inside a container.
const agentPath = "/usr/local/lib/warren/warren-guest"

// isMounted reports whether dir is a mount point (mountinfo handles the
// escapes /proc/self/mountinfo writes paths with, and relative or
// symlinked paths).
func isMounted(dir string) bool {
	m, err := mountinfo.Mounted(dir)
	return err == nil && m
}

// Claim starts a container running the agent and binds its environment.
func (d *Driver) Claim(ctx context.Context, req driver.ClaimRequest) (driver.Sandbox, error) {
	t0 := time.Now()
	if req.ID == "" || strings.ContainsAny(req.ID, "/ ") {
		return nil, driver.Errorf(driver.ErrInvalid, "id %q: required, without / or spaces", req.ID)
	}
	name := req.Template
	if name == "" {
		name = d.cfg.DefaultTemplate
	}
	t, err := guest.LoadTemplate(d.cfg.ImageDir, name)
	if err != nil {
		if errors.Is(err, guest.ErrNoTemplate) {
			return nil, driver.Errorf(driver.ErrNotFound, "template %q: not in %s (have: %v)", name, d.cfg.ImageDir, d.Templates())
		}
		return nil, driver.Errorf(driver.ErrInvalid, "%v", err)
	}
	lim, err := d.checkLimits(t, req.Limits)
	if err != nil {
		return nil, err
	}
	ttl := req.TTL
	if ttl == 0 {
		ttl = d.cfg.DefaultTTL
	}
	if ttl < time.Second || ttl > d.cfg.MaxTTL {
		return nil, driver.Errorf(driver.ErrInvalid, "ttl_seconds %d: must be between 1 and %d (%v)", int64(ttl/time.Second), int64(d.cfg.MaxTTL/time.Second), d.cfg.MaxTTL)
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
	d.live[req.ID] = nil
	d.claims.Add(1)
	d.mu.Unlock()
	defer d.claims.Done()
	b, err := d.start(ctx, t, req, lim)
	if err != nil {
		d.mu.Lock()
		if cur, ok := d.live[req.ID]; ok && cur == nil {
			delete(d.live, req.ID) // else its container is still being deleted (Box.destroy)
		}
		d.mu.Unlock()
		return nil, err
	}
	b.mu.Lock()
	b.claimTime = time.Since(t0)
	b.expires = time.Now().Add(ttl)
	b.ttl = time.AfterFunc(ttl, func() {
		d.log.Info("sandbox expired; destroying", "sandbox", req.ID)
		_ = b.Destroy()
	})
	b.mu.Unlock()
	d.mu.Lock()
	if d.closed { // closed while this claim was under way: Close did not see it
		delete(d.live, req.ID)
		d.mu.Unlock()
		b.destroy() // Close waits for this claim, so the client is still open
		return nil, driver.Errorf(driver.ErrUnavailable, "driver closed")
	}
	d.live[req.ID] = b
	d.mu.Unlock()
	d.log.Info("sandbox claimed", "sandbox", req.ID, "took", b.claimTime, "template", t.Name)
	return b, nil
}

// checkLimits fills defaults and rejects what this driver cannot give. A
// disk of 0 is the template's (its root file system's size, as in a
// microVM); any other size is given as asked, from the template's files
// up (start checks that it leaves room above them).
func (d *Driver) checkLimits(t *guest.Template, l driver.Limits) (driver.Limits, error) {
	var errs []error
	if l.VCPUs == 0 {
		l.VCPUs = 1
	}
	if l.MemMB == 0 {
		l.MemMB = d.cfg.DefaultMemMB
	}
	if l.Pids == 0 {
		l.Pids = 4096
	}
	if l.VCPUs < 1 || l.VCPUs > runtime.NumCPU() {
		errs = append(errs, fmt.Errorf("limits.vcpus %d: must be between 1 and %d (this node's CPUs)", l.VCPUs, runtime.NumCPU()))
	}
	if l.MemMB < 64 || l.MemMB > 64<<10 {
		errs = append(errs, fmt.Errorf("limits.memory_mb %d: must be between 64 and 65536", l.MemMB))
	} else if err := driver.CheckMemoryMB(l.MemMB); err != nil {
		errs = append(errs, err)
	}
	if l.DiskMB == 0 {
		l.DiskMB = int(t.DiskBytes >> 20)
		if l.DiskMB == 0 { // a template whose manifest does not say
			l.DiskMB = defaultDiskMB
		}
	}
	if l.DiskMB < 64 || l.DiskMB > maxDiskMB {
		errs = append(errs, fmt.Errorf("limits.disk_mb %d: must be between 64 and %d", l.DiskMB, maxDiskMB))
	}
	if l.Pids < 16 || l.Pids > 1<<20 {
		errs = append(errs, fmt.Errorf("limits.pids %d: must be between 16 and 1048576", l.Pids))
	}
	if err := errors.Join(errs...); err != nil {
		return l, driver.Errorf(driver.ErrInvalid, "%v", err)
	}
	return l, nil
}

// start makes the box's root (an overlay on the template's), the container
// and its task, and waits for the agent.
func (d *Driver) start(ctx context.Context, t *guest.Template, req driver.ClaimRequest, lim driver.Limits) (_ *Box, err error) {
	lower, err := d.lower(t)
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(d.cfg.StateDir, "boxes", req.ID)
	b := &Box{d: d, id: req.ID, dir: dir, template: t.Name + "@" + t.Version, limits: lim, created: time.Now(), state: "running", lower: lower}
	b.Agent, b.CallErr = b.client, b.callErr
	defer func() {
		if err != nil {
			b.destroy()
		}
	}()
	size, err := writable(lower, t.Name, lim.DiskMB)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Join(dir, "rootfs"), 0o755); err != nil {
		return nil, err
	}
	b.mounted = true // from here on, destroy unmounts what is mounted
	if err := d.makeDisk(ctx, dir, size); err != nil {
		return nil, err
	}
	disk := filepath.Join(dir, diskMount)
	for _, sub := range []string{"upper", "work", "run"} {
		if err := os.Mkdir(filepath.Join(disk, sub), 0o755); err != nil {
			return nil, err
		}
	}
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", lower, filepath.Join(disk, "upper"), filepath.Join(disk, "work"))
	if err := unix.Mount("overlay", filepath.Join(dir, "rootfs"), "overlay", 0, opts); err != nil {
		return nil, fmt.Errorf("overlay: %w", err)
	}
	env := []string{"PATH=" + guest.BaseEnv["PATH"], "HOME=/root", "LANG=C.UTF-8"}
	mounts := []specs.Mount{{Destination: "/run/warren", Type: "bind", Source: filepath.Join(disk, "run"), Options: []string{"rbind", "rw"}}}
	agent := "/usr/local/bin/warren-guest" // the template's copy
	if d.cfg.Agent != "" {
		agent = agentPath
		mounts = append(mounts, specs.Mount{Destination: agentPath, Type: "bind", Source: d.cfg.Agent, Options: []string{"bind", "ro"}})
	}
	specOpts := []oci.SpecOpts{
		oci.WithDefaultSpec(),
		oci.WithRootFSPath(filepath.Join(dir, "rootfs")),
		oci.WithProcessArgs(agent, "serve", "--listen", "/run/warren/agent.sock", "--container"),
		oci.WithProcessCwd("/"),
		oci.WithEnv(env),
		oci.WithHostname(driver.Hostname(req.ID)),
		oci.WithMemoryLimit(uint64(lim.MemMB) << 20),
		oci.WithCPUCFS(int64(lim.VCPUs)*100000, 100000),
		oci.WithPidsLimit(d.hostPids(lim.Pids)),
		oci.WithMounts(mounts),
		// No raw or packet sockets: a frame written to a packet socket
		// skips the namespace's nftables hooks, and so the egress policy.
		// (CAP_NET_ADMIN, which could rewrite the rules, is not in the
		// default set either.)
		oci.WithDroppedCapabilities([]string{"CAP_NET_RAW"}),
		// The default seccomp profile (containerd's, as Docker's), made
		// for the capabilities above, so after them. Without it the
		// sandbox's code could create a user namespace and, with every
		// capability inside it, reach the kernel's namespaced surface
		// (mounts, netfilter, new network namespaces); it also refuses
		// keyctl, bpf, perf_event_open, module loading and the like.
		// (runsc ignores it: gVisor's own kernel is the boundary.)
		seccomp.WithDefaultProfile(),
		// A cgroup namespace of its own: /proc/self/cgroup and the
		// read-only /sys/fs/cgroup show the container's cgroup as the
		// root, not the host's hierarchy.
		oci.WithLinuxNamespace(specs.LinuxNamespace{Type: specs.CgroupNamespace}),
	}
	if swapAccounted() {
		// Memory plus swap, the same: no swap. Unset, swap was
		// unlimited, and on a host with swap a sandbox went past its
		// limit by swapping. (Where the kernel accounts no swap, runc
		// would refuse the container over it: there is no swap to limit.)
		specOpts = append(specOpts, oci.WithMemorySwap(int64(lim.MemMB)<<20))
	}
	if d.cfg.Networks != nil {
		nw, err := d.cfg.Networks.Attach(ctx)
		if err != nil {
			return nil, fmt.Errorf("network: %w", err)
		}
		b.net = nw
		specOpts = append(specOpts, oci.WithLinuxNamespace(specs.LinuxNamespace{Type: specs.NetworkNamespace, Path: nw.NSPath()}))
	}
	var rtOpts any
	if d.cfg.RuncBinary != "" {
		rtOpts = &options.Options{BinaryName: d.cfg.RuncBinary}
	}
	// Not cancelled with the claim: a record made after the caller gave
	// up (before its answer came back) was never deleted, and its id was
	// refused as existing until the next restart.
	cctx, ccancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer ccancel()
	c, err := d.client.NewContainer(cctx, req.ID,
		containerd.WithNewSpec(specOpts...),
		containerd.WithRuntime("io.containerd.runc.v2", rtOpts),
		containerd.WithContainerLabels(map[string]string{label: d.scope}))
	if errdefs.IsAlreadyExists(err) {
		return nil, driver.Errorf(driver.ErrExists, "sandbox %q exists (a container of that id is left in containerd)", req.ID)
	}
	if err != nil {
		return nil, fmt.Errorf("container: %w", err)
	}
	b.c = c
	logPath := filepath.Join(dir, agentLogName)
	task, err := c.NewTask(cctx, cio.BinaryIO(d.logWriter, map[string]string{"log": logPath}))
	if err != nil {
		return nil, fmt.Errorf("container task: %w", err)
	}
	b.task = task
	if err := task.Start(ctx); err != nil {
		return nil, fmt.Errorf("container start: %w", err)
	}
	actx, cancel := context.WithTimeout(ctx, agentWait)
	defer cancel()
	sock := filepath.Join(disk, "run", "agent.sock")
	for {
		if cl, err := guest.Dial(actx, sock); err == nil {
			if _, err = cl.Ping(actx); err == nil {
				b.agent = cl
				break
			}
			cl.Close()
		}
		select {
		case <-actx.Done():
			// The agent's own words on why it did not start, if any: the
			// log is short then, and only its end is quoted regardless.
			log := strings.TrimSpace(string(driver.ReadEnd(logPath, 4<<10)))
			if ctx.Err() == nil {
				// The node's own bound, not the caller's deadline: a
				// caller told "deadline exceeded" would retry with a
				// longer one, which changes nothing.
				return nil, driver.Errorf(driver.ErrUnavailable, "agent: did not answer within %v (a busy host, or it did not start): %s", agentWait, log)
			}
			return nil, fmt.Errorf("agent: %w: %s", actx.Err(), log)
		case <-time.After(2 * time.Millisecond):
		}
	}
	b.env = req.Env
	creq := guest.ClaimRequest{Env: req.Env}
	if d.cfg.Runtime == "runsc" {
		creq.Pids = lim.Pids // see hostPids
	}
	if b.net != nil {
		nc := b.net.GuestConfig(false)
		creq.Net = &nc
	}
	if _, err := b.agent.Claim(ctx, creq); err != nil {
		return nil, fmt.Errorf("claim: %w", err)
	}
	return b, nil
}

// Sandboxes lists the live sandboxes.
func (d *Driver) Sandboxes() []driver.Sandbox {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []driver.Sandbox
	for _, b := range d.live {
		if b != nil {
			out = append(out, b)
		}
	}
	return out
}

// Get returns a live sandbox.
func (d *Driver) Get(id string) (driver.Sandbox, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	b := d.live[id]
	return b, b != nil
}

// Close destroys every sandbox and unmounts the templates.
func (d *Driver) Close() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	d.closed = true
	d.mu.Unlock()
	d.claims.Wait() // a claim under way destroys its own container
	d.mu.Lock()
	var all []*Box
	for _, b := range d.live {
		if b != nil {
			all = append(all, b)
		}
	}
	d.mu.Unlock()
	var wg sync.WaitGroup
	for _, b := range all {
		wg.Add(1)
		go func() { defer wg.Done(); b.destroy() }()
	}
	wg.Wait()
	d.mu.Lock()
	for m := range d.lowers {
		_ = unix.Unmount(m, unix.MNT_DETACH)
	}
	d.mu.Unlock()
	return d.client.Close()
}

var _ io.Closer = (*Driver)(nil)

// swapAccounted reports whether the host's memory cgroups account swap:
// cgroup v2 (runc leaves swap alone where it cannot set it), or v1 with
// memory.memsw files (swapaccount on).
func swapAccounted() bool {
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		return true
	}
	_, err := os.Stat("/sys/fs/cgroup/memory/memory.memsw.limit_in_bytes")
	return err == nil
}
