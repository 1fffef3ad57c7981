package microvm

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/warrenhq/warren/noded/driver"
)

// adoptAll runs once at start: each VM a previous run of this node left is
// re-adopted if it is a claimed sandbox whose QEMU still answers (or one
// paused to disk), and destroyed otherwise. Warm-pool members and standby
// QEMUs are destroyed: they are made again.
//
// The VMs are tried adoptParallel at a time: each may wait adoptTimeout
// for a guest that does not answer, and one after another a few dozen
// such guests (their root can stop the agent) held the node's start, its
// heartbeats and its API for minutes.
func (d *Driver) adoptAll() {
	ents, _ := os.ReadDir(filepath.Join(d.cfg.StateDir, "vms"))
	type left struct {
		name, dir string
		vm        *VM
		why       string
	}
	var all []*left
	for _, e := range ents {
		if e.IsDir() {
			all = append(all, &left{name: e.Name(), dir: filepath.Join(d.cfg.StateDir, "vms", e.Name())})
		}
	}
	sem := make(chan struct{}, adoptParallel)
	var wg sync.WaitGroup
	for _, l := range all {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			l.vm, l.why = d.adopt(l.dir, l.name)
		}()
	}
	wg.Wait()
	for _, l := range all {
		vm := l.vm
		if vm == nil {
			d.log.Info("destroying a VM left by a previous run", "vm", l.name, "why", l.why)
			d.destroyLeftover(l.dir, l.name)
			continue
		}
		vm.reattachNetwork()
		d.mu.Lock()
		d.live[vm.sandboxID] = vm
		d.known[vm.id] = true
		d.mu.Unlock()
		vm.armTTL()
		vm.watchExit()
		d.log.Info("re-adopted sandbox", "sandbox", vm.sandboxID, "vm", vm.id, "state", vm.state)
	}
	d.reap()
}

func (d *Driver) adopt(dir, id string) (*VM, string) {
	b, err := os.ReadFile(filepath.Join(dir, "meta.json"))
	if err != nil {
		return nil, "no meta.json"
	}
	var m vmMeta
	if err := json.Unmarshal(b, &m); err != nil || m.ID != id {
		return nil, "unreadable meta.json"
	}
	switch {
	case m.State == "standby":
		return nil, "a standby QEMU"
	case m.SandboxID == "" || m.State == "pool":
		return nil, "a warm-pool member"
	}
	if time.Now().After(m.Expires) {
		return nil, "its TTL ended"
	}
	vm := &VM{d: d, id: id, spec: m.Spec, template: m.Template, state: m.State, sandboxID: m.SandboxID, start: m.Start,
		limits: m.Limits, created: m.Created, expires: m.Expires, env: m.Env}
	vm.Agent, vm.CallErr = vm.client, vm.callErr
	vm.netNS = m.NetNS
	switch m.State {
	case "paused":
		fi, err := os.Stat(filepath.Join(dir, "paused.state"))
		if err != nil {
			return nil, "paused, but its state file is gone"
		}
		// A state of another size than the pause wrote (cut short by a
		// power loss, before pauses synced it) cannot be resumed: kept,
		// the sandbox would stay paused, every resume failing, until
		// its TTL.
		if m.PausedSize > 0 && fi.Size() != m.PausedSize {
			return nil, fmt.Sprintf("paused, but its state file has %d bytes of the %d its pause wrote", fi.Size(), m.PausedSize)
		}
		vm.pausedSize = m.PausedSize
		// A QEMU of a pause the last run did not finish (it records
		// "paused" before it ends QEMU) or of a resume it did not finish:
		// a resume launches its own, so this one would be a second on the
		// disk. Found by its name, not the pid file: a resume's QEMU
		// started just before the node died may not be in it yet, and
		// the reaper spares a VM the driver owns.
		for _, pid := range qemusNamed(id) {
			d.log.Warn("a paused sandbox's QEMU still runs (a pause or resume the last run did not finish); ending it", "sandbox", m.SandboxID, "pid", pid)
			adopt(pid).kill()
		}
		return vm, ""
	case "running":
	default:
		return nil, "state " + m.State
	}
	pid := readPid(dir)
	if pid <= 0 || !isOurQEMU(pid, id) {
		return nil, "its QEMU is gone"
	}
	vm.p = adopt(pid)
	// Under TCG on a busy host a guest takes seconds to see its agent's
	// new host connection; a live VM is worth the wait.
	ctx, cancel := context.WithTimeout(context.Background(), adoptTimeout)
	defer cancel()
	q, err := DialQMP(ctx, vm.spec.qmpPath())
	if err != nil {
		vm.p.kill()
		return nil, "QMP does not answer: " + err.Error()
	}
	vm.qmp = q
	conted, err := d.undoPause(ctx, q, dir, m.SandboxID)
	if err != nil {
		q.Close()
		vm.p.kill()
		return nil, "its guest is stopped and does not run again: " + err.Error()
	}
	c, err := waitAgent(ctx, vm.spec, vm.p.exited, reconnectAgentWait, d.log.With("sandbox", m.SandboxID))
	if err != nil {
		q.Close()
		vm.p.kill()
		return nil, "its agent does not answer: " + err.Error()
	}
	vm.agent = c
	if conted {
		// Frozen inside the last run's agent session, as a resumed guest
		// is (see freshSession).
		if err := vm.freshSession(ctx); err != nil {
			q.Close()
			vm.p.kill()
			return nil, "its agent does not answer once it runs again: " + err.Error()
		}
	}
	return vm, ""
}

