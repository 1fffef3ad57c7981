package scheduler

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"connectrpc.com/connect"
	"github.com/hashicorp/raft"
	"github.com/oklog/ulid/v2"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/warrenhq/warren/api"
	fsmv1 "github.com/warrenhq/warren/api/gen/warren/fsm/v1"
	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
	"github.com/warrenhq/warren/api/gen/warren/v1/warrenv1connect"
	"github.com/warrenhq/warren/internal/reqbound"
)

const defaultTenant = "default"

// compressMinBytes: smaller messages are sent uncompressed. Compressing
// every tiny write reply cost about an eighth of a server's CPU.
const compressMinBytes = 4096

// maxRequestBytes bounds one request: a forwarded batch holds at most the
// largest valid AppendEvents (256 events of 64 KiB) or 4 MiB of smaller
// commands; allow twice that plus framing.
const maxRequestBytes = 2*MaxEventsPerAppend*MaxPayloadBytes + 1<<20

// maxForwardBytes bounds a follower's forwarded request (ClusterService):
// a client's largest, plus what forwarding adds to each command (a type
// byte, a time, a generated request id: about 50 bytes), so a request the
// leader takes is taken through a follower too.
const maxForwardBytes = maxRequestBytes + MaxAppendsPerBatch*256

// taskAPI implements warrenv1connect.TaskServiceHandler.
type taskAPI struct{ s *Server }

var _ warrenv1connect.TaskServiceHandler = taskAPI{}

func newMux(s *Server) http.Handler {
	mux := http.NewServeMux()
	opts := connect.WithHandlerOptions(
		connect.WithInterceptors(errorInterceptor{}),
		connect.WithCompressMinBytes(compressMinBytes),
		connect.WithReadMaxBytes(maxRequestBytes),
		boundedCodecs(),
	)
	taskPath, taskHandler := warrenv1connect.NewTaskServiceHandler(taskAPI{s}, opts)
	mux.Handle(taskPath, streamDeadlines(taskHandler, warrenv1connect.TaskServiceStreamEventsProcedure))
	mux.Handle(warrenv1connect.NewClusterServiceHandler(clusterAPI{s}, opts, connect.WithReadMaxBytes(maxForwardBytes)))
	mux.Handle(warrenv1connect.NewNodeServiceHandler(nodeAPI{s}, opts))
	mux.Handle(sandboxHandler(newSandboxAPI(s)))
	mux.Handle("GET /v1/tasks/{id}/events", sseHandler{s})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	return mux
}

// sandboxHandler serves the public SandboxService. A ReadFile's and a
// ListFiles' room in the gate is held until the answer is written
// (api.HoldUntilServed), and each write of those answers, as of an
// Exec's output, has streamWriteTimeout: a client that stops reading
// would otherwise hold the answer, and its room, for good.
func sandboxHandler(a *sandboxAPI) (string, http.Handler) {
	path, h := warrenv1connect.NewSandboxServiceHandler(a, connect.WithHandlerOptions(
		connect.WithInterceptors(errorInterceptor{}), connect.WithReadMaxBytes(80<<20), reqbound.Codecs(reqbound.Sandbox)))
	return path, streamDeadlines(api.HoldUntilServed(h), warrenv1connect.SandboxServiceExecProcedure,
		warrenv1connect.SandboxServiceReadFileProcedure, warrenv1connect.SandboxServiceListFilesProcedure)
}

// invalid wraps a validation error.
func invalid(err error) error {
	if err == nil {
		return nil
	}
	return connect.NewError(connect.CodeInvalidArgument, err)
}

// resultErr turns a refused command into the client's error.
func resultErr(r *fsmv1.Result) error {
	if r.GetCode() == 0 {
		return nil
	}
	return connect.NewError(connect.Code(r.GetCode()), errors.New(r.GetMessage()))
}

// toConnect maps an error to a Connect error. It is the one place where
// internal errors get their codes.
func toConnect(err error) error {
	var ce *connect.Error
	switch {
	case err == nil:
		return nil
	case errors.As(err, &ce):
		return err
	case errors.Is(err, ErrNotFound):
		return connect.NewError(connect.CodeNotFound, err)
	case errors.Is(err, context.DeadlineExceeded):
		return connect.NewError(connect.CodeDeadlineExceeded, err)
	case errors.Is(err, context.Canceled):
		return connect.NewError(connect.CodeCanceled, err)
	case retryable(err), errors.Is(err, errProposalAborted):
		return connect.NewError(connect.CodeUnavailable, err)
	}
	return connect.NewError(connect.CodeInternal, err)
}

// errorInterceptor applies toConnect to every handler's error.
type errorInterceptor struct{}

