package client_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
	"github.com/warrenhq/warren/api/gen/warren/v1/warrenv1connect"
	"github.com/warrenhq/warren/client"
)

// streamServer is a TaskService whose StreamEvents runs fn.
type streamServer struct {
	warrenv1connect.UnimplementedTaskServiceHandler
	fn func(context.Context, *connect.Request[warrenv1.StreamEventsRequest], *connect.ServerStream[warrenv1.StreamEventsResponse]) error
}

func (s streamServer) StreamEvents(ctx context.Context, req *connect.Request[warrenv1.StreamEventsRequest], st *connect.ServerStream[warrenv1.StreamEventsResponse]) error {
	return s.fn(ctx, req, st)
}

func serveStream(t *testing.T, fn func(context.Context, *connect.Request[warrenv1.StreamEventsRequest], *connect.ServerStream[warrenv1.StreamEventsResponse]) error) *client.Client {
	t.Helper()
	mux := http.NewServeMux()
	mux.Handle(warrenv1connect.NewTaskServiceHandler(streamServer{fn: fn}))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	c, err := client.New(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// Checks that Watch returns, without reconnecting, an error that every
// reconnect would get again: a URL that is not a warren API (404, read as
// unimplemented; Watch reconnected to it forever), and a server's
// internal, failed_precondition or invalid_argument answer.
func TestWatchGivesUpOnPermanentErrors(t *testing.T) {
	notWarren := httptest.NewServer(http.NotFoundHandler())
	defer notWarren.Close()
	nw, err := client.New(notWarren.URL)
	if err != nil {
		t.Fatal(err)
	}
	cases := map[string]struct {
		c    *client.Client
		want connect.Code
	}{"not a warren server": {nw, connect.CodeUnimplemented}}
	for _, code := range []connect.Code{connect.CodeInternal, connect.CodeFailedPrecondition, connect.CodeInvalidArgument, connect.CodeUnimplemented} {
		cases["server answers "+code.String()] = struct {
			c    *client.Client
			want connect.Code
		}{serveStream(t, func(context.Context, *connect.Request[warrenv1.StreamEventsRequest], *connect.ServerStream[warrenv1.StreamEventsResponse]) error {
			return connect.NewError(code, errors.New("no"))
		}), code}
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			retries := 0
			err := tc.c.Watch(ctx, "01J00000000000000000000000", 0, func(*warrenv1.Event) error { return nil }, func(error) { retries++ })
			if ctx.Err() != nil {
				t.Fatalf("still reconnecting after 5 s (%d reconnects); last: %v", retries, err)
			}
			if connect.CodeOf(err) != tc.want || retries != 0 {
				t.Errorf("Watch = %v after %d reconnects; want %s at once", err, retries, tc.want)
			}
		})
	}
}

// Checks that Watch still reconnects on what a reconnect can cure: a
// server that is down, busy or without a leader (unavailable,
// resource_exhausted, aborted), an unknown error, and a server that
// cancels the stream or times it out on its side.
func TestWatchReconnectsOnTransientErrors(t *testing.T) {
	for _, code := range []connect.Code{connect.CodeUnavailable, connect.CodeResourceExhausted, connect.CodeAborted,
		connect.CodeUnknown, connect.CodeCanceled, connect.CodeDeadlineExceeded} {
		t.Run(code.String(), func(t *testing.T) {
			var calls atomic.Int32
			c := serveStream(t, func(_ context.Context, _ *connect.Request[warrenv1.StreamEventsRequest], st *connect.ServerStream[warrenv1.StreamEventsResponse]) error {
				if calls.Add(1) == 1 {
					return connect.NewError(code, errors.New("try again"))
				}
				// The second stream sends the task's last event and ends.
				return st.Send(&warrenv1.StreamEventsResponse{Event: &warrenv1.Event{Seq: 1, Kind: "state_changed"}})
			})
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			var seqs []uint64
			retries := 0
			err := c.Watch(ctx, "01J00000000000000000000000", 0, func(ev *warrenv1.Event) error {
				seqs = append(seqs, ev.GetSeq())
				return nil
			}, func(error) { retries++ })
			if err != nil || retries != 1 || len(seqs) != 1 {
				t.Errorf("Watch = %v after %d reconnects, seqs %v; want nil after 1, [1]", err, retries, seqs)
			}
		})
	}
}

