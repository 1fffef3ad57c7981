package client

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"connectrpc.com/connect"

	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
)

// Appender sends the appends of many goroutines in shared
// AppendEventsBatch calls: at most `inflight` calls are in the air, and
// while they are, new appends queue and go out together in the next call.
// A node daemon uses one for all its task actors, so the cluster handles a
// few large calls instead of one call per event. Append is safe for
// concurrent use.
type Appender struct {
	c        *Client
	in       chan *pendingAppend
	slots    chan struct{}
	maxItems int
	done     chan struct{}
	retryFor time.Duration
}

type pendingAppend struct {
	req *warrenv1.AppendEventsRequest
	out chan appendOutcome // buffered, receives exactly once
}

type appendOutcome struct {
	res *warrenv1.AppendEventsResponse
	err error
}

// ErrAppenderClosed is returned by Append after Close.
var ErrAppenderClosed = errors.New("appender closed")

// NewAppender starts an Appender with at most inflight concurrent calls of
// at most maxItems appends each (0 picks 4 and 1024).
func (c *Client) NewAppender(inflight, maxItems int) *Appender {
	if inflight <= 0 {
		inflight = 4
	}
	if maxItems <= 0 {
		maxItems = 1024
	}
	a := &Appender{
		c:        c,
		in:       make(chan *pendingAppend, 4*maxItems),
		slots:    make(chan struct{}, inflight),
		maxItems: maxItems,
		done:     make(chan struct{}),
		retryFor: 30 * time.Second,
	}
	go a.run()
	return a
}

// Close stops the Appender; queued appends fail with ErrAppenderClosed.
// Calls already sent complete.
func (a *Appender) Close() { close(a.done) }

// Append appends events to one task, sharing a call with concurrent
// appends. A request without a request id gets one, so that a call the
// Appender retries after a server failure is applied once. Refusals by the
// log come back as *connect.Error with their code (failed_precondition for
// a stale epoch or an ended task, not_found, ...).
func (a *Appender) Append(ctx context.Context, req *warrenv1.AppendEventsRequest) (*warrenv1.AppendEventsResponse, error) {
	if req.GetRequestId() == "" {
		b := make([]byte, 12)
		_, _ = rand.Read(b)
		req.RequestId = "app-" + hex.EncodeToString(b)
	}
	p := &pendingAppend{req: req, out: make(chan appendOutcome, 1)}
	select {
	case <-a.done:
		return nil, ErrAppenderClosed
	default:
	}
	select {
	case a.in <- p:
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-a.done:
		return nil, ErrAppenderClosed
	}
	select {
	case o := <-p.out:
		return o.res, o.err
	case <-ctx.Done():
		return nil, ctx.Err() // it may still be applied, once
	}
}

func (a *Appender) run() {
	for {
		select {
		case a.slots <- struct{}{}:
		case <-a.done:
			a.abort()
			return
		}
		var first *pendingAppend
		select {
		case first = <-a.in:
		case <-a.done:
			a.abort()
			return
		}
		select {
		case <-a.done: // closed while we waited: send nothing new
			first.out <- appendOutcome{err: ErrAppenderClosed}
			a.abort()
			return
		default:
		}
		batch := []*pendingAppend{first}
	fill:
		for len(batch) < a.maxItems {
			select {
			case p := <-a.in:
				batch = append(batch, p)
			default:
				break fill
			}
		}
		go func() {
			defer func() { <-a.slots }()
			a.send(batch)
		}()
	}
}

func (a *Appender) abort() {
	for {
		select {
		case p := <-a.in:
			p.out <- appendOutcome{err: ErrAppenderClosed}
		default:
			return
		}
	}
}

// send makes one AppendEventsBatch call for the batch, retrying on the
// next server while the cluster is unavailable, and hands every append its
// own outcome.
func (a *Appender) send(batch []*pendingAppend) {
	req := &warrenv1.AppendEventsBatchRequest{Appends: make([]*warrenv1.AppendEventsRequest, len(batch))}
	for i, p := range batch {
		req.Appends[i] = p.req
	}
	deadline := time.Now().Add(a.retryFor)
	backoff := 50 * time.Millisecond
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		resp, err := a.c.appendTasks().AppendEventsBatch(ctx, connect.NewRequest(req))
		cancel()
		if err == nil {
			res := resp.Msg.GetResults()
			if len(res) != len(batch) {
				err = fmt.Errorf("server returned %d results for %d appends", len(res), len(batch))
				for _, p := range batch {
					p.out <- appendOutcome{err: err}
				}
				return
			}
			for i, p := range batch {
				p.out <- itemOutcome(res[i])
			}
			return
		}
		switch connect.CodeOf(err) {
		// The call's context is our own and never cancelled, so canceled
		// here is the transport's (a server that died mid-call, a write on
		// a connection it closed): worth another try like the others.
		// Every append has a request id, so a retry applies it once.
		case connect.CodeUnavailable, connect.CodeUnknown, connect.CodeDeadlineExceeded, connect.CodeAborted, connect.CodeCanceled:
			if time.Now().Before(deadline) {
				a.c.failover()
				time.Sleep(backoff)
				backoff = min(2*backoff, time.Second)
				continue
			}
		}
		for _, p := range batch {
			p.out <- appendOutcome{err: err}
		}
		return
	}
}

func itemOutcome(r *warrenv1.AppendEventsResult) appendOutcome {
	if r.GetErrorCode() == "" {
		return appendOutcome{res: &warrenv1.AppendEventsResponse{FirstSeq: r.GetFirstSeq(), LastSeq: r.GetLastSeq(), CancelRequested: r.GetCancelRequested()}}
	}
	var code connect.Code
	if err := code.UnmarshalText([]byte(r.GetErrorCode())); err != nil {
		code = connect.CodeUnknown
	}
	return appendOutcome{err: connect.NewError(code, errors.New(r.GetErrorMessage()))}
}