func (errorInterceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		resp, err := next(ctx, req)
		return resp, toConnect(err)
	}
}

func (errorInterceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (errorInterceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		return toConnect(next(ctx, conn))
	}
}

// write proposes one command and returns its result, or the error.
func (a taskAPI) write(ctx context.Context, m proto.Message) (*fsmv1.Result, error) {
	res, err := a.s.propose(ctx, m)
	if err != nil {
		return nil, err
	}
	if err := resultErr(res[0]); err != nil {
		return nil, err
	}
	return res[0], nil
}

// requestID returns the client's key, or a fresh one so that the server's
// own retries of this request stay idempotent.
func requestID(v string) string {
	if v != "" {
		return v
	}
	return "srv-" + ulid.Make().String()
}

func (a taskAPI) now() *timestamppb.Timestamp { return timestamppb.New(a.s.clock.Now()) }

func (a taskAPI) CreateTask(ctx context.Context, req *connect.Request[warrenv1.CreateTaskRequest]) (*connect.Response[warrenv1.CreateTaskResponse], error) {
	if err := validateCreate(req.Msg); err != nil {
		return nil, invalid(err)
	}
	res, err := a.write(ctx, a.createCommand(req.Msg))
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&warrenv1.CreateTaskResponse{Task: res.GetTask(), Created: res.GetCreated()}), nil
}

func (a taskAPI) createCommand(r *warrenv1.CreateTaskRequest) *fsmv1.CreateTask {
	tenant := r.GetTenant()
	if tenant == "" {
		tenant = defaultTenant
	}
	return &fsmv1.CreateTask{
		Id:        ulid.Make().String(),
		Tenant:    tenant,
		RequestId: requestID(r.GetRequestId()),
		Spec:      r.GetSpec(),
		Time:      a.now(),
	}
}

// validateBatch checks a batch call's items: at least one, at most max,
// and each valid, naming a bad one field[i].
func validateBatch[T any](field, noun string, items []T, max int, check func(T) error) error {
	var p problems
	switch {
	case len(items) == 0:
		p.add(field, "required: at least one %s", noun)
	case len(items) > max:
		p.add(field, "%d %ss is over the limit of %d per call", len(items), noun, max)
		return p.err() // the items are not worth checking
	}
	for i, it := range items {
		if err := check(it); err != nil {
			p.add(fmt.Sprintf("%s[%d]", field, i), "%v", err)
		}
	}
	return p.err()
}

// MaxCreatesPerBatch bounds one CreateTasks call.
const MaxCreatesPerBatch = 1000

func (a taskAPI) CreateTasks(ctx context.Context, req *connect.Request[warrenv1.CreateTasksRequest]) (*connect.Response[warrenv1.CreateTasksResponse], error) {
	items := req.Msg.GetTasks()
	if err := validateBatch("tasks", "task", items, MaxCreatesPerBatch, validateCreate); err != nil {
		return nil, invalid(err)
	}
	cmds := make([]proto.Message, len(items))
	for i, it := range items {
		cmds[i] = a.createCommand(it)
	}
	res, err := a.s.propose(ctx, cmds...)
	if err != nil {
		return nil, err
	}
	out := &warrenv1.CreateTasksResponse{Results: make([]*warrenv1.CreateTasksResult, len(res))}
	for i, r := range res {
		cr := &warrenv1.CreateTasksResult{Task: r.GetTask(), Created: r.GetCreated()}
		if r.GetCode() != 0 {
			cr = &warrenv1.CreateTasksResult{ErrorCode: connect.Code(r.GetCode()).String(), ErrorMessage: r.GetMessage()}
		}
		out.Results[i] = cr
	}
	return connect.NewResponse(out), nil
}

func (a taskAPI) GetTask(ctx context.Context, req *connect.Request[warrenv1.GetTaskRequest]) (*connect.Response[warrenv1.GetTaskResponse], error) {
	var p problems
	p.taskID("id", req.Msg.GetId())
	if err := p.err(); err != nil {
		return nil, invalid(err)
	}
	t, err := a.s.readTask(ctx, req.Msg.GetId())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&warrenv1.GetTaskResponse{Task: t}), nil
}

// maxListBytes bounds one ListTasks page: a task's issue body alone may
// hold 256 KiB, so 1000 of them would make a response of hundreds of MB.
// A page that reaches it ends early, with next_page_token set.
const maxListBytes = 4 << 20

// streamPageBytes bounds a stream's page of events, which a stream holds
// until its client has read every event of it: at maxListBytes, a client
// that read a few KB every 25 s (each write within streamWriteTimeout) kept
// 4 MiB per stream for half an hour.
const streamPageBytes = 256 << 10

