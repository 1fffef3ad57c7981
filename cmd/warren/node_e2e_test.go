package main

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
	"github.com/warrenhq/warren/client"
	"github.com/warrenhq/warren/internal/freeaddr"
)

// fleet is three server processes and three `warren node --driver sim`
// processes (simulated sandboxes; real sessions, heartbeats, memberlist
// and raft) on loopback.
type fleet struct {
	t       *testing.T
	servers []*proc
	nodes   []*proc
	cl      *client.Client
}

func startFleet(t *testing.T, nodes int) *fleet {
	t.Helper()
	dir := t.TempDir()
	gossip := []string{freeaddr.Loopback(t), freeaddr.Loopback(t), freeaddr.Loopback(t)}
	servers := startClusterWith(t, dir, func(i int) []string {
		return []string{"--gossip", gossip[i], "--join-gossip", strings.Join(gossip, ",")}
	})
	var urls []string
	for _, s := range servers {
		urls = append(urls, s.url())
	}
	f := &fleet{t: t, servers: servers}
	for i := 0; i < nodes; i++ {
		id := fmt.Sprintf("n%d", i+1)
		p := newProc(t, dir, id)
		p.argv = []string{"node", "--id", id, "--data", filepath.Join(dir, id), "--servers", strings.Join(urls, ","),
			"--gossip", freeaddr.Loopback(t), "--join-gossip", strings.Join(gossip, ","), "--driver", "sim",
			"--capacity", "cpu=1000,mem=1000GiB", "--labels", "zone=" + id, "--log-level", "warn"}
		p.start()
		f.nodes = append(f.nodes, p)
	}
	cl, err := client.New(strings.Join(urls, ","))
	if err != nil {
		t.Fatal(err)
	}
	f.cl = cl
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("task states: %v", f.counts())
			for _, p := range append(append([]*proc{}, f.servers...), f.nodes...) {
				t.Logf("--- %s log tail:\n%s", p.id, p.logTail())
			}
		}
	})
	waitUntil(t, "all nodes ready", 30*time.Second, func() bool {
		ns := f.nodeList()
		ready := 0
		for _, n := range ns {
			if n.GetStatus() == warrenv1.NodeStatus_NODE_STATUS_READY {
				ready++
			}
		}
		return ready == nodes
	})
	return f
}

// up returns a server process that runs (reads may go to any).
func (f *fleet) up() *proc {
	for _, p := range f.servers {
		if p.up.Load() {
			return p
		}
	}
	f.t.Fatal("no server runs")
	return nil
}

func (f *fleet) nodeList() []*warrenv1.Node {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	resp, err := f.up().cluster.ListNodes(ctx, connect.NewRequest(&warrenv1.ListNodesRequest{}))
	if err != nil {
		return nil
	}
	return resp.Msg.GetNodes()
}

func (f *fleet) node(id string) *warrenv1.Node {
	for _, n := range f.nodeList() {
		if n.GetId() == id {
			return n
		}
	}
	return nil
}

// submit creates n scripted tasks, 16 at a time.
func (f *fleet) submit(n int, script *warrenv1.Script) []string {
	f.t.Helper()
	ids := make([]string, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for i := range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			resp, err := f.cl.Tasks().CreateTask(context.Background(), connect.NewRequest(&warrenv1.CreateTaskRequest{
				RequestId: fmt.Sprint("e2e-", i), Spec: &warrenv1.TaskSpec{Repo: "https://example.com/r.git", Base: "main",
					IssueTitle: fmt.Sprint("scripted ", i), Driver: "sim", Script: script}}))
			if err != nil {
				errs[i] = err
				return
			}
			ids[i] = resp.Msg.GetTask().GetId()
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			f.t.Fatal(err)
		}
	}
	return ids
}

// counts returns how many tasks are in each state.
func (f *fleet) counts() map[warrenv1.TaskState]int {
	out := map[warrenv1.TaskState]int{}
	after := ""
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		resp, err := f.up().tasks.ListTasks(ctx, connect.NewRequest(&warrenv1.ListTasksRequest{PageSize: 1000, PageToken: after}))
		cancel()
		if err != nil {
			return nil
		}
		for _, t := range resp.Msg.GetTasks() {
			out[t.GetState()]++
		}
		if after = resp.Msg.GetNextPageToken(); after == "" {
			return out
		}
	}
}

