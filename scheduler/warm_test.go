package scheduler

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/hashicorp/raft"

	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
	"github.com/warrenhq/warren/api/gen/warren/v1/warrenv1connect"
)

// warmOf returns the warm counts placement would use for node.
func (h *sessions) warmOf(node string) map[string]int {
	pn := []PlacementNode{{ID: node}}
	h.fillWarm(pn)
	return pn[0].WarmTemplates
}

// serveH2C serves n's API on a second listener that also speaks
// cleartext HTTP/2, which node sessions (bidirectional streams) need, and
// returns its URL and a client for it.
func serveH2C(t *testing.T, n *node) (string, *http.Client) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: n.srv.Handler(), Protocols: new(http.Protocols)}
	hs.Protocols.SetHTTP1(true)
	hs.Protocols.SetUnencryptedHTTP2(true)
	go hs.Serve(ln)
	tr := &http.Transport{Protocols: new(http.Protocols)}
	tr.Protocols.SetUnencryptedHTTP2(true)
	t.Cleanup(func() {
		hs.Close()
		tr.CloseIdleConnections()
	})
	return "http://" + ln.Addr().String(), &http.Client{Transport: tr}
}

// leadingServer starts a one-server cluster that declares nodes down after
// ttl, waits until it leads, and serves its API for node sessions
// (serveH2C).
func leadingServer(t *testing.T, ttl time.Duration) (*node, string, *http.Client) {
	t.Helper()
	n := startNode(t, t.TempDir(), "s1", true, "", 0, func(c *Config) { c.NodeTTL = ttl })
	waitFor(t, "s1 to lead", 10*time.Second, func() bool { return n.srv.Raft().State() == raft.Leader })
	url, hc := serveH2C(t, n)
	return n, url, hc
}

// fakeNode is a node daemon's end of a session, driven by the test: it
// says hello, then heartbeats every 50 ms with the warm counts set on it
// until told to stop, and reads whatever the leader sends.
type fakeNode struct {
	id      string
	stream  *connect.BidiStreamForClient[warrenv1.SessionRequest, warrenv1.SessionResponse]
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	mu      sync.Mutex
	warm    map[string]uint32
	verify  []string // the tasks reported verifying
	pools   []string // the pool messages the leader sent: "T=N" ("T=N resend"), or "set:T=N,..." for a complete set
	stops   []string // the tasks the leader told to stop
	beating bool
	seq     uint64        // last heartbeat sent
	acked   atomic.Uint64 // last heartbeat the leader acknowledged
}

func openFakeNode(t *testing.T, url string, hc *http.Client, id string, templates ...string) *fakeNode {
	t.Helper()
	return openSizedFakeNode(t, url, hc, id, 8, templates...)
}

// openSizedFakeNode is openFakeNode for a node with room for tasks tasks
// of the default needs.
func openSizedFakeNode(t *testing.T, url string, hc *http.Client, id string, tasks int64, templates ...string) *fakeNode {
	t.Helper()
	return openFakeNodeFrom(t, url, hc, fakeHello{id: id, tasks: tasks, templates: templates, beating: true})
}

// fakeHello is how a fake node opens its session.
type fakeHello struct {
	id        string
	tasks     int64 // room for that many tasks of the default needs
	templates []string
	verifying []string // named in the hello
	beating   bool     // heartbeats from the start
	running   []*warrenv1.RunningTask
}

