package noded

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/warrenhq/warren/agent/model"
	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
	"github.com/warrenhq/warren/guest"
	"github.com/warrenhq/warren/internal/freeaddr"
	"github.com/warrenhq/warren/netpolicy"
	"github.com/warrenhq/warren/noded/driver"
	"github.com/warrenhq/warren/noded/driver/sim"
	"github.com/warrenhq/warren/scheduler"
)

// Tests of the task actor's parts of its lifecycle: its egress batches'
// keys, its sandbox's TTL, the failures it gives up on.

// Two actors of one task under one epoch (a restart after a panic, or the
// node restarted within its TTL) each record their egress audit batches:
// the second's are not taken for retries of the first's. (Both numbered
// theirs from 1 under the request id e<epoch>/egress-<n>, and the servers
// dropped the second's as retries.)
func TestEgressOfAnotherActorIncarnationIsRecorded(t *testing.T) {
	drv := sim.New(sim.Config{})
	d, id := pendingTaskOnNode(t, drv, "egress-twice")
	ctx := context.Background()
	sb, err := drv.Claim(ctx, driver.ClaimRequest{ID: id + "-e0"})
	if err != nil {
		t.Fatal(err)
	}
	record := func(addr, from string) {
		a := &taskActor{d: d, id: id, epoch: 0, ctx: ctx, sb: sb}
		a.egressQ = []egressBatch{{b: netpolicy.AuditBatch{Events: []netpolicy.AuditEvent{{Verdict: "deny", Kind: "connect", Addr: addr, Proto: "tcp", Port: 443, Count: 1}}}, sandbox: from}}
		if err := a.recordEgress(); err != nil {
			t.Fatal(err)
		}
		if err := a.recordEgress(); err != nil { // nothing new: nothing recorded
			t.Fatal(err)
		}
	}
	record("198.51.100.1", sb.ID()) // the actor before its restart
	// The actor after it, same epoch, with a batch of a sandbox that went
	// away (sandboxGone) queued before its replacement: it names that one.
	record("198.51.100.2", id+"-gone")
	egress := egressPayloads(t, d, id)
	if len(egress) != 2 {
		t.Fatalf("two audit batches from two actors of the task, %d egress events on the log: %v", len(egress), egress)
	}
	if !strings.Contains(egress[0], `"sandbox":"`+sb.ID()+`"`) || !strings.Contains(egress[1], `"sandbox":"`+id+`-gone"`) {
		t.Errorf("each batch names the sandbox it came from: %v", egress)
	}
}

// pendingTaskOnNode starts a single server and a node daemon on drv, and
// creates a task no node takes (its driver is microvm, the node's is
// not): it stays pending, under epoch 0, and appends under that epoch
// take the same path as a leased task's.
func pendingTaskOnNode(t *testing.T, drv driver.Driver, requestID string) (*Daemon, string) {
	t.Helper()
	return taskOnNode(t, drv, nil, requestID, &warrenv1.TaskSpec{Repo: "https://example.com/r.git", Base: "main", IssueTitle: "egress", Driver: "microvm",
		Script: &warrenv1.Script{Steps: 1}})
}

