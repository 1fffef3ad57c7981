package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	"github.com/warrenhq/warren/api"
	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
	"github.com/warrenhq/warren/api/gen/warren/v1/warrenv1connect"
)

// DefaultServer is the API URL used when none is given.
const DefaultServer = "http://127.0.0.1:7480"

// Client talks to a warren cluster through any of its servers.
type Client struct {
	urls []string
	next atomic.Uint32
	// leader is 1 + the index in urls of the server that last named
	// itself leader in api.LeaderHeader, 0 when none did (or it failed
	// since). Only appends follow it.
	leader  atomic.Int32
	tasks   []warrenv1connect.TaskServiceClient
	cluster []warrenv1connect.ClusterServiceClient

	sandboxes []warrenv1connect.SandboxServiceClient
}

// New returns a client for a comma-separated list of server URLs. Any
// server serves every call; Watch moves to the next one when a server fails.
func New(servers string) (*Client, error) {
	return NewWith(servers, &http.Client{Transport: &http.Transport{
		// A server whose host is off (its SYNs dropped) fails its
		// connect here rather than holding the caller's whole deadline,
		// so Do moves on to the next server.
		DialContext:         (&net.Dialer{Timeout: DialTimeout, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     90 * time.Second,
	}})
}

// DialTimeout bounds a connect to a server by New's client.
const DialTimeout = 5 * time.Second

// NewWith is New with the HTTP client to use.
func NewWith(servers string, hc *http.Client) (*Client, error) {
	var urls []string
	for _, u := range strings.Split(servers, ",") {
		u = strings.TrimSpace(u)
		if u == "" {
			continue
		}
		if !strings.HasPrefix(u, "http://") && !strings.HasPrefix(u, "https://") {
			return nil, fmt.Errorf("server %q: must start with http:// or https://", u)
		}
		urls = append(urls, strings.TrimRight(u, "/"))
	}
	if len(urls) == 0 {
		return nil, errors.New("server: no URL given")
	}
	c := &Client{urls: urls}
	// Small requests go uncompressed: gzip costs more than it saves.
	opt := connect.WithClientOptions(connect.WithCompressMinBytes(4096), connect.WithInterceptors(leaderInterceptor{c}))
	for _, u := range urls {
		c.tasks = append(c.tasks, warrenv1connect.NewTaskServiceClient(hc, u, opt))
		c.cluster = append(c.cluster, warrenv1connect.NewClusterServiceClient(hc, u, opt))
		c.sandboxes = append(c.sandboxes, warrenv1connect.NewSandboxServiceClient(hc, u, opt))
	}
	return c, nil
}

// Tasks returns the TaskService client of the current server.
func (c *Client) Tasks() warrenv1connect.TaskServiceClient {
	return c.tasks[int(c.next.Load())%len(c.tasks)]
}

// Cluster returns the ClusterService client of the current server.
func (c *Client) Cluster() warrenv1connect.ClusterServiceClient {
	return c.cluster[int(c.next.Load())%len(c.cluster)]
}

// Sandboxes returns the SandboxService client of the current server.
func (c *Client) Sandboxes() warrenv1connect.SandboxServiceClient {
	return c.sandboxes[int(c.next.Load())%len(c.sandboxes)]
}

// appendTasks returns the TaskService client appends go to: the leader's
// when a server named it, else the current server's.
func (c *Client) appendTasks() warrenv1connect.TaskServiceClient {
	if l := c.leader.Load(); l > 0 {
		return c.tasks[l-1]
	}
	return c.Tasks()
}

// noteLeader records the leader a server named, if it is one of the
// client's servers (a URL the client was not given is not followed).
func (c *Client) noteLeader(url string) {
	url = strings.TrimRight(url, "/")
	for i, u := range c.urls {
		if u == url {
			c.leader.Store(int32(i + 1))
			return
		}
	}
}

// leaderInterceptor notes api.LeaderHeader on every unary response.
type leaderInterceptor struct{ c *Client }

func (l leaderInterceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		resp, err := next(ctx, req)
		if err == nil {
			if u := resp.Header().Get(api.LeaderHeader); u != "" {
				l.c.noteLeader(u)
			}
		}
		return resp, namedUTF8Error(err, req.Any())
	}
}

func (leaderInterceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, spec connect.Spec) connect.StreamingClientConn {
		return utf8Conn{next(ctx, spec)}
	}
}