// undoPause lets the guest of a sandbox recorded running run again. A
// pause stops the guest before it saves it, and records "paused" only once
// the save is whole; a node that died between the two left the guest
// stopped, with QEMU still saving it (the migration under way: it is
// cancelled, else its end would stop the guest again, with nothing left
// to let it run) or done ("postmigrate", from which cont runs it as
// from "paused"). What the save wrote, which no record names, is removed.
// conted reports a guest that was stopped and now runs.
func (d *Driver) undoPause(ctx context.Context, q *QMP, dir, sandbox string) (conted bool, err error) {
	mig, _, err := q.Migration(ctx)
	if err != nil {
		return false, err
	}
	if migrating(mig) {
		d.log.Warn("a pause the last run did not finish is still saving the guest; cancelling it", "sandbox", sandbox, "migration", mig)
		if _, err := q.Run(ctx, "migrate_cancel", nil); err != nil {
			return false, err
		}
		if err := waitMigrationEnd(ctx, q, mig); err != nil {
			return false, err
		}
	}
	if err := os.Remove(filepath.Join(dir, "paused.state")); err != nil && !os.IsNotExist(err) {
		return false, err
	}
	st, err := q.Status(ctx)
	if err != nil {
		return false, err
	}
	if st != "paused" && st != "postmigrate" {
		return false, nil
	}
	d.log.Warn("a guest a pause of the last run stopped runs again", "sandbox", sandbox, "status", st)
	if _, err := q.Run(ctx, "cont", nil); err != nil {
		return false, err
	}
	return true, nil
}

// waitMigrationEnd waits until the outgoing migration, last seen in
// status mig, has ended (cancelled or done), asking QEMU every 2 ms.
func waitMigrationEnd(ctx context.Context, q *QMP, mig string) error {
	for migrating(mig) {
		select {
		case <-ctx.Done():
			return fmt.Errorf("migration %s: %w", mig, ctx.Err())
		case <-time.After(2 * time.Millisecond):
		}
		var err error
		if mig, _, err = q.Migration(ctx); err != nil {
			return err
		}
	}
	return nil
}

// migrating reports whether an outgoing migration of this status
// (query-migrate) has yet to end.
func migrating(status string) bool {
	switch status {
	case "setup", "active", "cancelling", "device", "pre-switchover":
		return true
	}
	return false
}

// adoptTimeout bounds reconnecting to a running guest's agent (re-adoption,
// and a resumed VM's fresh session).
const adoptTimeout = 15 * time.Second

// adoptParallel is how many VMs a start re-adopts at once.
const adoptParallel = 8

// reattachNetwork takes back a re-adopted VM's network with its policy. If
// it cannot (the node runs without egress policy now, or the namespace is
// gone), the VM runs on with no network: its guest reaches nothing.
func (vm *VM) reattachNetwork() {
	if vm.netNS == "" {
		return
	}
	ra, ok := vm.d.cfg.Networks.(driver.Reattacher)
	if !ok {
		vm.d.log.Warn("re-adopted sandbox has lost its network: the node runs without egress policy", "sandbox", vm.sandboxID)
		return
	}
	nw, err := ra.Reattach(vm.netNS)
	if err != nil {
		vm.d.log.Warn("re-adopted sandbox has lost its network", "sandbox", vm.sandboxID, "err", err)
		return
	}
	vm.net = nw
}

