package container

import (
	"context"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containerd/containerd"

	"github.com/warrenhq/warren/guest"
	"github.com/warrenhq/warren/noded/driver"
)

// Box is one container sandbox.
type Box struct {
	driver.AgentCalls // exec and files, through client()

	d        *Driver
	id       string
	dir      string
	template string
	limits   driver.Limits
	created  time.Time

	mu        sync.Mutex
	c         containerd.Container
	task      containerd.Task
	agent     *guest.Client
	mounted   bool
	lower     string // the template's read-only mount it uses (Driver.lower)
	state     string // "running", "paused", "destroyed"
	expires   time.Time
	claimTime time.Duration
	env       map[string]string
	ttl       *time.Timer
	net       driver.Network // nil without the node's egress policy
	// gone is closed when a destroy has finished (made by the first);
	// another destroy waits for it, so a Destroy or Close that finds one
	// under way returns once the container is removed, not before.
	gone chan struct{}
	// busy is what Info reports while a pause or resume holds mu (see
	// setBusy).
	busy atomic.Pointer[driver.Info]
}

// Network is the box's network, nil when it has none.
func (b *Box) Network() driver.Network { return b.net }

// ID is the sandbox id.
func (b *Box) ID() string { return b.id }

// Warm is false: containers start on demand.
func (b *Box) Warm() bool { return false }

// Info describes the sandbox.
func (b *Box) Info() driver.Info {
	if in := b.busy.Load(); in != nil {
		return *in
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.infoLocked()
}

func (b *Box) infoLocked() driver.Info {
	return driver.Info{ID: b.id, Template: b.template, State: b.state, Start: driver.StartBoot, Limits: b.limits,
		Created: b.created, Expires: b.expires, ClaimTime: b.claimTime}
}

// setBusy shows a pause or resume under way in Info, which does not wait
// for b.mu meanwhile: the shim's freeze of a busy container's processes
// can take seconds (up to lifecycleContext's 30 s), and a node's list of
// its sandboxes waited for it. "" ends it. b.mu is held.
func (b *Box) setBusy(state string) {
	if state == "" {
		b.busy.Store(nil)
		return
	}
	in := b.infoLocked()
	in.State = state
	b.busy.Store(&in)
}

func (b *Box) client() (*guest.Client, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.state {
	case "destroyed":
		return nil, driver.Errorf(driver.ErrNotFound, "sandbox %s is destroyed", b.id)
	case "paused":
		return nil, driver.Errorf(driver.ErrInvalid, "sandbox %s is paused; resume it first", b.id)
	}
	return b.agent, nil
}

// callErr says so when a call failed because the box was destroyed while
// it ran (not the channel's "guest: EOF"), or because its agent's
// connection closed: the container or its agent died (a memory hog under
// gVisor takes the whole sandbox), and every later call would fail with
// the channel's error until the TTL. Such a box is destroyed, and the call
// gets ErrNotFound, so that its caller (a task actor) claims another.
func (b *Box) callErr(err error) error {
	b.mu.Lock()
	state, agent := b.state, b.agent
	b.mu.Unlock()
	if state == "destroyed" {
		return driver.Errorf(driver.ErrNotFound, "sandbox %s was destroyed while the call ran", b.id)
	}
	if agent != nil {
		select {
		case <-agent.Done():
			b.d.log.Warn("the sandbox's agent is gone; destroying it", "sandbox", b.id, "err", err)
			b.destroy()
			return driver.Errorf(driver.ErrNotFound, "sandbox %s is gone: its agent's connection closed (the container or its agent died): %v", b.id, err)
		default:
		}
	}
	return err
}

// Pause freezes every process of the container (in memory: containers
// have no snapshot to disk here).
func (b *Box) Pause(ctx context.Context) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.state {
	case "paused":
		return nil
	case "destroyed":
		return driver.Errorf(driver.ErrNotFound, "sandbox %s is destroyed", b.id)
	}
	b.setBusy("pausing")
	defer b.setBusy("")
	lctx, cancel := lifecycleContext(ctx)
	defer cancel()
	if err := b.task.Pause(lctx); err != nil {
		b.settle(ctx)
		return fmt.Errorf("pause: %w", err)
	}
	b.state = "paused"
	return nil
}

// lifecycleContext is a pause's or resume's: not cancelled with the
// caller's call. The shim finishes a change it began whatever the caller
// does, so a change cut short left the box's state saying the opposite of
// the container's, and every later call and change refused ("paused;
// resume it first", "cannot resume a running process").
func lifecycleContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), lifecycleWait)
}

// lifecycleWait bounds a pause or resume (a variable for tests).
var lifecycleWait = 30 * time.Second

// settleWait bounds settle's question to the shim (a variable for tests).
var settleWait = 10 * time.Second