// utf8Conn names the field of a message it could not send for a string
// that is not UTF-8.
type utf8Conn struct{ connect.StreamingClientConn }

func (c utf8Conn) Send(m any) error { return namedUTF8Error(c.StreamingClientConn.Send(m), m) }

// namedUTF8Error turns the marshaller's error for a string that is not
// UTF-8 (internal, naming no field: a CLI argument in Latin-1, say) into
// invalid_argument naming the field; other errors pass unchanged. It looks
// at the message only once a call failed.
func namedUTF8Error(err error, msg any) error {
	if err == nil || connect.CodeOf(err) != connect.CodeInternal || !strings.Contains(err.Error(), "invalid UTF-8") {
		return err
	}
	m, ok := msg.(proto.Message)
	if !ok {
		return err
	}
	if f := api.NotUTF8Field(m.ProtoReflect()); f != "" {
		return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("%s: not UTF-8 text", f))
	}
	return err
}

func (leaderInterceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

// NumServers returns how many servers the client was given.
func (c *Client) NumServers() int { return len(c.urls) }

// URL returns the current server's URL.
func (c *Client) URL() string { return c.urls[int(c.next.Load())%len(c.urls)] }

// Do runs call, which makes one call through c.Tasks(), c.Cluster() or
// c.Sandboxes() (the current server's), and, given several servers, runs
// it again on the next while it fails with unavailable: the server is
// down or restarting, or the cluster has no leader yet. Any server serves
// any call, and a write retried with its request id is applied once. Each
// round of all the servers is followed by a wait (250 ms, doubling to
// 2 s), for at most doRetryFor in all or until ctx ends; then the last
// error is returned. With one server, call runs once.
func (c *Client) Do(ctx context.Context, call func() error) error {
	return c.rounds(ctx, call, func(err error) bool { return connect.CodeOf(err) == connect.CodeUnavailable })
}

// rounds runs call, and, given several servers, runs it again on the next
// while it fails with an error gone says the server is gone for: each
// round of all the servers is followed by a wait (250 ms, doubling to
// 2 s), for at most doRetryFor in all or until ctx ends; then the last
// error is returned. With one server, call runs once. (Do and Read.)
func (c *Client) rounds(ctx context.Context, call func() error, gone func(error) bool) error {
	deadline := time.Now().Add(doRetryFor)
	wait := 250 * time.Millisecond
	for i := 1; ; i++ {
		err := call()
		if err == nil || !gone(err) || len(c.urls) == 1 || ctx.Err() != nil || time.Now().After(deadline) {
			return err
		}
		c.failover()
		if i%len(c.urls) != 0 {
			continue
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(wait):
		}
		wait = min(2*wait, 2*time.Second)
	}
}

// doRetryFor bounds Do's retries (a variable for tests).
var doRetryFor = 15 * time.Second

// Read runs call, one read through the TaskService client it is given
// (the current server's), under a context that ends after ReadAttempt,
// and, given several servers, runs it again on the next while it fails
// with unavailable or runs out of that time while ctx has not ended: a
// server that stopped, or one that lost power and never answers, is left
// for the next as Do leaves it. Each round of all the servers is followed
// by a wait (250 ms, doubling to 2 s), for at most doRetryFor in all;
// then the last error is returned. With one server, call runs once.
//
// Node daemons read through it: their appends follow the leader, so
// nothing else moved them off a follower that died, and every read of
// theirs failed against it for as long as it was gone.
func (c *Client) Read(ctx context.Context, call func(context.Context, warrenv1connect.TaskServiceClient) error) error {
	return c.DoEach(ctx, ReadAttempt, func(actx context.Context) error { return call(actx, c.Tasks()) })
}

// DoEach is Do with a bound on each attempt: call runs under a context
// that also ends after each, and an attempt that runs out of that time
// while ctx has not ended counts as its server gone, like unavailable, so
// a server that takes connections but never answers (a hung process, a
// host that lost power behind a kept connection) is left for the next.
// A write retried so carries its request id, as with Do. With one server
// there is one attempt, bounded the same way. each ≤ 0 bounds nothing
// (Do).
func (c *Client) DoEach(ctx context.Context, each time.Duration, call func(context.Context) error) error {
	if each <= 0 {
		return c.Do(ctx, func() error { return call(ctx) })
	}
	return c.rounds(ctx, func() error {
		actx, cancel := context.WithTimeout(ctx, each)
		defer cancel()
		return call(actx)
	}, func(err error) bool {
		code := connect.CodeOf(err)
		return code == connect.CodeUnavailable || code == connect.CodeDeadlineExceeded && ctx.Err() == nil
	})
}

// ReadAttempt bounds one attempt of Read (a variable for tests).
var ReadAttempt = 15 * time.Second

// Failover moves to the next server, as Do and Read do when one fails: for
// a caller whose own call found the current server gone (a stream that
// broke, say).
func (c *Client) Failover() {
	if len(c.urls) > 1 {
		c.failover()
	}
}

// failover moves to the next server, and forgets the leader: it may be
// the server that failed.
func (c *Client) failover() {
	c.leader.Store(0)
	c.next.Add(1)
}

// Watch calls fn for every event of task id with seq > after, in order and
// exactly once, reconnecting (to the next server if there are several)
// whenever a stream breaks or a server is unavailable (see watchRetries).
// It returns nil once the task has ended and its last event was delivered,
// fn's error if fn fails, ctx's error, or an error that reconnecting would
// not cure (unimplemented: the URL is not a warren API; invalid_argument;
// internal from the server; not_found, after a few seconds of asking when
// after > 0, as a lagging server may not have the task yet).
// onRetry, if not nil, is told about each reconnect, with c.URL() already
// the server it reconnects to. A server that has not answered a stream's
// request within WatchOpenFor (one that takes connections but hangs) is
// left for the next, as one that is down.
func (c *Client) Watch(ctx context.Context, id string, after uint64, fn func(*warrenv1.Event) error, onRetry func(error)) error {
	return c.WatchWith(ctx, id, after, fn, WatchOptions{OnRetry: onRetry})
}

// WatchOptions tunes WatchWith.
type WatchOptions struct {
	// OnRetry, if not nil, is told about each reconnect, with c.URL()
	// already the server it reconnects to.
	OnRetry func(error)
	// GiveUpAfter, if above 0, ends the watch with the last error once
	// reconnecting has failed for that long: since the watch began, or
	// since a stream last delivered an event or stayed open (a server
	// that is down, refuses or never answers keeps failing; a task that
	// is just quiet does not).
	GiveUpAfter time.Duration
}

// WatchOpenFor bounds the wait for a server's answer to a stream's
// request (its response headers; warren's servers send them at once, and
// events after). A variable for tests.
var WatchOpenFor = 15 * time.Second

// streamStood is how long a stream must stay open to count as one that
// worked, for WatchOptions.GiveUpAfter.
const streamStood = time.Second

// WatchWith is Watch with options.
func (c *Client) WatchWith(ctx context.Context, id string, after uint64, fn func(*warrenv1.Event) error, o WatchOptions) error {
	backoff := 100 * time.Millisecond
	var notFoundSince time.Time // the first of the not_found answers in a row
	failingSince := time.Now()  // reset by a stream that worked
	delivered := false          // some server streamed events to this watch
	for {
		seen := after
		err := c.watchOnce(ctx, id, &after, fn, func() {
			backoff = 100 * time.Millisecond
			notFoundSince = time.Time{}
			failingSince = time.Now()
		})
		if err == nil {
			return nil // the task ended
		}
		delivered = delivered || after > seen
		var fe finalError
		if errors.As(err, &fe) {
			return fe.err
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		switch code := connect.CodeOf(err); {
		case code == connect.CodeNotFound || code == connect.CodeOutOfRange && delivered:
			// out_of_range: past the task's last event. Said of a seq a
			// server streamed to this watch, by one that lags it (a new
			// leader still applying, say), it is asked again too.
			if after == 0 {
				return err
			}
			// A lagging server may not have applied the task yet: ask
			// again, the next server too, for a while. A task no server
			// knows (a mistyped id) ends the watch then. Another
			// server's transport error in between does not start the
			// count again.
			if notFoundSince.IsZero() {
				notFoundSince = time.Now()
			} else if time.Since(notFoundSince) >= watchNotFoundFor {
				return err
			}
		case watchRetries(err):
		default:
			return err
		}
		if o.GiveUpAfter > 0 && time.Since(failingSince) >= o.GiveUpAfter {
			return fmt.Errorf("no server streamed the task's events for %v; last: %w", o.GiveUpAfter.Round(time.Millisecond), err)
		}
		c.failover()
		if o.OnRetry != nil {
			o.OnRetry(err) // c.URL() is the server it reconnects to
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

// finalError is an error of watchOnce's that ends the watch as it is:
// fn's, or a stream that skipped events.
type finalError struct{ err error }

func (e finalError) Error() string { return e.err.Error() }

// watchOnce runs one stream of task id's events after *after through fn,
// advancing *after; worked is called when the stream delivers an event,
// and at its end if it had stayed open for streamStood. It returns nil
// once the task ended, a finalError for fn's or for a skip, and the
// stream's error otherwise.
func (c *Client) watchOnce(ctx context.Context, id string, after *uint64, fn func(*warrenv1.Event) error, worked func()) error {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	url := c.URL()
	var silent atomic.Bool
	answered := make(chan struct{})
	timer := time.AfterFunc(WatchOpenFor, func() {
		select {
		case <-answered:
		default:
			silent.Store(true)
			cancel()
		}
	})
	stream, err := c.Tasks().StreamEvents(sctx, connect.NewRequest(&warrenv1.StreamEventsRequest{TaskId: id, AfterSeq: *after}))
	if err == nil {
		stream.ResponseHeader() // waits for the server's answer
	}
	close(answered)
	timer.Stop()
	// The stream's error, or the silence that made it.
	ended := func(err error) error {
		if silent.Load() && ctx.Err() == nil {
			return connect.NewError(connect.CodeDeadlineExceeded, fmt.Errorf("%s did not answer the stream's request within %v", url, WatchOpenFor))
		}
		return err
	}
	if err != nil {
		return ended(err)
	}
	defer stream.Close()
	// An answer that is an error comes at once with the headers; a stream
	// that ends (or breaks) a while after them had worked.
	opened := time.Now()
	defer func() {
		if !silent.Load() && time.Since(opened) >= streamStood {
			worked()
		}
	}()
	for stream.Receive() {
		ev := stream.Msg().GetEvent()
		if ev.GetSeq() <= *after {
			continue // never repeat
		}
		if ev.GetSeq() != *after+1 {
			return finalError{fmt.Errorf("stream skipped from seq %d to %d", *after, ev.GetSeq())}
		}
		if err := fn(ev); err != nil {
			return finalError{err}
		}
		*after = ev.GetSeq()
		worked()
	}
	return ended(stream.Err())
}

// watchRetries reports whether Watch reconnects after err, which did not
// come from the caller's ctx: the server is down, restarting, overloaded
// or without a leader (unavailable, resource_exhausted, aborted), or the
// stream broke (unknown; canceled or deadline_exceeded not the caller's;
// internal from a stream cut short or a network error). Any other code
// (unimplemented from a server that is not warren's API, internal from the
// server, invalid_argument, permission_denied, …) would come back on
// every reconnect.
func watchRetries(err error) bool {
	switch connect.CodeOf(err) {
	case connect.CodeUnavailable, connect.CodeResourceExhausted, connect.CodeAborted,
		connect.CodeUnknown, connect.CodeCanceled, connect.CodeDeadlineExceeded:
		return true
	case connect.CodeInternal:
		var ne net.Error
		return !connect.IsWireError(err) && (errors.Is(err, io.ErrUnexpectedEOF) || errors.As(err, &ne))
	}
	return false
}

// watchNotFoundFor is how long Watch, after some events, keeps asking for
// a task the servers say does not exist.
const watchNotFoundFor = 5 * time.Second

// StaleEpochText is how the cluster words a refusal of an append whose
// lease epoch is not the task's current one.
const StaleEpochText = "stale lease epoch"

// IsStaleEpoch reports whether err is the cluster refusing an append
// because its lease epoch is stale: the task moved to another holder, and
// the writer must stop.
func IsStaleEpoch(err error) bool {
	return connect.CodeOf(err) == connect.CodeFailedPrecondition && strings.Contains(err.Error(), StaleEpochText)
}
