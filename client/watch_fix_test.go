package client_test

import (
	"context"
	"errors"
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
