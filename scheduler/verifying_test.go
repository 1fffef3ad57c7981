package scheduler

import (
	"fmt"
	"testing"
	"time"

	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
)

// A node reports the tasks whose finish step holds a verification sandbox
// beside the task's own, and placement counts each such task's needs a
// second time on that node while the report lasts. Before, a node that
// placement took for half full could be full: a task placed there then
// had no room for its own sandbox. A report naming a task whose lease is
// on another node does not count.
func TestPlacementCountsVerificationSandboxes(t *testing.T) {
	const ttl = 10 * time.Second // no stall of a loaded host downs a fake node
	n, url, hc := leadingServer(t, ttl)
	n1 := openSizedFakeNode(t, url, hc, "n1", 4)
	a := createTask(t, n, "a", "")
	if node, _ := placedOn(t, n, a); node != "n1" {
		t.Fatalf("task a placed on %s with only n1 up", node)
	}
	openSizedFakeNode(t, url, hc, "n2", 8)
	// Bin-packing prefers the fuller node: n1 (1 of 4) over n2 (0 of 8).
	b := createTask(t, n, "b", "")
	if node, _ := placedOn(t, n, b); node != "n1" {
		t.Fatalf("task b placed on %s; n1 was the fuller node with room", node)
	}
	// a and b run their tests in verification sandboxes: n1 holds 4 of
	// 4 tasks' needs.
	n1.reportVerifying(t, a, b)
	if node, _ := placedOn(t, n, createTask(t, n, "c", "")); node != "n2" {
		t.Fatalf("task c placed on %s; n1 is full with a's and b's verification sandboxes", node)
	}
	// Their tests are over: n1 has room again, and is the fuller node.
	n1.reportVerifying(t)
	if node, _ := placedOn(t, n, createTask(t, n, "d", "")); node != "n1" {
		t.Fatalf("task d placed on %s; n1 (3 of 4 once d is there) has room again", node)
	}
	// n1 names a task that is not its own (c runs on n2): not counted.
	c := ""
	tasks, _, err := n.srv.FSM().ListTasks(0, "", 100, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, tk := range tasks {
		if tk.GetSpec().GetIssueTitle() == "c" {
			c = tk.GetId()
		}
	}
	n1.reportVerifying(t, c, "01ZZZZZZZZZZZZZZZZZZZZZZZZ")
	if node, _ := placedOn(t, n, createTask(t, n, "e", "")); node != "n1" {
		t.Fatalf("task e placed on %s; n1's report named only tasks it does not run", node)
	}
}

func TestVerifyingExtra(t *testing.T) {
	const a, b, ended, other, missing = "01AAAAAAAAAAAAAAAAAAAAAAAA", "01BBBBBBBBBBBBBBBBBBBBBBBB", "01CCCCCCCCCCCCCCCCCCCCCCCC", "01DDDDDDDDDDDDDDDDDDDDDDDD", "01EEEEEEEEEEEEEEEEEEEEEEEE"
	pn := []PlacementNode{{ID: "n1", Allocated: Resources{MilliCPU: 100, MemoryBytes: 10}}, {ID: "n2"}}
	tasks := map[string]struct {
		node  string
		needs Resources
		live  bool
	}{
		a:     {"n1", Resources{1000, 1 << 30}, true},
		b:     {"n1", Resources{500, 1 << 20}, true},
		ended: {"n1", Resources{1000, 1 << 30}, false},
		other: {"n2", Resources{1000, 1 << 30}, true},
	}
	reads := 0
	lookup := func(id string) (string, Resources, bool) {
		reads++
		tk, ok := tasks[id]
		return tk.node, tk.needs, ok && tk.live
	}
	// A report is deduplicated and checked as it arrives.
	rep := verifyingReport([]string{a, b, a, ended, other, missing, "not-a-task-id", b})
	if len(rep) != 5 {
		t.Fatalf("report kept as %v: want a, b, ended, other, missing once each", rep)
	}
	extra := verifyingExtra(map[string][]string{"n1": rep, "n3": {a}}, lookup)
	addExtra(pn, extra)
	if want := (Resources{100 + 1000 + 500, 10 + 1<<30 + 1<<20}); pn[0].Allocated != want {
		t.Errorf("n1 allocated %+v, want %+v (a and b counted again; not the ended task, another node's or an unknown one)", pn[0].Allocated, want)
	}
	if pn[1].Allocated != (Resources{}) {
		t.Errorf("n2 allocated %+v: it reported nothing", pn[1].Allocated)
	}
	if reads != 6 {
		t.Errorf("%d task reads for 6 reported ids", reads)
	}
	if got := verifyingReport(nil); got != nil {
		t.Errorf("an empty report kept as %v", got)
	}
	long := make([]string, 0, maxVerifyingPerNode+5)
	for i := range maxVerifyingPerNode + 5 {
		long = append(long, fmt.Sprintf("01%024d", i))
	}
	if got := verifyingReport(long); len(got) != maxVerifyingPerNode {
		t.Errorf("a report of %d kept %d, want at most %d", len(long), len(got), maxVerifyingPerNode)
	}
	if !lostAny([]string{a, b}, []string{b}) || lostAny([]string{a}, []string{a, b}) || lostAny(nil, []string{a}) {
		t.Error("lostAny")
	}
}

// A pending task that did not fit only because of a verification sandbox
// is placed once its node stops reporting it. The end of a report changes
// no FSM state, so the placement loop, which plans again only when the
// FSM's replanGen moves, used to leave the task pending until some
// unrelated change.
func TestVerifyingEndStartsAPlacementRound(t *testing.T) {
	n, url, hc := leadingServer(t, 10*time.Second)
	n1 := openSizedFakeNode(t, url, hc, "n1", 2)
	a := createTask(t, n, "a", "")
	if node, _ := placedOn(t, n, a); node != "n1" {
		t.Fatalf("a on %s", node)
	}
	n1.reportVerifying(t, a) // n1: a + a's verification sandbox = 2 of 2
	b := createTask(t, n, "b", "")
	time.Sleep(time.Second) // rounds run every 20 ms: b had its chances
	if tk, _ := n.srv.FSM().Task(b); tk.GetState() != warrenv1.TaskState_TASK_STATE_PENDING {
		t.Fatalf("b %v while n1 is full", tk.GetState())
	}
	n1.reportVerifying(t) // the verification sandbox is gone: n1 has room for b
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if tk, _ := n.srv.FSM().Task(b); tk.GetState() == warrenv1.TaskState_TASK_STATE_PLACED {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Errorf("b still pending 5s after n1 stopped reporting a verifying (n1 has room): no round ran")
}

// A node names its verifying tasks in its hello too, so that placement
// counts them from the session's start, not from its first heartbeat.
func TestHelloReportsVerifyingTasks(t *testing.T) {
	n, url, hc := leadingServer(t, 10*time.Second)
	const id = "01HZZZZZZZZZZZZZZZZZZZZZZZ"
	openFakeNodeFrom(t, url, hc, fakeHello{id: "n1", tasks: 4, verifying: []string{id, id}}) // no heartbeat
	waitFor(t, "the hello's report", 5*time.Second, func() bool {
		v := n.srv.sess.verifyingOn()["n1"]
		return len(v) == 1 && v[0] == id
	})
}

// A node's verification sandboxes outlive its session: when the stream
// ends (a blip, a reconnect), placement still counts their room until the
// node says hello again. The report went with the session, and a task was
// placed at once onto a node still full.
func TestVerifyingOutlivesTheSession(t *testing.T) {
	n, url, hc := leadingServer(t, 10*time.Second)
	n1 := openSizedFakeNode(t, url, hc, "n1", 2)
	a := createTask(t, n, "a", "")
	if node, _ := placedOn(t, n, a); node != "n1" {
		t.Fatalf("a on %s", node)
	}
	n1.reportVerifying(t, a) // n1: a + a's verification sandbox = 2 of 2
	b := createTask(t, n, "b", "")
	time.Sleep(time.Second)
	if tk, _ := n.srv.FSM().Task(b); tk.GetState() != warrenv1.TaskState_TASK_STATE_PENDING {
		t.Fatalf("b %v while n1 is full", tk.GetState())
	}
	n1.end() // the stream ends; n1 stays ready (its TTL is 10 s)
	waitFor(t, "n1's session to end", 5*time.Second, func() bool { return n.srv.sess.get("n1") == nil })
	time.Sleep(time.Second) // rounds run every 20 ms: b had its chances
	if tk, _ := n.srv.FSM().Task(b); tk.GetState() != warrenv1.TaskState_TASK_STATE_PENDING {
		t.Fatalf("b %v on %s once n1's session ended, while n1 is still full", tk.GetState(), tk.GetLease().GetNode())
	}
	// Back with a hello that names no verification: n1 has room for b.
	openSizedFakeNode(t, url, hc, "n1", 2)
	waitFor(t, "b placed once n1 said hello without a", 5*time.Second, func() bool {
		tk, _ := n.srv.FSM().Task(b)
		return tk.GetState() == warrenv1.TaskState_TASK_STATE_PLACED
	})
}