// logs reads every task's whole log (they have all ended).
func (f *fleet) logs(ids []string) map[string][]*warrenv1.Event {
	out := make(map[string][]*warrenv1.Event, len(ids))
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for _, id := range ids {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			var evs []*warrenv1.Event
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			err := f.cl.Watch(ctx, id, 0, func(e *warrenv1.Event) error { evs = append(evs, e); return nil }, nil)
			if err != nil {
				f.t.Errorf("read %s: %v", id, err)
			}
			mu.Lock()
			out[id] = evs
			mu.Unlock()
		}()
	}
	wg.Wait()
	return out
}

// stepLog is what one task's log says about its steps.
type stepLog struct {
	effects   map[string]int // idempotency key -> times recorded
	effectBy  map[string]string
	results   map[string]int
	requeues  int
	lastState string
	ownerAt   map[uint64]string // lease epoch -> node that ran under it
	endedBy   string            // the node whose actor recorded the end
}

// checkTaskLog checks a finished task's log: gapless from 1, epochs never
// go backwards (no stale owner lands after a bump), every step has exactly
// one effect and a result, and the task succeeded.
func checkTaskLog(t *testing.T, id string, evs []*warrenv1.Event, steps int) stepLog {
	t.Helper()
	l := stepLog{effects: map[string]int{}, effectBy: map[string]string{}, results: map[string]int{}, ownerAt: map[uint64]string{}}
	var maxEpoch uint64
	for i, e := range evs {
		if e.GetSeq() != uint64(i+1) {
			t.Fatalf("task %s: event %d has seq %d: not gapless", id, i, e.GetSeq())
		}
		if e.GetEpoch() != 0 {
			if e.GetEpoch() < maxEpoch {
				t.Fatalf("task %s: seq %d under epoch %d after epoch %d was seen", id, e.GetSeq(), e.GetEpoch(), maxEpoch)
			}
			maxEpoch = e.GetEpoch()
		}
		var p map[string]any
		if err := json.Unmarshal(e.GetPayload(), &p); err != nil {
			t.Fatalf("task %s seq %d: payload: %v", id, e.GetSeq(), err)
		}
		switch e.GetKind() {
		case "effect":
			k, _ := p["idempotency_key"].(string)
			l.effects[k]++
			l.effectBy[k], _ = p["node"].(string)
		case "tool_result":
			c, _ := p["tool_call_id"].(string)
			l.results[c]++
		case "state_changed":
			l.lastState, _ = p["to"].(string)
			switch l.lastState {
			case "pending":
				l.requeues++
			case "running":
				l.ownerAt[e.GetEpoch()], _ = p["node"].(string)
			case "succeeded":
				l.endedBy = l.ownerAt[e.GetEpoch()]
			}
		}
	}
	for s := 1; s <= steps; s++ {
		if k := id + "/step-" + strconv.Itoa(s); l.effects[k] != 1 {
			t.Fatalf("task %s: effect %s recorded %d times, want exactly 1", id, k, l.effects[k])
		}
		if l.results["step-"+strconv.Itoa(s)] == 0 {
			t.Fatalf("task %s: step %d has no result", id, s)
		}
	}
	if len(l.effects) != steps || l.lastState != "succeeded" {
		t.Fatalf("task %s: %d effects (want %d), last state %q", id, len(l.effects), steps, l.lastState)
	}
	return l
}