// taskOnNode starts a single server, its API handler wrap(ped) if wrap is
// set, and a node daemon on drv, and creates a task of spec.
func taskOnNode(t *testing.T, drv driver.Driver, wrap func(http.Handler) http.Handler, requestID string, spec *warrenv1.TaskSpec) (*Daemon, string) {
	t.Helper()
	dir := t.TempDir()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + ln.Addr().String()
	srv, err := scheduler.Open(scheduler.Config{ID: "s1", DataDir: filepath.Join(dir, "s1"), RaftAddr: freeaddr.Loopback(t), APIURL: url,
		Bootstrap: true, SnapshotInterval: time.Hour, RaftLevel: "error", RaftLogTo: io.Discard})
	if err != nil {
		t.Fatal(err)
	}
	h := srv.Handler()
	if wrap != nil {
		h = wrap(h)
	}
	hs := &http.Server{Handler: h}
	hs.Protocols = new(http.Protocols)
	hs.Protocols.SetHTTP1(true)
	hs.Protocols.SetUnencryptedHTTP2(true)
	go hs.Serve(ln)
	t.Cleanup(func() { srv.Close(); hs.Close() })
	deadline := time.Now().Add(10 * time.Second)
	for srv.Raft().State().String() != "Leader" {
		if time.Now().After(deadline) {
			t.Fatal("no leader")
		}
		time.Sleep(20 * time.Millisecond)
	}
	d, err := Start(Config{ID: "n1", DataDir: filepath.Join(dir, "n1"), Servers: []string{url}, Driver: drv,
		Capacity: &warrenv1.Resources{MilliCpu: 1000, MemoryBytes: 1 << 30}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	for {
		resp, err := d.cl.Tasks().CreateTask(context.Background(), connect.NewRequest(&warrenv1.CreateTaskRequest{RequestId: requestID, Spec: spec}))
		if err == nil {
			return d, resp.Msg.GetTask().GetId()
		}
		if time.Now().After(deadline) {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// egressPayloads returns the payloads of the task's egress events.
func egressPayloads(t *testing.T, d *Daemon, id string) []string {
	t.Helper()
	resp, err := d.cl.Tasks().ListEvents(context.Background(), connect.NewRequest(&warrenv1.ListEventsRequest{TaskId: id, Limit: 100}))
	if err != nil {
		t.Fatal(err)
	}
	var egress []string
	for _, e := range resp.Msg.GetEvents() {
		if e.GetKind() == "egress" {
			egress = append(egress, string(e.GetPayload()))
		}
	}
	return egress
}

// The TTL a task's sandbox is claimed with covers the task: an agent
// task's remaining wall-clock budget and the finish phase's margin, at
// most the drivers' maximum; the maximum for any other task.
func TestSandboxTTL(t *testing.T) {
	created := time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)
	budget := func(s int64) *warrenv1.TaskSpec {
		return &warrenv1.TaskSpec{Budgets: &warrenv1.Budgets{MaxWallClockSeconds: s}}
	}
	for _, tc := range []struct {
		name  string
		spec  *warrenv1.TaskSpec
		agent bool
		now   time.Time
		want  time.Duration
	}{
		{"scripted", &warrenv1.TaskSpec{}, false, created, maxSandboxTTL},
		{"scripted with a budget", budget(600), false, created, maxSandboxTTL},
		{"agent without a budget", &warrenv1.TaskSpec{}, true, created, maxSandboxTTL},
		{"agent at its start", budget(3600), true, created, time.Hour + sandboxTTLMargin},
		{"agent resumed later", budget(3600), true, created.Add(45 * time.Minute), 15*time.Minute + sandboxTTLMargin},
		{"agent past its budget", budget(60), true, created.Add(time.Hour), sandboxTTLMargin},
		{"agent with a budget past the maximum", budget(48 * 3600), true, created, maxSandboxTTL},
	} {
		if got := sandboxTTL(tc.spec, tc.agent, created, tc.now); got != tc.want {
			t.Errorf("%s: TTL %v, want %v", tc.name, got, tc.want)
		}
	}
	if got := sandboxTTL(budget(60), true, time.Time{}, created); got != maxSandboxTTL {
		t.Errorf("agent without a creation time: TTL %v, want %v", got, maxSandboxTTL)
	}
}

// The actor gives up on a step that keeps failing, retry after retry for
// giveUpAfter, whatever its errors say; another step, a pause in the
// retries, or a failure of the servers (a connect error) starts the count
// over (and so does a step that goes through, in the actor).
func TestRetryStreak(t *testing.T) {
	t0 := time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)
	boom := errors.New("boom")
	type note struct {
		what  string
		err   error
		at    time.Duration
		wantN int
		wantS time.Duration
	}
	for _, tc := range []struct {
		name  string
		notes []note
	}{
		{"the same failure", []note{{"exec", boom, 0, 1, 0}, {"exec", boom, 30 * time.Second, 2, 30 * time.Second}, {"exec", boom, time.Minute, 3, time.Minute}}},
		{"another step", []note{{"exec", boom, 0, 1, 0}, {"agent step", boom, time.Second, 1, 0}}},
		{"another error of the same step", []note{{"exec", boom, 0, 1, 0}, {"exec", errors.New("bang"), time.Second, 2, time.Second}}},
		{"a pause", []note{{"exec", boom, 0, 1, 0}, {"exec", boom, streakGap + time.Second, 1, 0}}},
		{"a server's failure", []note{{"exec", boom, 0, 1, 0},
			{"record", connect.NewError(connect.CodeUnavailable, boom), time.Second, 0, 0}, {"exec", boom, 2 * time.Second, 1, 0}}},
		{"a context's end", []note{{"exec", context.Canceled, 0, 0, 0}}},
		// A model provider's outage is waited out, however long: each
		// step's gateway retries end with the same error well within a
		// minute of the last.
		{"a model provider's failure", []note{{"agent step", fmt.Errorf("model call (attempt 6 of 6): %w",
			&model.HTTPError{Provider: "anthropic", Status: 529, Type: "overloaded_error"}), 0, 0, 0}}},
	} {
		var s retryStreak
		for i, n := range tc.notes {
			if gotN, gotS := s.note(n.what, n.err, t0.Add(n.at)); gotN != n.wantN || gotS != n.wantS {
				t.Errorf("%s: note %d: (%d, %v), want (%d, %v)", tc.name, i, gotN, gotS, n.wantN, n.wantS)
			}
		}
	}
}

// A guest that answers each retry with an error of new text is given up
// on all the same: the streak keys an error from the guest on that alone,
// not on the text the guest chose. (Before, each new text started a new
// streak, and the task was retried, and logged, for good.)
func TestRetryStreakGivesUpOnAGuestThatVariesItsError(t *testing.T) {
	t0 := time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)
	var s retryStreak
	for i := range 1300 {
		err := fmt.Errorf("run the test command: %w", &guest.RemoteError{Msg: fmt.Sprintf("error number %d", i)})
		if n, span := s.note("exec", err, t0.Add(time.Duration(i)*retryAfter)); n > 1 && span >= giveUpAfter {
			return
		}
	}
	t.Fatalf("1,300 guest errors of different text, %v apart: never given up on (giveUpAfter %v)", retryAfter, giveUpAfter)
}

// A step whose error's text changes at each retry is given up on all the
// same: a checkpoint's git, replaced by the sandbox's code, can print a
// counter, and the text is not a guest.RemoteError. (Before, each new
// text started a new streak, and the task was retried, and logged, for
// good.)
func TestRetryStreakGivesUpOnAnErrorThatVaries(t *testing.T) {
	t0 := time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)
	var s retryStreak
	for i := range 1300 {
		err := fmt.Errorf("checkpoint: git add: exit 1: %d", i)
		if n, span := s.note("agent step", err, t0.Add(time.Duration(i)*retryAfter)); n > 1 && span >= giveUpAfter {
			return
		}
	}
	t.Fatalf("1,300 errors of different text, %v apart: never given up on (giveUpAfter %v)", retryAfter, giveUpAfter)
}