func openFakeNodeFrom(t *testing.T, url string, hc *http.Client, h fakeHello) *fakeNode {
	t.Helper()
	id, tasks, templates := h.id, h.tasks, h.templates
	ctx, cancel := context.WithCancel(context.Background())
	f := &fakeNode{id: id, cancel: cancel, beating: h.beating}
	f.stream = warrenv1connect.NewNodeServiceClient(hc, url).Session(ctx)
	t.Cleanup(f.end)
	if err := f.stream.Send(&warrenv1.SessionRequest{Msg: &warrenv1.SessionRequest_Hello{Hello: &warrenv1.Hello{
		Node: &warrenv1.Node{Id: id, Drivers: []string{"sim"}, Templates: templates,
			Capacity: &warrenv1.Resources{MilliCpu: tasks * DefaultTaskMilliCPU, MemoryBytes: tasks * DefaultTaskMemoryBytes}},
		Incarnation: "test", Verifying: h.verifying, Running: h.running}}}); err != nil {
		t.Fatal(err)
	}
	m, err := f.stream.Receive()
	if err != nil || m.GetWelcome() == nil {
		t.Fatalf("%s: no welcome: %v %v", id, m, err)
	}
	f.wg.Add(2)
	go func() {
		defer f.wg.Done()
		for {
			m, err := f.stream.Receive()
			if err != nil {
				return
			}
			if a := m.GetAck(); a != nil {
				f.acked.Store(a.GetSeq())
			}
			if st := m.GetStop(); st != nil {
				f.mu.Lock()
				f.stops = append(f.stops, st.GetTaskId())
				f.mu.Unlock()
			}
			if p := m.GetSetPoolTarget(); p != nil {
				f.mu.Lock()
				m := fmt.Sprintf("%s=%d", p.GetTemplate(), p.GetTarget())
				if p.GetResend() {
					m += " resend"
				}
				f.pools = append(f.pools, m)
				f.mu.Unlock()
			}
			if all := m.GetPoolTargets(); all != nil {
				var ts []string
				for _, p := range all.GetTargets() {
					ts = append(ts, fmt.Sprintf("%s=%d", p.GetTemplate(), p.GetTarget()))
				}
				f.mu.Lock()
				f.pools = append(f.pools, "set:"+strings.Join(ts, ","))
				f.mu.Unlock()
			}
		}
	}()
	go func() {
		defer f.wg.Done()
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			f.mu.Lock()
			if !f.beating {
				f.mu.Unlock()
				continue
			}
			f.seq++
			hb := &warrenv1.Heartbeat{Seq: f.seq, Warm: f.warm, Verifying: f.verify}
			f.mu.Unlock()
			if f.stream.Send(&warrenv1.SessionRequest{Msg: &warrenv1.SessionRequest_Heartbeat{Heartbeat: hb}}) != nil {
				return
			}
		}
	}()
	return f
}

// report makes the node's heartbeats carry warm from now on, and waits
// until the leader acknowledged one of them: the leader has read it.
func (f *fakeNode) report(t *testing.T, warm map[string]uint32) {
	t.Helper()
	f.mu.Lock()
	f.warm = warm
	from := f.seq + 1
	f.mu.Unlock()
	waitFor(t, fmt.Sprintf("the leader to acknowledge a heartbeat of %s reporting %v", f.id, warm), 10*time.Second,
		func() bool { return f.acked.Load() >= from })
}

// reportVerifying makes the node's heartbeats name tasks as holding a
// verification sandbox from now on, and waits until the leader
// acknowledged one of them.
func (f *fakeNode) reportVerifying(t *testing.T, tasks ...string) {
	t.Helper()
	f.mu.Lock()
	f.verify = tasks
	from := f.seq + 1
	f.mu.Unlock()
	waitFor(t, fmt.Sprintf("the leader to acknowledge a heartbeat of %s reporting %v verifying", f.id, tasks), 10*time.Second,
		func() bool { return f.acked.Load() >= from })
}

// silence stops the heartbeats but keeps the stream open.
func (f *fakeNode) silence() {
	f.mu.Lock()
	f.beating = false
	f.mu.Unlock()
}

// end closes the session from the node's side.
func (f *fakeNode) end() {
	f.cancel()
	f.stream.CloseRequest()
	f.stream.CloseResponse()
	f.wg.Wait()
}

