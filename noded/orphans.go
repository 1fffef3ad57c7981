package noded

import (
	"context"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/warrenhq/warren/api"
	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
	"github.com/warrenhq/warren/api/gen/warren/v1/warrenv1connect"
	"github.com/warrenhq/warren/noded/driver"
)

// orphanSweepEvery is how often a node looks for task sandboxes that no
// actor holds (Config.OrphanSweep overrides it).
const orphanSweepEvery = 30 * time.Second

// sweepOrphans destroys, every every, the task sandboxes (TASK-eEPOCH,
// and their verification sandboxes) that no actor of this node holds and
// whose lease is no longer this node's at that epoch.
//
// A driver re-adopts its sandboxes when the node restarts, and a task's
// actor, started again at the same epoch, goes on in its own. But a task
// whose lease moved meanwhile (the restart outlasted the node's TTL: the
// task went to another node, or came back here at a later epoch, or was
// cancelled) has no actor for it here, and nothing else destroyed it: a
// whole microVM, with what the model left running in it, lived until its
// TTL (a day for a scripted task), counted by no one, and the sandbox API
// cannot delete a task's sandbox.
//
// A sandbox is left alone until it has had no actor for two sweeps with
// a session open (the leader sends a session its tasks when it opens),
// and then only if the cluster says its lease is not this node's at its
// epoch (a task the cluster does not know, or one that ended, included).
func (d *Daemon) sweepOrphans(every time.Duration) {
	l, ok := d.cfg.Driver.(interface{ Sandboxes() []driver.Sandbox })
	if !ok {
		return
	}
	first := map[string]time.Time{} // when each sandbox was first seen with no actor
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-d.ctx.Done():
			return
		case <-t.C:
		}
		d.sweepOrphansOnce(l.Sandboxes(), first, 2*every)
	}
}

func (d *Daemon) sweepOrphansOnce(sbs []driver.Sandbox, first map[string]time.Time, grace time.Duration) {
	now := time.Now()
	live := map[string]bool{}
	for _, sb := range sbs {
		id := sb.ID()
		task, epoch, ok := taskSandbox(id)
		if !ok {
			continue
		}
		live[id] = true
		d.mu.Lock()
		cur, held := d.actors[task]
		sessions := d.stats.Sessions
		d.mu.Unlock()
		if held && cur.epoch == epoch || sessions == 0 {
			delete(first, id)
			continue
		}
		if f, seen := first[id]; !seen {
			first[id] = now
			continue
		} else if now.Sub(f) < grace {
			continue
		}
		if d.leaseHere(task, epoch) {
			continue
		}
		d.log.Info("destroying a task's sandbox no actor holds: its lease moved", "task", task, "epoch", epoch, "sandbox", id)
		if err := sb.Destroy(); err != nil {
			d.log.Warn("destroy an orphaned task sandbox", "sandbox", id, "err", err)
			continue
		}
		delete(first, id)
	}
	for id := range first {
		if !live[id] {
			delete(first, id)
		}
	}
}

// destroyForeignSandboxes destroys the sandbox API's sandboxes that the
// driver re-adopted from this data directory but whose ids name another
// node: the directory last ran under another --id. Every call about them
// would go to that node (the servers route by the id), and this one
// refuses them, so they could be listed but not used or deleted, and held
// their memory until their TTL.
func (d *Daemon) destroyForeignSandboxes() {
	l, ok := d.cfg.Driver.(interface{ Sandboxes() []driver.Sandbox })
	if !ok {
		return
	}
	for _, sb := range l.Sandboxes() {
		node, err := api.SandboxNode(sb.ID())
		if err != nil || node == d.cfg.ID {
			continue // a task's sandbox, or this node's
		}
		d.log.Warn("destroying a sandbox made under another node id: this data directory last ran as that node",
			"sandbox", sb.ID(), "its_node", node, "node", d.cfg.ID)
		if err := sb.Destroy(); err != nil {
			d.log.Warn("destroy a sandbox made under another node id", "sandbox", sb.ID(), "err", err)
		}
	}
}

// leaseHere reports whether task's lease is this node's at epoch, as the
// cluster says; when it cannot tell (no server answers), true: the
// sandbox is kept for the next sweep.
func (d *Daemon) leaseHere(task string, epoch uint64) bool {
	ctx, cancel := context.WithTimeout(d.ctx, 30*time.Second)
	defer cancel()
	var t *warrenv1.Task
	err := d.cl.Read(ctx, func(ctx context.Context, tc warrenv1connect.TaskServiceClient) error {
		res, err := tc.GetTask(ctx, connect.NewRequest(&warrenv1.GetTaskRequest{Id: task}))
		if err == nil {
			t = res.Msg.GetTask()
		}
		return err
	})
	switch {
	case connect.CodeOf(err) == connect.CodeNotFound:
		return false
	case err != nil:
		return true
	}
	return !isTerminal(t.GetState()) && t.GetLease().GetNode() == d.cfg.ID && t.GetLease().GetEpoch() == epoch
}

// taskSandbox parses a task sandbox's id (TASK-eEPOCH, or
// TASK-eEPOCH-verify-ROUND; see sandboxTask).
func taskSandbox(id string) (task string, epoch uint64, ok bool) {
	task = sandboxTask(id)
	if task == "" {
		return "", 0, false
	}
	rest := strings.TrimPrefix(id, task+"-e")
	if i := strings.Index(rest, "-verify-"); i >= 0 {
		rest = rest[:i]
	}
	epoch, err := strconv.ParseUint(rest, 10, 64)
	return task, epoch, err == nil
}
