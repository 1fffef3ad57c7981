package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
	"github.com/warrenhq/warren/internal/testenv"
)

// ack is one acknowledged event: where the log put it.
type ack struct {
	task   string
	seq    uint64
	marker string
}

// writeWithRetry sends one write with a fixed request id, moving to
// another live server on failure, until it is acknowledged or the deadline
// passes. Returns the seq the log assigned.
func writeWithRetry(ctx context.Context, procs []*proc, start int, write func(p *proc) (uint64, error)) (uint64, error) {
	var last error
	for i := 0; ; i++ {
		p := procs[(start+i)%len(procs)]
		if p.up.Load() {
			seq, err := write(p)
			if err == nil {
				return seq, nil
			}
			last = err
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("gave up: %w", last)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// TestClusterSurvivesLeaderKill is acceptance 2 of the foundation issue:
// three server processes, 100 tasks, 10,000 events written concurrently
// through all three, the leader SIGKILLed midway; every acknowledged event
// is present exactly once, in order, with gapless seqs, on every server,
// including the killed one after it restarts and catches up.
func TestClusterSurvivesLeaderKill(t *testing.T) {
	if testing.Short() {
		t.Skip("starts three server processes")
	}
	procs := startCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	const nTasks, nEvents, writers = 100, 10000, 48
	tasks := createTasks(t, ctx, procs, nTasks, "e2e")

	var (
		next   atomic.Int64 // events handed out
		acked  atomic.Int64
		mu     sync.Mutex
		acks   []ack
		failed []error
		killed = make(chan *proc, 1)
		wg     sync.WaitGroup
	)
	live := func() []*proc { return procs }
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for {
				n := next.Add(1)
				if n > nEvents {
					return
				}
				task := tasks[rand.IntN(nTasks)]
				marker := fmt.Sprintf("w%d-e%d", w, n)
				reqID := "req-" + marker
				seq, err := writeWithRetry(ctx, live(), int(n), func(p *proc) (uint64, error) {
					cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
					defer cancel()
					if n%2 == 0 {
						r, err := p.tasks.SendMessage(cctx, connect.NewRequest(&warrenv1.SendMessageRequest{TaskId: task, Text: marker, RequestId: reqID}))
						if err != nil {
							return 0, err
						}
						return r.Msg.GetSeq(), nil
					}
					r, err := p.tasks.AppendEvents(cctx, connect.NewRequest(&warrenv1.AppendEventsRequest{
						TaskId: task, RequestId: reqID,
						Events: []*warrenv1.EventInput{{Kind: "log", Payload: []byte(fmt.Sprintf(`{"marker":%q}`, marker))}},
					}))
					if err != nil {
						return 0, err
					}
					return r.Msg.GetFirstSeq(), nil
				})
				mu.Lock()
				if err != nil {
					failed = append(failed, fmt.Errorf("%s: %w", marker, err))
				} else {
					acks = append(acks, ack{task, seq, marker})
				}
				mu.Unlock()
				if acked.Add(1) == nEvents/2 {
					l := leader(live())
					if l != nil {
						l.kill()
						killed <- l
					}
				}
			}
		}(w)
	}
	wg.Wait()
	var victim *proc
	select {
	case victim = <-killed:
		t.Logf("SIGKILLed leader %s after %d acknowledged events", victim.id, nEvents/2)
	default:
		t.Fatal("no leader was killed")
	}
	if len(failed) > 0 {
		t.Fatalf("%d writes never acknowledged, e.g. %v", len(failed), failed[0])
	}
	if len(acks) != nEvents {
		t.Fatalf("%d acks, want %d", len(acks), nEvents)
	}

	// Restart the killed server; end every task so streams terminate.
	victim.start()
	endTasks(t, ctx, live(), tasks)
	byTask := map[string]map[uint64]string{}
	for _, a := range acks {
		if byTask[a.task] == nil {
			byTask[a.task] = map[uint64]string{}
		}
		if prev, dup := byTask[a.task][a.seq]; dup {
			t.Fatalf("seq %d of %s acknowledged twice: %s and %s", a.seq, a.task, prev, a.marker)
		}
		byTask[a.task][a.seq] = a.marker
	}
	var reference map[string][]string
	for _, p := range procs {
		got := readAll(t, ctx, p, tasks)
		checkLog(t, p.id, got, byTask)
		if reference == nil {
			reference = got
			continue
		}
		for _, id := range tasks {
			if strings.Join(got[id], "|") != strings.Join(reference[id], "|") {
				t.Fatalf("%s and %s disagree on task %s", procs[0].id, p.id, id)
			}
		}
	}
}

// TestPositionedAppendsSurviveLeaderKill: writers that each own a task
// and append at the seq they expect (expected_seq, no idempotency record)
// retry through a leader SIGKILL; every task's log holds each writer's
// events exactly once, in the writer's order, on every server.
func TestPositionedAppendsSurviveLeaderKill(t *testing.T) {
	if testing.Short() {
		t.Skip("starts three server processes")
	}
	procs := startCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	const nTasks, each = 24, 60
	tasks := createTasks(t, ctx, procs, nTasks, "pos")
	var (
		acked  atomic.Int64
		killed = make(chan *proc, 1)
		wg     sync.WaitGroup
		errs   = make([]error, nTasks)
	)
	for w := range nTasks {
		wg.Go(func() {
			next := uint64(2) // 1 is task_created
			for n := range each {
				marker := fmt.Sprintf("t%d-n%d", w, n)
				// Every try is the same append: same request id, same seq.
				req := &warrenv1.AppendEventsRequest{TaskId: tasks[w], RequestId: "pos-" + marker, ExpectedSeq: next,
					Events: []*warrenv1.EventInput{{Kind: "log", Payload: []byte(fmt.Sprintf(`{"marker":%q}`, marker))}}}
				var r *connect.Response[warrenv1.AppendEventsResponse]
				var err error
				for try := 0; ; try++ {
					p := procs[(w+n+try)%3]
					if p.up.Load() {
						cctx, ccancel := context.WithTimeout(ctx, 10*time.Second)
						r, err = p.tasks.AppendEvents(cctx, connect.NewRequest(req))
						ccancel()
						if err == nil || connect.CodeOf(err) == connect.CodeFailedPrecondition || ctx.Err() != nil {
							break
						}
					}
					time.Sleep(50 * time.Millisecond)
				}
				if err != nil {
					errs[w] = fmt.Errorf("%s at seq %d: %w", marker, next, err)
					return
				}
				if r.Msg.GetFirstSeq() != next || r.Msg.GetLastSeq() != next {
					errs[w] = fmt.Errorf("%s: acknowledged at %d..%d, want %d", marker, r.Msg.GetFirstSeq(), r.Msg.GetLastSeq(), next)
					return
				}
				next++
				if acked.Add(1) == nTasks*each/2 {
					if l := leader(procs); l != nil {
						l.kill()
						killed <- l
					}
				}
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	var victim *proc
	select {
	case victim = <-killed:
		t.Logf("SIGKILLed leader %s after %d acknowledged appends", victim.id, nTasks*each/2)
	default:
		t.Fatal("no leader was killed")
	}
	victim.start()
	endTasks(t, ctx, procs, tasks)
	for _, p := range procs {
		got := readAll(t, ctx, p, tasks)
		for w, id := range tasks {
			logs := got[id]
			if len(logs) < each+1 {
				t.Fatalf("%s: task %s has %d events, want at least %d", p.id, id, len(logs), each+1)
			}
			for n := range each {
				if want := fmt.Sprintf("log:t%d-n%d", w, n); logs[n+1] != want {
					t.Fatalf("%s: task %s seq %d is %q, want %q", p.id, id, n+2, logs[n+1], want)
				}
			}
			for _, m := range logs[each+1:] {
				if strings.HasPrefix(m, "log:") {
					t.Fatalf("%s: task %s has %q after the writer's last append", p.id, id, m)
				}
			}
		}
	}
}

// createTasks creates n tasks, spread over the servers, with request ids
// prefix-0, prefix-1, ….
func createTasks(t *testing.T, ctx context.Context, procs []*proc, n int, prefix string) []string {
	t.Helper()
	tasks := make([]string, n)
	for i := range tasks {
		p := procs[i%len(procs)]
		resp, err := p.tasks.CreateTask(ctx, connect.NewRequest(&warrenv1.CreateTaskRequest{
			RequestId: fmt.Sprintf("%s-%d", prefix, i),
			Spec:      &warrenv1.TaskSpec{Repo: "https://example.com/r.git", Base: "main", IssueTitle: fmt.Sprint("task ", i)},
		}))
		if err != nil {
			t.Fatalf("create via %s: %v", p.id, err)
		}
		tasks[i] = resp.Msg.GetTask().GetId()
	}
	return tasks
}

// endTasks cancels every task, retrying across the servers, so that
// streams of their logs end.
func endTasks(t *testing.T, ctx context.Context, procs []*proc, tasks []string) {
	t.Helper()
	for _, id := range tasks {
		if _, err := writeWithRetry(ctx, procs, 0, func(p *proc) (uint64, error) {
			_, err := p.tasks.CancelTask(ctx, connect.NewRequest(&warrenv1.CancelTaskRequest{TaskId: id, RequestId: "end-" + id}))
			return 0, err
		}); err != nil {
			t.Fatal(err)
		}
	}
}

// readAll streams every task's whole log from one server. Tasks are
// terminal, so each stream ends by itself once the server has caught up.
func readAll(t *testing.T, ctx context.Context, p *proc, tasks []string) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for _, id := range tasks {
		var markers []string
		var after uint64
		for attempt := 0; ; attempt++ {
			sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			stream, err := p.tasks.StreamEvents(sctx, connect.NewRequest(&warrenv1.StreamEventsRequest{TaskId: id, AfterSeq: after}))
			if err == nil {
				for stream.Receive() {
					ev := stream.Msg().GetEvent()
					if ev.GetSeq() != after+1 {
						t.Fatalf("%s: task %s: seq %d after %d", p.id, id, ev.GetSeq(), after)
					}
					after = ev.GetSeq()
					markers = append(markers, eventMarker(ev))
				}
				err = stream.Err()
				stream.Close()
			}
			cancel()
			if err == nil {
				break
			}
			if attempt > 100 {
				t.Fatalf("%s: stream %s: %v\n%s", p.id, id, err, p.logTail())
			}
			time.Sleep(100 * time.Millisecond) // restarted server still starting
		}
		out[id] = markers
	}
	return out
}

func eventMarker(ev *warrenv1.Event) string {
	var p struct {
		Marker string `json:"marker"`
		Text   string `json:"text"`
	}
	_ = json.Unmarshal(ev.GetPayload(), &p)
	return ev.GetKind() + ":" + p.Marker + p.Text
}

// checkLog: every acknowledged event sits at its acknowledged seq, and no
// marker appears twice.
func checkLog(t *testing.T, server string, got map[string][]string, acked map[string]map[uint64]string) {
	t.Helper()
	total := 0
	for task, seqs := range acked {
		markers := got[task]
		seen := map[string]bool{}
		for _, m := range markers {
			if strings.HasSuffix(m, ":") {
				continue // events without a marker (task_created, cancel…)
			}
			if seen[m] {
				t.Fatalf("%s: task %s has %q twice", server, task, m)
			}
			seen[m] = true
		}
		for seq, marker := range seqs {
			if int(seq) > len(markers) || !strings.HasSuffix(markers[seq-1], ":"+marker) {
				have := "nothing"
				if int(seq) <= len(markers) {
					have = markers[seq-1]
				}
				t.Fatalf("%s: task %s seq %d is %s, want acknowledged %s", server, task, seq, have, marker)
			}
			total++
		}
	}
	t.Logf("%s: all %d acknowledged events present exactly once, gapless", server, total)
}

// TestSSEResumesAcrossLeaderKill is acceptance 4: `curl -N` on the SSE
// endpoint, resumed with Last-Event-ID on another server after the leader
// is killed, sees every event exactly once and in order.
func TestSSEResumesAcrossLeaderKill(t *testing.T) {
	if testing.Short() {
		t.Skip("starts three server processes")
	}
	curl, err := exec.LookPath("curl")
	if err != nil {
		testenv.Missing(t, "curl is not installed (.ci/run installs it)")
	}
	procs := startCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	resp, err := procs[1].tasks.CreateTask(ctx, connect.NewRequest(&warrenv1.CreateTaskRequest{
		RequestId: "sse", Spec: &warrenv1.TaskSpec{Repo: "https://example.com/r.git", Base: "main", IssueTitle: "sse"},
	}))
	if err != nil {
		t.Fatal(err)
	}
	id := resp.Msg.GetTask().GetId()
	victim := leader(procs)
	var rest []*proc
	for _, p := range procs {
		if p != victim {
			rest = append(rest, p)
		}
	}

	// A writer appends through the survivors, steadily, until told to stop.
	stop := make(chan struct{})
	writerDone := make(chan int)
	go func() {
		n := 0
		for {
			select {
			case <-stop:
				writerDone <- n
				return
			case <-time.After(10 * time.Millisecond):
			}
			n++
			_, err := writeWithRetry(ctx, rest, n, func(p *proc) (uint64, error) {
				r, err := p.tasks.AppendEvents(ctx, connect.NewRequest(&warrenv1.AppendEventsRequest{
					TaskId: id, RequestId: fmt.Sprint("sse-", n),
					Events: []*warrenv1.EventInput{{Kind: "log", Payload: []byte(fmt.Sprintf(`{"marker":"m%d"}`, n))}},
				}))
				if err != nil {
					return 0, err
				}
				return r.Msg.GetFirstSeq(), nil
			})
			if err != nil {
				t.Error(err)
			}
		}
	}()

	var seqs []uint64
	var ended bool
	markers := map[string]int{} // the writer's markers, from the events' data
	var curID uint64            // the id line the next data line belongs to
	// First connection: to the leader, which dies under it.
	runCurl := func(p *proc, lastID uint64, onEvent func(seq uint64)) {
		args := []string{"-sN", "--max-time", "120", p.url() + "/v1/tasks/" + id + "/events"}
		if lastID > 0 {
			args = append(args, "-H", "Last-Event-ID: "+strconv.FormatUint(lastID, 10))
		}
		cmd := exec.CommandContext(ctx, curl, args...)
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			switch {
			case strings.HasPrefix(line, "id: "):
				seq, err := strconv.ParseUint(strings.TrimPrefix(line, "id: "), 10, 64)
				if err != nil {
					t.Errorf("bad id line %q", line)
				}
				curID = seq
				onEvent(seq)
			case strings.HasPrefix(line, "data: ") && curID > 0:
				// The data is the event whose id precedes it.
				var ev struct {
					Seq     uint64 `json:"seq"`
					Kind    string `json:"kind"`
					Payload struct {
						Marker string `json:"marker"`
					} `json:"payload"`
				}
				if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &ev); err != nil || ev.Seq != curID {
					t.Errorf("data after id %d: seq %d, %v: %q", curID, ev.Seq, err, line)
				}
				if ev.Kind == "log" {
					markers[ev.Payload.Marker]++
				}
				curID = 0
			case line == "event: end":
				ended = true
			}
		}
		_, _ = io.Copy(io.Discard, out)
		_ = cmd.Wait()
	}
	// Beside curl, `warren task watch` with every server, the leader first:
	// it reconnects on its own and exits when the task ends.
	urls := []string{victim.url()}
	for _, p := range rest {
		urls = append(urls, p.url())
	}
	var watchOut, watchErr bytes.Buffer
	watch := exec.CommandContext(ctx, warrenBin, "task", "watch", id, "-o", "json", "--server", strings.Join(urls, ","))
	watch.Stdout, watch.Stderr = &watchOut, &watchErr
	if err := watch.Start(); err != nil {
		t.Fatal(err)
	}
	killedAt := make(chan uint64, 1)
	runCurl(victim, 0, func(seq uint64) {
		seqs = append(seqs, seq)
		if seq == 100 {
			go func() { victim.kill(); killedAt <- seq }()
		}
	})
	select {
	case at := <-killedAt:
		t.Logf("leader %s killed while curl was at id %d; curl got %d events before its connection dropped", victim.id, at, len(seqs))
	case <-time.After(time.Minute):
		t.Fatal("the first stream ended before the leader was killed")
	}
	// Resume on a survivor with Last-Event-ID while the writer goes on,
	// then end the task so the stream finishes.
	written := make(chan int, 1)
	go func() {
		time.Sleep(2 * time.Second)
		close(stop)
		n := <-writerDone
		written <- n
		t.Logf("writer appended %d events", n)
		if _, err := writeWithRetry(ctx, rest, 0, func(p *proc) (uint64, error) {
			_, err := p.tasks.CancelTask(ctx, connect.NewRequest(&warrenv1.CancelTaskRequest{TaskId: id, RequestId: "sse-end"}))
			return 0, err
		}); err != nil {
			t.Error(err)
		}
	}()
	runCurl(rest[0], seqs[len(seqs)-1], func(seq uint64) { seqs = append(seqs, seq) })
	if !ended {
		t.Fatal("the resumed stream did not end with `event: end`")
	}
	for i, s := range seqs {
		if s != uint64(i+1) {
			t.Fatalf("SSE ids not gapless and unique: position %d has id %d (previous %v)", i, s, seqs[max(0, i-3):i])
		}
	}
	final, err := rest[0].tasks.GetTask(ctx, connect.NewRequest(&warrenv1.GetTaskRequest{Id: id}))
	if err != nil {
		t.Fatal(err)
	}
	if want := final.Msg.GetTask().GetNextSeq() - 1; uint64(len(seqs)) != want {
		t.Fatalf("curl saw %d events, the log has %d", len(seqs), want)
	}
	t.Logf("curl saw all %d events exactly once across the leader kill", len(seqs))
	// And each acknowledged append's data, once: the events' contents, not
	// only their ids.
	n := <-written
	for i := 1; i <= n; i++ {
		if c := markers[fmt.Sprint("m", i)]; c != 1 {
			t.Errorf("curl saw append m%d's data %d times, want once", i, c)
		}
	}
	if len(markers) != n {
		t.Errorf("curl saw %d distinct markers, the writer appended %d", len(markers), n)
	}

	// The watch ended with the task (exit status 2: it was cancelled) and
	// printed every event once, in order.
	werr := watch.Wait()
	var exit *exec.ExitError
	if !errors.As(werr, &exit) || exit.ExitCode() != 2 {
		t.Fatalf("task watch ended with %v, want exit status 2 (cancelled); stderr:\n%s", werr, watchErr.String())
	}
	lines := strings.Split(strings.TrimSpace(watchOut.String()), "\n")
	for i, l := range lines {
		var ev struct {
			Seq uint64 `json:"seq"`
		}
		if err := json.Unmarshal([]byte(l), &ev); err != nil || ev.Seq != uint64(i+1) {
			t.Fatalf("task watch line %d: %q (%v); want seq %d", i, l, err, i+1)
		}
	}
	if uint64(len(lines)) != final.Msg.GetTask().GetNextSeq()-1 {
		t.Fatalf("task watch printed %d events, the log has %d", len(lines), final.Msg.GetTask().GetNextSeq()-1)
	}
	t.Logf("task watch printed all %d events exactly once across the leader kill", len(lines))
}