// placedOn waits for task id to be placed and returns its node and
// whether the placement counted on a warm sandbox.
func placedOn(t *testing.T, n *node, id string) (string, bool) {
	t.Helper()
	waitFor(t, "task "+id+" to be placed", 10*time.Second, func() bool {
		tk, err := n.srv.FSM().Task(id)
		return err == nil && tk.GetState() == warrenv1.TaskState_TASK_STATE_PLACED
	})
	tk, _ := n.srv.FSM().Task(id)
	evs, err := n.srv.FSM().Events(id, 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	warm := false
	for _, ev := range evs {
		if ev.GetKind() == KindStateChanged && strings.Contains(string(ev.GetPayload()), `"warm":true`) {
			warm = true
		}
	}
	return tk.GetLease().GetNode(), warm
}

func createTask(t *testing.T, n *node, title, template string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := n.tasks.CreateTask(ctx, connect.NewRequest(&warrenv1.CreateTaskRequest{Spec: &warrenv1.TaskSpec{
		Repo: "https://example.com/r.git", Base: "main", IssueTitle: title, Driver: "sim", Template: template}}))
	if err != nil {
		t.Fatal(err)
	}
	return r.Msg.GetTask().GetId()
}

// Nodes report their warm sandboxes per template in their heartbeats and
// the leader places a task where one of its template waits, a task
// without a template where one of the default template waits. Before,
// nobody filled PlacementNode.WarmTemplates in production: the task went
// where bin-packing put it (the first of equal nodes, the fuller one) and
// its claim restored a snapshot (~230 ms) instead of taking a warm
// sandbox (~15 ms). A task placed and not started counts against its
// node's report. When the session of a node ends, or the node is declared
// down, its counts are gone.
func TestPlacementFollowsHeartbeatWarmCounts(t *testing.T) {
	const ttl = 2 * time.Second // long enough that a loaded host's stall downs no node
	n, url, hc := leadingServer(t, ttl)
	n1 := openFakeNode(t, url, hc, "n1", "py")
	n2 := openFakeNode(t, url, hc, "n2", "py")

	// Equal, empty nodes: without warm counts the tie goes to n1.
	n2.report(t, map[string]uint32{"py": 1})
	if node, warm := placedOn(t, n, createTask(t, n, "py task", "py")); node != "n2" || !warm {
		t.Fatalf("a py task was placed on %s (warm %v); n2 reported the only warm py sandbox", node, warm)
	}
	// That task has not started (this node runs nothing), so n2's report
	// predates its claim, which will take the warm sandbox: the next py
	// task counts on none, and goes to n2 only as the fuller node.
	if node, warm := placedOn(t, n, createTask(t, n, "py task 2", "py")); warm {
		t.Fatalf("a second py task was placed on %s counting on a warm sandbox; n2's one is promised to the first", node)
	}
	// n2 is the fuller node now, which bin-packing prefers; n1 holds a
	// warm sandbox of the default template, which a task naming no
	// template runs.
	n1.report(t, map[string]uint32{DefaultTemplate: 1})
	if node, warm := placedOn(t, n, createTask(t, n, "plain task", "")); node != "n1" || !warm {
		t.Fatalf("a task without a template was placed on %s (warm %v); n1 reported the only warm %q sandbox", node, warm, DefaultTemplate)
	}

	// The session of n2 ends: its counts go with it, at once (n2 stays
	// ready in the FSM until its TTL passes).
	if w := n.srv.sess.warmOf("n2"); w["py"] != 1 {
		t.Fatalf("before its session ended, the leader had n2's warm counts as %v", w)
	}
	n2.end()
	waitFor(t, "n2's warm counts to go with its session", 5*time.Second, func() bool { return n.srv.sess.warmOf("n2") == nil })

	// n1 falls silent and is declared down: its counts are gone too.
	if w := n.srv.sess.warmOf("n1"); w[DefaultTemplate] != 1 {
		t.Fatalf("before it fell silent, the leader had n1's warm counts as %v", w)
	}
	n1.silence()
	waitFor(t, "n1 to be declared down", 10*time.Second, func() bool {
		nd, err := n.srv.FSM().Node("n1")
		return err == nil && nd.GetStatus() == warrenv1.NodeStatus_NODE_STATUS_DOWN
	})
	waitFor(t, "n1's warm counts to go once it is down", 5*time.Second, func() bool { return n.srv.sess.warmOf("n1") == nil })
}

// The leader's view of warm counts: only an attached, open session's
// last heartbeat counts; one cut (declared down), detached (ended or
// replaced by a new hello) or dropped by a change of leader counts no
// more, nor does a heartbeat read after its session was detached.
func TestSessionsWarmCounts(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	h := newSessions()
	h.lead(t0)
	newSession := func(node string) *session { return &session{node: node, closed: make(chan struct{})} }
	a := newSession("n1")
	// A heartbeat read while the node registers, before the attach.
	h.heard(a, t0, warmCounts(map[string]uint32{"py": 2, "go": 0}), nil)
	if w := h.warmOf("n1"); w != nil {
		t.Fatalf("counts of a session not attached yet are used: %v", w)
	}
	h.attach(a, t0)
	if w := h.warmOf("n1"); len(w) != 1 || w["py"] != 2 {
		t.Fatalf("after the attach: %v, want map[py:2]", w)
	}
	h.heard(a, t0, warmCounts(nil), nil)
	if w := h.warmOf("n1"); w != nil {
		t.Fatalf("a heartbeat reporting no warm sandboxes left %v", w)
	}
	h.heard(a, t0, warmCounts(map[string]uint32{"py": 1}), nil)
	a.close() // declareDown cuts the session; the handler detaches it later
	if w := h.warmOf("n1"); w != nil {
		t.Fatalf("a cut session's counts are used: %v", w)
	}
	h.detach(a)
	h.heard(a, t0, warmCounts(map[string]uint32{"py": 3}), nil) // read late
	if w := h.warmOf("n1"); w != nil {
		t.Fatalf("a detached session's counts are used: %v", w)
	}
	// A new hello replaces the session: the old one's counts do not carry
	// over.
	b := newSession("n1")
	h.attach(b, t0)
	h.heard(b, t0, warmCounts(map[string]uint32{"go": 1}), nil)
	c := newSession("n1")
	h.attach(c, t0)
	if w := h.warmOf("n1"); w != nil {
		t.Fatalf("a new session starts with the old one's counts: %v", w)
	}
	h.heard(c, t0, warmCounts(map[string]uint32{"go": 4}), nil)
	h.lead(time.Time{})
	if w := h.warmOf("n1"); w != nil {
		t.Fatalf("counts survive the loss of leadership: %v", w)
	}
}

func TestSameWarm(t *testing.T) {
	for _, tc := range []struct {
		have map[string]int
		w    map[string]uint32
		same bool
	}{
		{nil, nil, true},
		{nil, map[string]uint32{"py": 0}, true},
		{map[string]int{"py": 1}, map[string]uint32{"py": 1, "go": 0}, true},
		{map[string]int{"py": 1}, map[string]uint32{"py": 2}, false},
		{map[string]int{"py": 1}, nil, false},
		{nil, map[string]uint32{"py": 1}, false},
		{map[string]int{"py": 1, "go": 1}, map[string]uint32{"py": 1}, false},
		{map[string]int{"py": 1}, map[string]uint32{"py": 1, "go": 1}, false},
	} {
		if got := sameWarm(tc.have, tc.w); got != tc.same {
			t.Errorf("sameWarm(%v, %v) = %v, want %v", tc.have, tc.w, got, tc.same)
		}
		if got, want := warmCounts(tc.w), tc.have; tc.same && fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("warmCounts(%v) = %v, want %v", tc.w, got, want)
		}
	}
}