func (a taskAPI) ListTasks(ctx context.Context, req *connect.Request[warrenv1.ListTasksRequest]) (*connect.Response[warrenv1.ListTasksResponse], error) {
	if err := validateList(req.Msg); err != nil {
		return nil, invalid(err)
	}
	size := int(req.Msg.GetPageSize())
	if size == 0 {
		size = 100
	}
	check := a.s.readGuard()
	tasks, next, err := a.s.fsm.ListTasks(req.Msg.GetState(), req.Msg.GetPageToken(), size, maxListBytes)
	if cerr := check(); cerr != nil {
		return nil, cerr
	}
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&warrenv1.ListTasksResponse{Tasks: tasks, NextPageToken: next}), nil
}

func (a taskAPI) AppendEvents(ctx context.Context, req *connect.Request[warrenv1.AppendEventsRequest]) (*connect.Response[warrenv1.AppendEventsResponse], error) {
	if err := validateAppend(req.Msg); err != nil {
		return nil, invalid(err)
	}
	res, err := a.write(ctx, &fsmv1.AppendEvents{
		TaskId:      req.Msg.GetTaskId(),
		LeaseEpoch:  req.Msg.GetLeaseEpoch(),
		Events:      req.Msg.GetEvents(),
		RequestId:   requestID(req.Msg.GetRequestId()),
		Time:        a.now(),
		ExpectedSeq: req.Msg.GetExpectedSeq(),
	})
	if err != nil {
		return nil, err
	}
	resp := connect.NewResponse(&warrenv1.AppendEventsResponse{FirstSeq: res.GetFirstSeq(), LastSeq: res.GetLastSeq(), CancelRequested: res.GetCancelRequested()})
	a.s.nameLeader(resp.Header())
	return resp, nil
}

// MaxAppendsPerBatch bounds one AppendEventsBatch call.
const MaxAppendsPerBatch = 1024

func (a taskAPI) AppendEventsBatch(ctx context.Context, req *connect.Request[warrenv1.AppendEventsBatchRequest]) (*connect.Response[warrenv1.AppendEventsBatchResponse], error) {
	items := req.Msg.GetAppends()
	// The call as a whole: its size. Each item is checked on its own: the
	// appends of many tasks (often many tenants') share a call, and one
	// malformed append must not fail the others.
	if err := validateBatch("appends", "append", items, MaxAppendsPerBatch, func(*warrenv1.AppendEventsRequest) error { return nil }); err != nil {
		return nil, invalid(err)
	}
	now := a.now()
	out := &warrenv1.AppendEventsBatchResponse{Results: make([]*warrenv1.AppendEventsResult, len(items))}
	var cmds []proto.Message
	var at []int // cmds[j] is items[at[j]]
	for i, it := range items {
		if err := validateAppend(it); err != nil {
			out.Results[i] = &warrenv1.AppendEventsResult{ErrorCode: connect.CodeInvalidArgument.String(),
				ErrorMessage: fmt.Sprintf("appends[%d]: %v", i, err)}
			continue
		}
		cmds = append(cmds, &fsmv1.AppendEvents{
			TaskId:      it.GetTaskId(),
			LeaseEpoch:  it.GetLeaseEpoch(),
			Events:      it.GetEvents(),
			RequestId:   requestID(it.GetRequestId()),
			Time:        now,
			ExpectedSeq: it.GetExpectedSeq(),
		})
		at = append(at, i)
	}
	if len(cmds) > 0 {
		res, err := a.s.propose(ctx, cmds...)
		if err != nil {
			return nil, err
		}
		for j, r := range res {
			ar := &warrenv1.AppendEventsResult{FirstSeq: r.GetFirstSeq(), LastSeq: r.GetLastSeq(), CancelRequested: r.GetCancelRequested()}
			if r.GetCode() != 0 {
				ar = &warrenv1.AppendEventsResult{ErrorCode: connect.Code(r.GetCode()).String(), ErrorMessage: r.GetMessage()}
			}
			out.Results[at[j]] = ar
		}
	}
	resp := connect.NewResponse(out)
	a.s.nameLeader(resp.Header())
	return resp, nil
}

func (a taskAPI) SendMessage(ctx context.Context, req *connect.Request[warrenv1.SendMessageRequest]) (*connect.Response[warrenv1.SendMessageResponse], error) {
	if err := validateMessage(req.Msg); err != nil {
		return nil, invalid(err)
	}
	res, err := a.write(ctx, &fsmv1.SendMessage{
		TaskId:    req.Msg.GetTaskId(),
		Text:      req.Msg.GetText(),
		RequestId: requestID(req.Msg.GetRequestId()),
		Time:      a.now(),
	})
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&warrenv1.SendMessageResponse{Seq: res.GetFirstSeq()}), nil
}