// TestNodeKillTasksFinishElsewhere is the node daemons issue's first
// acceptance test: 300 tasks of 20 scripted steps on 3 node processes; one
// node is SIGKILLed mid-run; every task finishes, every log is gapless, no
// effect is recorded twice, and the killed node's tasks finish elsewhere.
func TestNodeKillTasksFinishElsewhere(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process run; skipped with -short")
	}
	f := startFleet(t, 3)
	const tasks, steps = 300, 20
	ids := f.submit(tasks, &warrenv1.Script{Steps: steps, StepMillis: 300, OutputBytes: 256})
	waitUntil(t, "all tasks placed", 60*time.Second, func() bool {
		c := f.counts()
		return c[warrenv1.TaskState_TASK_STATE_PENDING] == 0 && c != nil
	})
	victim := f.nodes[0]
	waitUntil(t, "the victim to run tasks", 60*time.Second, func() bool { return f.node(victim.id).GetTaskCount() >= 30 })
	time.Sleep(500 * time.Millisecond) // mid-run: some steps done, most to go
	before := f.node(victim.id).GetTaskCount()
	victim.kill()
	killed := time.Now()
	waitUntil(t, "the victim declared down", 30*time.Second, func() bool {
		return f.node(victim.id).GetStatus() == warrenv1.NodeStatus_NODE_STATUS_DOWN
	})
	t.Logf("killed %s holding %d tasks; declared down after %v", victim.id, before, time.Since(killed).Round(time.Millisecond))
	waitUntil(t, "every task to succeed", 300*time.Second, func() bool {
		c := f.counts()
		return c != nil && c[warrenv1.TaskState_TASK_STATE_SUCCEEDED] == tasks
	})
	moved := 0
	for id, evs := range f.logs(ids) {
		l := checkTaskLog(t, id, evs, steps)
		if l.requeues > 0 {
			moved++
			// (Its last step's effect may be the victim's: recorded once,
			// by whoever got there first.)
			if l.endedBy == victim.id || l.endedBy == "" {
				t.Fatalf("task %s was requeued but ended on %q, not on another node", id, l.endedBy)
			}
		}
	}
	if moved == 0 || uint32(moved) < before/2 {
		t.Fatalf("%d tasks moved after the kill; the victim held %d", moved, before)
	}
	for _, n := range f.nodeList() {
		if n.GetId() != victim.id && n.GetStatus() != warrenv1.NodeStatus_NODE_STATUS_READY {
			t.Fatalf("healthy node %s is %v", n.GetId(), n.GetStatus())
		}
	}
	t.Logf("%d tasks x %d steps finished; %d moved off the killed node", tasks, steps, moved)
}

// TestLeaderKillMarksNoNodeDown: SIGKILLing the leader mid-run declares no
// healthy node down (each node gets a fresh grace period from the new
// leader), no task is requeued, and every task still finishes.
func TestLeaderKillMarksNoNodeDown(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process run; skipped with -short")
	}
	f := startFleet(t, 3)
	const tasks, steps = 60, 30
	ids := f.submit(tasks, &warrenv1.Script{Steps: steps, StepMillis: 100})
	waitUntil(t, "tasks running", 60*time.Second, func() bool {
		c := f.counts()
		return c != nil && c[warrenv1.TaskState_TASK_STATE_RUNNING] == tasks
	})
	time.Sleep(500 * time.Millisecond)
	old := leader(f.servers)
	if old == nil {
		t.Fatal("no leader")
	}
	old.kill()
	killed := time.Now()
	waitUntil(t, "a new leader", 20*time.Second, func() bool { return leader(f.servers) != nil })
	t.Logf("killed leader %s; new leader %s after %v", old.id, leader(f.servers).id, time.Since(killed).Round(time.Millisecond))
	waitUntil(t, "every task to succeed", 60*time.Second, func() bool {
		c := f.counts()
		return c != nil && c[warrenv1.TaskState_TASK_STATE_SUCCEEDED] == tasks
	})
	for _, n := range f.nodeList() {
		if n.GetStatus() != warrenv1.NodeStatus_NODE_STATUS_READY {
			t.Fatalf("node %s is %v after the leader kill (%s)", n.GetId(), n.GetStatus(), n.GetStatusReason())
		}
	}
	for id, evs := range f.logs(ids) {
		if l := checkTaskLog(t, id, evs, steps); l.requeues != 0 {
			t.Fatalf("task %s was requeued %d times: a node was declared down", id, l.requeues)
		}
	}
}