// Tasks placed and not started yet count against their node's warm
// sandboxes of the template they claim; the session's map is left as it
// was.
func TestDiscountStarting(t *testing.T) {
	shared := map[string]int{"py": 2, "default": 1, "go": 1}
	pn := []PlacementNode{{ID: "a", WarmTemplates: shared}, {ID: "b", WarmTemplates: shared}, {ID: "c"}}
	discountStarting(pn, map[nodeTemplate]int{
		{"a", "py"}: 1, {"a", "default"}: 3, // more than reported: none left
		{"c", "py"}:   1, // nothing reported
		{"b", "node"}: 1,
	})
	if got, want := fmt.Sprint(pn[0].WarmTemplates), "map[go:1 py:1]"; got != want {
		t.Errorf("a: %s, want %s", got, want)
	}
	if got, want := fmt.Sprint(pn[1].WarmTemplates), "map[default:1 go:1 py:2]"; got != want {
		t.Errorf("b, with nothing of its templates starting: %s, want %s", got, want)
	}
	if pn[2].WarmTemplates != nil {
		t.Errorf("c: %v, want nil", pn[2].WarmTemplates)
	}
	if got, want := fmt.Sprint(shared), "map[default:1 go:1 py:2]"; got != want {
		t.Errorf("the session's map became %s", got)
	}
}