func (a taskAPI) decide(ctx context.Context, r *warrenv1.DecideRequest, approved bool) (*connect.Response[warrenv1.DecideResponse], error) {
	if err := validateDecide(r); err != nil {
		return nil, invalid(err)
	}
	res, err := a.write(ctx, &fsmv1.Decide{
		TaskId:     r.GetTaskId(),
		ToolCallId: r.GetToolCallId(),
		Approved:   approved,
		Comment:    r.GetComment(),
		RequestId:  requestID(r.GetRequestId()),
		Time:       a.now(),
	})
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&warrenv1.DecideResponse{Seq: res.GetFirstSeq()}), nil
}

func (a taskAPI) Approve(ctx context.Context, req *connect.Request[warrenv1.DecideRequest]) (*connect.Response[warrenv1.DecideResponse], error) {
	return a.decide(ctx, req.Msg, true)
}

func (a taskAPI) Reject(ctx context.Context, req *connect.Request[warrenv1.DecideRequest]) (*connect.Response[warrenv1.DecideResponse], error) {
	return a.decide(ctx, req.Msg, false)
}

func (a taskAPI) CancelTask(ctx context.Context, req *connect.Request[warrenv1.CancelTaskRequest]) (*connect.Response[warrenv1.CancelTaskResponse], error) {
	if err := validateCancel(req.Msg); err != nil {
		return nil, invalid(err)
	}
	res, err := a.write(ctx, &fsmv1.CancelTask{
		TaskId:    req.Msg.GetTaskId(),
		Reason:    req.Msg.GetReason(),
		RequestId: requestID(req.Msg.GetRequestId()),
		Time:      a.now(),
	})
	if err != nil {
		return nil, err
	}
	// The local replica's copy when it has caught up with the cancel (it
	// may be newer still), else the one the write answered with: a follower
	// a moment behind showed the task as before its cancel. A repeated
	// request's answer is only the task's id and next seq (the FSM keeps
	// no more for it), so then the local copy it is, if there is one.
	t := res.GetTask()
	if local, err := a.s.fsm.Task(req.Msg.GetTaskId()); err == nil && (local.GetNextSeq() >= t.GetNextSeq() || t.GetSpec() == nil) {
		t = local
	}
	return connect.NewResponse(&warrenv1.CancelTaskResponse{Task: t}), nil
}

// streamBatch is how many events a stream reads from Pebble at a time.
const streamBatch = 256

// tail calls send for every event of task id with seq > after, in order,
// then waits for more, and returns nil after the event that made the task
// terminal. It reads the local replica, whose events are gapless, so a
// stream never skips or repeats a seq; a client that reconnects elsewhere
// passes the last seq it saw.
func (s *Server) tail(ctx context.Context, id string, after uint64, send func(*warrenv1.Event) error) error {
	for {
		more, err := s.tailOnce(ctx, id, &after, send)
		if !more || err != nil {
			return err
		}
	}
}

// tailOnce sends the events after *after that are there now, and waits
// for the task's next change if it has not ended; it reports whether to
// go on.
func (s *Server) tailOnce(ctx context.Context, id string, after *uint64, send func(*warrenv1.Event) error) (bool, error) {
	wake, release := s.fsm.WatchTask(id)
	defer release()
	check := s.readGuard()
	t, err := s.fsm.Task(id) // read the task before its events
	if err != nil {
		return false, cmp.Or(check(), err)
	}
	evs, full, err := s.fsm.EventsPage(id, *after, streamBatch, streamPageBytes)
	if err = cmp.Or(check(), err); err != nil {
		return false, err
	}
	for _, ev := range evs {
		if err := send(ev); err != nil {
			return false, err
		}
		*after = ev.GetSeq()
	}
	if full {
		return true, nil
	}
	if Terminal(t.GetState()) && *after >= t.GetNextSeq()-1 {
		return false, nil
	}
	tick := time.NewTicker(streamLeaderSilence / 4)
	defer tick.Stop()
	for {
		select {
		case <-wake:
			return true, nil
		case <-ctx.Done():
			return false, ctx.Err()
		case <-s.stop:
			return false, connect.NewError(connect.CodeUnavailable, errors.New("server shutting down; reconnect with after_seq"))
		case <-tick.C:
			// A follower cut off from the leader applies nothing more:
			// its streams would wait, silent, while the task goes on
			// elsewhere. They end, so that clients go to another server.
			if silent := s.leaderSilence(); silent > streamLeaderSilence {
				return false, connect.NewError(connect.CodeUnavailable, fmt.Errorf(
					"this server has not heard from a leader for %v; reconnect to another with after_seq", silent.Round(time.Second)))
			}
		}
	}
}