// Checks that a stream cut short (the server's process dies mid-stream:
// the client reads an unexpected EOF, which connect reports as internal)
// is a broken connection Watch reconnects after, resuming after the last
// seq it delivered.
func TestWatchReconnectsAfterAStreamCutShort(t *testing.T) {
	var calls atomic.Int32
	var resumedAfter atomic.Uint64
	c := serveStream(t, func(_ context.Context, req *connect.Request[warrenv1.StreamEventsRequest], st *connect.ServerStream[warrenv1.StreamEventsResponse]) error {
		if calls.Add(1) == 1 {
			if err := st.Send(&warrenv1.StreamEventsResponse{Event: &warrenv1.Event{Seq: 1, Kind: "log"}}); err != nil {
				return err
			}
			panic(http.ErrAbortHandler) // net/http drops the connection
		}
		resumedAfter.Store(req.Msg.GetAfterSeq())
		return st.Send(&warrenv1.StreamEventsResponse{Event: &warrenv1.Event{Seq: 2, Kind: "state_changed"}})
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var seqs []uint64
	var retried []error
	err := c.Watch(ctx, "01J00000000000000000000000", 0, func(ev *warrenv1.Event) error {
		seqs = append(seqs, ev.GetSeq())
		return nil
	}, func(err error) { retried = append(retried, err) })
	t.Logf("reconnected after: %v", retried)
	if err != nil || len(seqs) != 2 || resumedAfter.Load() != 1 {
		t.Errorf("Watch = %v, seqs %v, resumed after %d, reconnects after %v; want nil, [1 2], 1", err, seqs, resumedAfter.Load(), retried)
	}
}

// silentServer takes connections and never answers (a hung process; a
// host that lost power behind a kept connection). It returns the URL.
func silentServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var held []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			held = append(held, c)
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
		for _, c := range held {
			c.Close()
		}
	})
	return "http://" + ln.Addr().String()
}

func shortWatchOpen(t *testing.T, d time.Duration) {
	old := client.WatchOpenFor
	client.WatchOpenFor = d
	t.Cleanup(func() { client.WatchOpenFor = old })
}

func streamURL(t *testing.T, fn func(context.Context, *connect.Request[warrenv1.StreamEventsRequest], *connect.ServerStream[warrenv1.StreamEventsResponse]) error) string {
	t.Helper()
	mux := http.NewServeMux()
	mux.Handle(warrenv1connect.NewTaskServiceHandler(streamServer{fn: fn}))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv.URL
}

// A watch whose first server takes the stream's request and never
// answers moves on to the next; it waited on the first for good.
func TestWatchLeavesASilentServer(t *testing.T) {
	shortWatchOpen(t, 300*time.Millisecond)
	live := streamURL(t, func(_ context.Context, _ *connect.Request[warrenv1.StreamEventsRequest], st *connect.ServerStream[warrenv1.StreamEventsResponse]) error {
		return st.Send(&warrenv1.StreamEventsResponse{Event: &warrenv1.Event{Seq: 1, Kind: "state_changed"}})
	})
	c, err := client.New(silentServer(t) + "," + live)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var seqs []uint64
	err = c.Watch(ctx, "01J00000000000000000000000", 0, func(ev *warrenv1.Event) error {
		seqs = append(seqs, ev.GetSeq())
		return nil
	}, nil)
	if err != nil || len(seqs) != 1 {
		t.Errorf("Watch = %v, seqs %v; want nil, [1] from the second server", err, seqs)
	}
}

// A quiet task's stream is not taken for a silent server: warren's
// servers answer with the headers before any event, and a watch with
// GiveUpAfter keeps a stream that stays open, however quiet.
func TestAQuietStreamIsKept(t *testing.T) {
	shortWatchOpen(t, 300*time.Millisecond)
	var calls atomic.Int32
	url := streamURL(t, func(_ context.Context, _ *connect.Request[warrenv1.StreamEventsRequest], st *connect.ServerStream[warrenv1.StreamEventsResponse]) error {
		calls.Add(1)
		if err := st.Send(nil); err != nil { // the headers, as the scheduler sends them
			return err
		}
		time.Sleep(1500 * time.Millisecond)
		return st.Send(&warrenv1.StreamEventsResponse{Event: &warrenv1.Event{Seq: 1, Kind: "state_changed"}})
	})
	c, err := client.New(url)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	retries := 0
	err = c.WatchWith(ctx, "01J00000000000000000000000", 0, func(*warrenv1.Event) error { return nil },
		client.WatchOptions{OnRetry: func(error) { retries++ }, GiveUpAfter: 500 * time.Millisecond})
	if err != nil || retries != 0 || calls.Load() != 1 {
		t.Errorf("Watch = %v after %d reconnects, %d streams; want nil from one stream", err, retries, calls.Load())
	}
}

// With GiveUpAfter, a watch whose servers keep failing ends with the last
// error; without it (the CLI's --timeout) it reconnected forever.
func TestWatchGivesUpWhenNoServerStreams(t *testing.T) {
	down := httptest.NewServer(http.NotFoundHandler())
	down.Close()
	c, err := client.New(down.URL + "," + streamURL(t, func(context.Context, *connect.Request[warrenv1.StreamEventsRequest], *connect.ServerStream[warrenv1.StreamEventsResponse]) error {
		return connect.NewError(connect.CodeUnavailable, errors.New("no leader"))
	}))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	err = c.WatchWith(ctx, "01J00000000000000000000000", 0, func(*warrenv1.Event) error { return nil },
		client.WatchOptions{GiveUpAfter: time.Second})
	if ctx.Err() != nil || err == nil || connect.CodeOf(err) != connect.CodeUnavailable {
		t.Errorf("Watch = %v after %v; want the last unavailable after about 1 s", err, time.Since(start))
	}
}

