package client_test

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"

	"connectrpc.com/connect"

	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
	"github.com/warrenhq/warren/client"
)

// devClient starts a single-voter server in this process (startDev) for the
// test and returns a client of it.
func devClient(t *testing.T) *client.Client {
	t.Helper()
	url, stop := startDev()
	t.Cleanup(stop)
	c, err := client.New(url)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestAppenderSharesCallsAndKeepsEachOutcome(t *testing.T) {
	c := devClient(t)
	ctx := context.Background()
	var ids []string
	for i := 0; i < 10; i++ {
		r, err := c.Tasks().CreateTask(ctx, connect.NewRequest(&warrenv1.CreateTaskRequest{Spec: &warrenv1.TaskSpec{
			Repo: "https://git.example.com/a/b.git", Base: "main", IssueTitle: fmt.Sprint("t", i)}}))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, r.Msg.GetTask().GetId())
	}
	app := c.NewAppender(2, 64)
	defer app.Close()

	const writers, each = 100, 20
	var mu sync.Mutex
	seqs := map[string][]uint64{}
	var wg sync.WaitGroup
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for n := 0; n < each; n++ {
				id := ids[(w+n)%len(ids)]
				r, err := app.Append(ctx, &warrenv1.AppendEventsRequest{TaskId: id, Events: []*warrenv1.EventInput{
					{Kind: "log", Payload: []byte(fmt.Sprintf(`{"w":%d,"n":%d}`, w, n))}}})
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				seqs[id] = append(seqs[id], r.GetFirstSeq())
				mu.Unlock()
			}
		}(w)
	}
	wg.Wait()
	total := 0
	for _, id := range ids {
		s := seqs[id]
		sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
		for i, v := range s {
			if v != uint64(i+2) { // seq 1 is task_created
				t.Fatalf("task %s: acknowledged seqs %v are not 2..%d", id, s, len(s)+1)
			}
		}
		total += len(s)
		got, err := c.Tasks().GetTask(ctx, connect.NewRequest(&warrenv1.GetTaskRequest{Id: id}))
		if err != nil || got.Msg.GetTask().GetNextSeq() != uint64(len(s)+2) {
			t.Fatalf("task %s has next_seq %d after %d appends (%v)", id, got.Msg.GetTask().GetNextSeq(), len(s), err)
		}
	}
	if total != writers*each {
		t.Fatalf("%d appends acknowledged, want %d", total, writers*each)
	}

	// A refusal is reported to its own caller only.
	_, err := app.Append(ctx, &warrenv1.AppendEventsRequest{TaskId: ids[0], LeaseEpoch: 7, Events: []*warrenv1.EventInput{{Kind: "log"}}})
	if connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Fatalf("stale epoch: %v", err)
	}
	if _, err := app.Append(ctx, &warrenv1.AppendEventsRequest{TaskId: ids[0], Events: []*warrenv1.EventInput{{Kind: "log"}}}); err != nil {
		t.Fatal(err)
	}
	// The same request id is applied once.
	req := func() *warrenv1.AppendEventsRequest {
		return &warrenv1.AppendEventsRequest{TaskId: ids[1], RequestId: "once", Events: []*warrenv1.EventInput{{Kind: "log"}}}
	}
	a1, err1 := app.Append(ctx, req())
	a2, err2 := app.Append(ctx, req())
	if err1 != nil || err2 != nil || a1.GetFirstSeq() != a2.GetFirstSeq() {
		t.Fatalf("retry with one request id: %v %v, seqs %d %d", err1, err2, a1.GetFirstSeq(), a2.GetFirstSeq())
	}

	// A positioned append (expected_seq) is applied once, and refused at
	// the wrong position.
	got, err := c.Tasks().GetTask(ctx, connect.NewRequest(&warrenv1.GetTaskRequest{Id: ids[2]}))
	if err != nil {
		t.Fatal(err)
	}
	next := got.Msg.GetTask().GetNextSeq()
	at := func(req string, want uint64) *warrenv1.AppendEventsRequest {
		return &warrenv1.AppendEventsRequest{TaskId: ids[2], RequestId: req, ExpectedSeq: want, Events: []*warrenv1.EventInput{{Kind: "log"}, {Kind: "log"}}}
	}
	p1, err1 := app.Append(ctx, at("pos-1", next))
	p2, err2 := app.Append(ctx, at("pos-1", next))
	if err1 != nil || err2 != nil || p1.GetFirstSeq() != next || p1.GetLastSeq() != next+1 || p2.GetFirstSeq() != next || p2.GetLastSeq() != next+1 {
		t.Fatalf("positioned append and its retry at %d: %v %v, %v %v", next, p1, err1, p2, err2)
	}
	if _, err := app.Append(ctx, at("pos-2", next)); connect.CodeOf(err) != connect.CodeFailedPrecondition || !errContains(err, "expected_seq") {
		t.Fatalf("positioned append at a taken seq: %v", err)
	}

	// A malformed append is refused on its own, naming the item; the
	// others in its call are applied (they may be other tasks', other
	// tenants'). An empty call fails as a whole.
	res, err := c.Tasks().AppendEventsBatch(ctx, connect.NewRequest(&warrenv1.AppendEventsBatchRequest{Appends: []*warrenv1.AppendEventsRequest{
		{TaskId: ids[0], Events: []*warrenv1.EventInput{{Kind: "log"}}},
		{TaskId: ids[0], Events: []*warrenv1.EventInput{{Kind: "nope"}}},
		{TaskId: ids[1], Events: []*warrenv1.EventInput{{Kind: "log"}}},
	}}))
	if err != nil {
		t.Fatalf("a call with one malformed append: %v", err)
	}
	rs := res.Msg.GetResults()
	if len(rs) != 3 || rs[0].GetErrorCode() != "" || rs[0].GetFirstSeq() == 0 || rs[2].GetErrorCode() != "" || rs[2].GetFirstSeq() == 0 ||
		rs[1].GetErrorCode() != "invalid_argument" || !strings.Contains(rs[1].GetErrorMessage(), "appends[1]: events[0].kind") {
		t.Fatalf("a call with one malformed append: %v", rs)
	}
	if _, err := c.Tasks().AppendEventsBatch(ctx, connect.NewRequest(&warrenv1.AppendEventsBatchRequest{})); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("an empty call: %v", err)
	}
}

func TestAppenderClosed(t *testing.T) {
	c, err := client.New("http://127.0.0.1:1") // never dialled
	if err != nil {
		t.Fatal(err)
	}
	app := c.NewAppender(1, 8)
	app.Close()
	if _, err := app.Append(context.Background(), &warrenv1.AppendEventsRequest{TaskId: "x"}); !errors.Is(err, client.ErrAppenderClosed) {
		t.Fatalf("append after close: %v", err)
	}
}

func errContains(err error, s string) bool { return err != nil && strings.Contains(err.Error(), s) }