func (d *Driver) destroyLeftover(dir, id string) {
	if pid := readPid(dir); pid > 0 && isOurQEMU(pid, id) {
		adopt(pid).kill()
	}
	if d.cg != nil {
		_ = d.cg.remove(id)
	}
	_ = os.RemoveAll(dir)
}

func (d *Driver) reapLoop() {
	defer d.wg.Done()
	t := time.NewTicker(d.cfg.ReapInterval)
	defer t.Stop()
	for {
		select {
		case <-d.stop:
			return
		case <-t.C:
			d.reap()
		}
	}
}

// dropExited takes out of the warm pools the VMs whose QEMU exited while
// they waited (the host's OOM killer, a crash, an operator's kill): they
// counted as ready, so the pool was never refilled, and the node
// advertised warm sandboxes it did not have, each claim of one failing
// over to a cold restore. Each is destroyed and its pool refilled. It
// returns how many it dropped.
func (d *Driver) dropExited() int {
	d.mu.Lock()
	var dead []*VM
	var refill []*tplState
	for _, ts := range d.templates {
		kept := ts.pool[:0]
		for _, vm := range ts.pool {
			select {
			case <-vm.p.exited:
				dead = append(dead, vm)
			default:
				kept = append(kept, vm)
			}
		}
		if len(kept) < len(ts.pool) {
			clear(ts.pool[len(kept):])
			ts.pool = kept
			refill = append(refill, ts)
		}
	}
	d.mu.Unlock()
	for _, vm := range dead {
		d.log.Warn("a warm sandbox's QEMU had exited; destroying it", "vm", vm.id, "qemu_log", tail(filepath.Join(vm.spec.Dir, "qemu.log")))
		vm.destroy()
	}
	for _, ts := range refill {
		d.goRefill(ts, 0)
	}
	return len(dead)
}

// reap kills this driver's QEMUs, and removes its VM directories and
// cgroups, that no live, pooled or in-progress VM owns. It returns how
// many things it removed.
func (d *Driver) reap() int {
	dropped := d.dropExited()
	// List first, then take the owned set: a VM is tracked (d.known)
	// before its directory, QEMU or cgroup exists, until its destroy, so
	// anything listed whose VM is being made is owned by then. (The other
	// order took a VM tracked between the two for an orphan, and removed
	// its directory and QEMU while a claim or refill was making it.)
	qemus := ourQEMUs()
	ents, _ := os.ReadDir(filepath.Join(d.cfg.StateDir, "vms"))
	var cgs []string
	if d.cg != nil {
		cgs = d.cg.list()
	}
	owned := map[string]bool{}
	d.mu.Lock()
	for id := range d.known {
		owned[id] = true
	}
	for _, vm := range d.live {
		if vm != nil {
			owned[vm.id] = true
		}
	}
	for _, ts := range d.templates {
		for _, vm := range ts.pool {
			owned[vm.id] = true
		}
	}
	d.mu.Unlock()
	mine := func(id string) bool { return strings.HasPrefix(id, d.scope+"-") && !owned[id] }
	n := 0
	for id, pid := range qemus {
		if mine(id) {
			d.log.Warn("reaping an orphaned QEMU", "vm", id, "pid", pid)
			adopt(pid).kill()
			n++
		}
	}
	for _, e := range ents {
		if mine(e.Name()) {
			d.log.Warn("reaping an orphaned VM directory", "vm", e.Name())
			_ = os.RemoveAll(filepath.Join(d.cfg.StateDir, "vms", e.Name()))
			n++
		} else if owned[e.Name()] {
			trimConsole(filepath.Join(d.cfg.StateDir, "vms", e.Name(), "console.log"))
		}
	}
	for _, id := range cgs {
		if mine(id) {
			_ = d.cg.remove(id)
			n++
		}
	}
	return n + dropped + d.pruneSnapshots()
}

// maxConsoleBytes bounds a VM's console.log: the guest (its root, or the
// code the model runs) may write to its serial port for its whole TTL,
// and the file is on the node's disk.
const maxConsoleBytes = 16 << 20

// trimConsole empties a console log over maxConsoleBytes; QEMU appends to
// it (append=on), so it goes on from the start.
func trimConsole(name string) {
	if st, err := os.Stat(name); err == nil && st.Size() > maxConsoleBytes {
		_ = os.Truncate(name, 0)
	}
}