// A task no server knows ends a watch with --after with not_found after
// a few seconds of asking, even while another server is down: the down
// server's answers started the count again, so the watch never ended.
func TestWatchOfAMissingTaskEndsWithAServerDown(t *testing.T) {
	notFound := streamURL(t, func(context.Context, *connect.Request[warrenv1.StreamEventsRequest], *connect.ServerStream[warrenv1.StreamEventsResponse]) error {
		return connect.NewError(connect.CodeNotFound, errors.New("no such task"))
	})
	down := httptest.NewServer(http.NotFoundHandler())
	down.Close()
	c, err := client.New(notFound + "," + down.URL)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err = c.Watch(ctx, "01J00000000000000000000000", 3, func(*warrenv1.Event) error { return nil }, nil)
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("Watch = %v; want not_found", err)
	}
}

// A scheduler answers a stream's request with its headers before any
// event, so a watch of a quiet task (a pending one, with no node to take
// it) is not taken for a silent server and reconnected every
// WatchOpenFor.
func TestTheSchedulerAnswersAQuietStream(t *testing.T) {
	shortWatchOpen(t, 500*time.Millisecond)
	c := devClient(t)
	r, err := c.Tasks().CreateTask(context.Background(), connect.NewRequest(&warrenv1.CreateTaskRequest{Spec: &warrenv1.TaskSpec{
		Repo: "https://git.example.com/a/b.git", Base: "main", IssueTitle: "quiet"}}))
	if err != nil {
		t.Fatal(err)
	}
	// Cancelled, not a deadline: a deadline goes to the server with the
	// request, which may end the stream with deadline_exceeded just
	// before the caller's own ends, a reconnect this test would count.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	time.AfterFunc(3*time.Second, cancel)
	var retries []error
	last := r.Msg.GetTask().GetNextSeq() - 1 // from its last event: nothing to send
	err = c.Watch(ctx, r.Msg.GetTask().GetId(), last, func(*warrenv1.Event) error { return nil }, func(err error) { retries = append(retries, err) })
	if !errors.Is(err, context.Canceled) || len(retries) != 0 {
		t.Errorf("Watch of a quiet task for 3 s = %v after reconnects %v; want the caller's cancel and none", err, retries)
	}
}

// A resume refused as out_of_range, past the task's last event, after
// this watch was streamed events up to that point, comes from a server
// that lags the one that streamed them (a new leader still applying):
// it is asked again, as not_found is. It ended the watch for good in the
// middle of a healthy task.
func TestWatchAsksAgainPastALaggingServersEnd(t *testing.T) {
	var calls atomic.Int32
	c := serveStream(t, func(_ context.Context, req *connect.Request[warrenv1.StreamEventsRequest], st *connect.ServerStream[warrenv1.StreamEventsResponse]) error {
		switch calls.Add(1) {
		case 1:
			if err := st.Send(&warrenv1.StreamEventsResponse{Event: &warrenv1.Event{Seq: 1, Kind: "state_changed"}}); err != nil {
				return err
			}
			return connect.NewError(connect.CodeUnavailable, errors.New("leader lost"))
		case 2:
			return connect.NewError(connect.CodeOutOfRange, errors.New("after_seq 1: past the task's last event (seq 0)"))
		}
		return st.Send(&warrenv1.StreamEventsResponse{Event: &warrenv1.Event{Seq: 2, Kind: "state_changed"}})
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var seqs []uint64
	err := c.Watch(ctx, "01J00000000000000000000000", 0, func(ev *warrenv1.Event) error {
		seqs = append(seqs, ev.GetSeq())
		return nil
	}, nil)
	if err != nil || len(seqs) != 2 {
		t.Errorf("Watch = %v, seqs %v; want nil, [1 2]", err, seqs)
	}

	// From a seq no server streamed to this watch, out_of_range is the
	// caller's mistake and ends it at once.
	c = serveStream(t, func(context.Context, *connect.Request[warrenv1.StreamEventsRequest], *connect.ServerStream[warrenv1.StreamEventsResponse]) error {
		return connect.NewError(connect.CodeOutOfRange, errors.New("after_seq 9: past the task's last event (seq 0)"))
	})
	retries := 0
	err = c.Watch(ctx, "01J00000000000000000000000", 9, func(*warrenv1.Event) error { return nil }, func(error) { retries++ })
	if connect.CodeOf(err) != connect.CodeOutOfRange || retries != 0 {
		t.Errorf("Watch from a seq never streamed = %v after %d reconnects; want out_of_range at once", err, retries)
	}
}
