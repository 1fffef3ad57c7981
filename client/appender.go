package client

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"runtime"
	"sync/atomic"
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
//
// A call is started as soon as a slot is free, after gather has let the
// writers that are about to append do so, so that calls stay large under
// load (see gather).
type Appender struct {
	c        *Client
	in       chan *pendingAppend
	slots    chan struct{}
	maxItems int
	done     chan struct{}
	stopped  chan struct{} // closed when run has returned
	retryFor time.Duration
	calls    atomic.Uint64
	appends  atomic.Uint64
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
		stopped:  make(chan struct{}),
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
	return a.enqueue(ctx, p)
}

// enqueue queues p and waits for its outcome.
func (a *Appender) enqueue(ctx context.Context, p *pendingAppend) (*warrenv1.AppendEventsResponse, error) {
	select {
	case a.in <- p:
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-a.done:
		return nil, ErrAppenderClosed
	}
	for stopped := a.stopped; ; {
		select {
		case o := <-p.out:
			return o.res, o.err
		case <-ctx.Done():
			return nil, ctx.Err() // it may still be applied, once
		case <-stopped:
			// Closed while p was queued: the queue has room after Close,
			// so p may have gone in after run's last drain. Drain again;
			// if p was sent instead, its call still answers it.
			a.abort()
			stopped = nil
		}
	}
}

func (a *Appender) run() {
	defer close(a.stopped)
	// carry is an append gather took that did not fit in its call's
	// bytes: it opens the next call.
	var carry *pendingAppend
	closed := func() {
		if carry != nil {
			carry.out <- appendOutcome{err: ErrAppenderClosed}
		}
		a.abort()
	}
	for {
		select {
		case a.slots <- struct{}{}:
		case <-a.done:
			closed()
			return
		}
		first := carry
		carry = nil
		if first == nil {
			select {
			case first = <-a.in:
			case <-a.done:
				a.abort()
				return
			}
		}
		select {
		case <-a.done: // closed while we waited: send nothing new
			first.out <- appendOutcome{err: ErrAppenderClosed}
			a.abort()
			return
		default:
		}
		var batch []*pendingAppend
		batch, carry = gather(first, a.in, a.maxItems, maxCallBytes, len(a.slots) > 1)
		a.calls.Add(1)
		a.appends.Add(uint64(len(batch)))
		go func() {
			defer func() { <-a.slots }()
			a.send(batch)
		}()
	}
}

// maxCallBytes bounds the appends one call carries, by their payloads
// (appendBytes), well under the servers' request limit (about 33 MiB): a
// call of 1,024 appends of 64 KiB each would be refused whole.
const maxCallBytes = 8 << 20

// appendBytes is about what req takes in a call: its payloads and names,
// and a little for the framing of each field.
func appendBytes(req *warrenv1.AppendEventsRequest) int {
	n := 32 + len(req.GetTaskId()) + len(req.GetRequestId())
	for _, e := range req.GetEvents() {
		n += 16 + len(e.GetKind()) + len(e.GetPayload())
	}
	return n
}

// gather's bounds on waiting for more appends: it stops after
// gatherIdle yields in a row that brought none, after gatherYields yields
// in all, or after gatherFor.
const (
	gatherIdle   = 2
	gatherYields = 16
)

// gatherFor is a variable for tests: on a loaded machine the OS can stop
// the thread for longer than this between two yields.
var gatherFor = time.Millisecond

// gather takes first and what else is queued on in, up to max appends
// and maxBytes (appendBytes; first alone may be more). An append it took
// that would pass maxBytes is returned as carry, for the next call.
// When a call returns, its writers are woken one by one and queue their
// next appends over the following microseconds, while the call's slot is
// already free; taking only what was queued at that instant sent many
// calls of a few appends each, and the rest waited a whole call for the
// next slot. So while other calls are in flight (busy), gather yields to
// the other goroutines as long as that brings more appends. A lone writer
// (nothing else in flight) does not wait.
func gather(first *pendingAppend, in <-chan *pendingAppend, max, maxBytes int, busy bool) (batch []*pendingAppend, carry *pendingAppend) {
	batch = []*pendingAppend{first}
	size := appendBytes(first.req)
	idle, yields := 0, 0
	var start time.Time
	for len(batch) < max {
		select {
		case p := <-in:
			n := appendBytes(p.req)
			if size+n > maxBytes {
				return batch, p
			}
			size += n
			batch = append(batch, p)
			idle = 0
			continue
		default:
		}
		if !busy || idle == gatherIdle || yields == gatherYields {
			break
		}
		if yields == 0 {
			start = time.Now()
		} else if time.Since(start) > gatherFor {
			break
		}
		idle++
		yields++
		runtime.Gosched()
	}
	return batch, nil
}

// AppenderStats counts an Appender's calls and the appends they carried.
type AppenderStats struct {
	Calls   uint64 // AppendEventsBatch calls started (a retry is not counted again)
	Appends uint64 // appends sent in them
}

// Stats returns the calls and appends sent so far.
func (a *Appender) Stats() AppenderStats {
	return AppenderStats{Calls: a.calls.Load(), Appends: a.appends.Load()}
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