// DefaultMaxStreams bounds the event streams (StreamEvents and SSE) one
// server serves at once (Config.MaxStreams, --max-streams). Each holds a
// goroutine, a watch of its task and a connection or HTTP/2 stream; an
// agent task's step holds one (its cancel watch), so the default leaves
// room for 40,000 running tasks on one server and their watchers.
const DefaultMaxStreams = 100_000

// takeStream counts an event stream against the server's limit; the
// caller calls release when the stream ends. Past the limit it answers
// unavailable, which sends warren's clients to another server.
func (s *Server) takeStream() (release func(), err error) {
	limit := int64(s.cfg.MaxStreams)
	if limit <= 0 {
		limit = DefaultMaxStreams
	}
	if s.streams.Add(1) > limit {
		s.streams.Add(-1)
		return nil, connect.NewError(connect.CodeUnavailable, fmt.Errorf(
			"this server serves %d event streams, its limit (--max-streams); reconnect to another server, or later", limit))
	}
	return func() { s.streams.Add(-1) }, nil
}

// streamLeaderSilence is how long a follower's streams wait without
// hearing from a leader before they end (a variable for tests).
var streamLeaderSilence = 10 * time.Second

// leaderSilence is how long ago this server last heard from a leader: 0
// on the leader itself.
func (s *Server) leaderSilence() time.Duration {
	if s.raft.State() == raft.Leader {
		return 0
	}
	return time.Since(s.raft.LastContact())
}

// MaxListEvents bounds one ListEvents page.
const MaxListEvents = 1000

func (a taskAPI) ListEvents(ctx context.Context, req *connect.Request[warrenv1.ListEventsRequest]) (*connect.Response[warrenv1.ListEventsResponse], error) {
	var p problems
	p.taskID("task_id", req.Msg.GetTaskId())
	if req.Msg.GetLimit() > MaxListEvents {
		p.add("limit", "%d is over the maximum of %d", req.Msg.GetLimit(), MaxListEvents)
	}
	if err := p.err(); err != nil {
		return nil, invalid(err)
	}
	limit := int(req.Msg.GetLimit())
	if limit == 0 {
		limit = 100
	}
	read := func() ([]*warrenv1.Event, error) {
		check := a.s.readGuard()
		evs, _, err := a.s.fsm.EventsPage(req.Msg.GetTaskId(), req.Msg.GetAfterSeq(), limit, maxListBytes)
		return evs, cmp.Or(check(), err)
	}
	applied := a.s.fsm.Applied()
	evs, err := read()
	if err != nil {
		return nil, err
	}
	if len(evs) == 0 { // the end of the log, or no such task (yet, here)
		if _, err := a.s.readTask(ctx, req.Msg.GetTaskId()); err != nil {
			return nil, err
		}
		// Read again only if the replica applied more meanwhile (readTask
		// may have caught up with the leader): an empty page, the usual
		// answer to a poll at the log's end, is not read twice.
		if a.s.fsm.Applied() != applied {
			if evs, err = read(); err != nil {
				return nil, err
			}
		}
	}
	return connect.NewResponse(&warrenv1.ListEventsResponse{Events: evs}), nil
}

func (a taskAPI) StreamEvents(ctx context.Context, req *connect.Request[warrenv1.StreamEventsRequest], stream *connect.ServerStream[warrenv1.StreamEventsResponse]) error {
	var p problems
	p.taskID("task_id", req.Msg.GetTaskId())
	if err := p.err(); err != nil {
		return invalid(err)
	}
	// The slot first: a refusal past the limit costs no read.
	release, err := a.s.takeStream()
	if err != nil {
		return err
	}
	defer release()
	t, err := a.s.readTask(ctx, req.Msg.GetTaskId())
	if err != nil {
		return err
	}
	if _, err := a.s.checkResume(ctx, t, req.Msg.GetAfterSeq()); err != nil {
		return err
	}
	// The headers now, before any event: a client tells a server that
	// answers (with a quiet task) from one that hangs by them
	// (client.WatchOpenFor).
	if err := stream.Send(nil); err != nil {
		return err
	}
	return a.s.tail(ctx, req.Msg.GetTaskId(), req.Msg.GetAfterSeq(), func(ev *warrenv1.Event) error {
		return stream.Send(&warrenv1.StreamEventsResponse{Event: ev})
	})
}