// settle sets the box's state from the task's after a pause or resume
// failed: the change may have happened all the same. It asks with a time
// of its own: the change's context has often ended (a change that took
// over lifecycleContext's 30 s, which the shim then finished), and the
// box kept saying "running" while frozen, and a resume did nothing.
func (b *Box) settle(ctx context.Context) {
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), settleWait)
	defer cancel()
	st, err := b.task.Status(sctx)
	if err != nil {
		if b.d != nil {
			b.d.log.Warn("the container's state after a failed pause or resume is unknown", "sandbox", b.id, "err", err)
		}
		return
	}
	switch st.Status {
	case containerd.Paused, containerd.Pausing:
		b.state = "paused"
	case containerd.Running:
		b.state = "running"
	}
}

// Resume thaws a paused container.
func (b *Box) Resume(ctx context.Context) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.state {
	case "running":
		return nil
	case "destroyed":
		return driver.Errorf(driver.ErrNotFound, "sandbox %s is destroyed", b.id)
	}
	b.setBusy("resuming")
	defer b.setBusy("")
	lctx, cancel := lifecycleContext(ctx)
	defer cancel()
	if err := b.task.Resume(lctx); err != nil {
		b.settle(ctx)
		return fmt.Errorf("resume: %w", err)
	}
	b.state = "running"
	return nil
}

// Destroy kills the container and removes its task, container, overlay
// and directory.
func (b *Box) Destroy() error {
	b.destroy()
	return nil
}

func (b *Box) destroy() {
	b.mu.Lock()
	if b.gone == nil {
		b.gone = make(chan struct{})
	}
	gone := b.gone
	if b.state == "destroyed" {
		b.mu.Unlock()
		<-gone // under way: wait for it
		return
	}
	b.state = "destroyed"
	defer close(gone)
	if b.ttl != nil {
		b.ttl.Stop()
	}
	if b.agent != nil {
		b.agent.Close()
	}
	c := b.c
	b.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), destroyWait)
	deleted := c == nil || b.d.destroyContainer(ctx, c)
	cancel()
	if !deleted {
		// Its task would not stop in time (gVisor tearing down a fork
		// bomb, a busy host): the container still runs, in this box's
		// network and on its disk. They stay, as does the box (its id
		// taken, its state "destroyed"), until it is gone: the driver
		// tries again in the background (the next start's cleanup takes
		// what a closed driver left). It dropped them at once and forgot
		// the container, which ran on with no TTL.
		b.d.mu.Lock()
		if cur, ok := b.d.live[b.id]; !ok || cur == nil {
			// A claim that failed: its id stays taken until the retry
			// is done (the claim frees only an id it still holds
			// empty). Freed at once, a retried claim of the id made its
			// box in this one's directory, which the retry's teardown
			// then removed under it.
			b.d.live[b.id] = b
		}
		b.d.mu.Unlock()
		b.d.retryDestroy(c, b.teardown)
		return
	}
	b.teardown()
}

// destroyWait bounds a destroy's wait for its container to go (a
// variable for tests); past it, retryDestroy goes on.
var destroyWait = 30 * time.Second

// retryDestroyEvery is how often retryDestroy tries again (a variable for
// tests).
var retryDestroyEvery = 10 * time.Second

// retryDestroy tries to delete container c every retryDestroyEvery until
// it is gone, then calls then; it gives up when the driver closes.
func (d *Driver) retryDestroy(c containerd.Container, then func()) {
	go func() {
		for d.waitToRetry() {
			ctx, cancel := context.WithTimeout(context.Background(), retryDeleteWait)
			ok := d.destroyContainer(ctx, c)
			cancel()
			if ok {
				d.log.Info("container deleted on a later try", "container", c.ID())
				then()
				return
			}
		}
	}()
}

// waitToRetry waits retryDestroyEvery and reports whether the driver is
// still open, for a background retry to go on.
func (d *Driver) waitToRetry() bool {
	time.Sleep(retryDestroyEvery)
	d.mu.Lock()
	defer d.mu.Unlock()
	return !d.closed
}

// teardown frees what a box holds besides its container (its mounts,
// network and directory), and forgets it.
func (b *Box) teardown() {
	if b.mounted {
		if err := unmountBox(b.dir); err != nil {
			b.d.log.Warn("unmount", "sandbox", b.id, "err", err)
		}
	}
	if b.net != nil {
		if err := b.net.Close(); err != nil {
			b.d.log.Warn("remove network", "sandbox", b.id, "err", err)
		}
	}
	_ = os.RemoveAll(b.dir)
	b.mu.Lock()
	lower := b.lower
	b.lower = ""
	b.mu.Unlock()
	b.d.releaseLower(lower)
	b.d.mu.Lock()
	if cur, ok := b.d.live[b.id]; ok && cur == b {
		delete(b.d.live, b.id)
	}
	b.d.mu.Unlock()
}
