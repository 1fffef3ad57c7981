package scheduler

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/warrenhq/warren/api"
	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
)

// sseHandler serves GET /v1/tasks/{id}/events as Server-Sent Events: each
// event's `id:` is its seq, so a client resumes with Last-Event-ID (or
// ?after=SEQ). After the event that made the task terminal it sends
// `event: end` and closes. A comment line every 15 s keeps proxies open.
// HEAD (which the mux routes here too) gets the status and headers a GET
// would, and no stream. Errors are plain text, "code: message", with the
// HTTP status Connect gives the code (see sseError).
type sseHandler struct{ s *Server }

const sseKeepAlive = 15 * time.Second

func (h sseHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	var p problems
	p.taskID("id", id)
	after, err := sseAfter(r)
	p.addErr(err)
	if err := p.err(); err != nil {
		sseError(w, invalid(err))
		return
	}
	t, err := h.s.readTask(r.Context(), id)
	if err == nil {
		t, err = h.s.checkResume(r.Context(), t, after)
	}
	if err != nil {
		sseError(w, err)
		return
	}
	// A task that has ended, with nothing after the resume point: 204 tells
	// an EventSource to stop reconnecting (it would reconnect after the
	// `end` event and the close, get `end` again, and so on).
	if Terminal(t.GetState()) && after >= t.GetNextSeq()-1 {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	if _, ok := w.(http.Flusher); !ok {
		http.Error(w, "internal: streaming unsupported", http.StatusInternalServerError)
		return
	}
	release, err := h.s.takeStream()
	if err != nil {
		sseError(w, err)
		return
	}
	defer release()
	// Each write of the stream is bounded (streamWriteTimeout): a client
	// that stops reading ends its stream instead of holding it for good.
	dw := newDeadlineWriter(w, streamWriteTimeout)
	var fl http.Flusher = dw
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	if r.Method == http.MethodHead {
		// net/http drops a HEAD's body: tailing the task would hold the
		// connection and a watch of the task until it ended, for nothing.
		return
	}
	fmt.Fprint(dw, "retry: 1000\n\n")
	fl.Flush()

	// The keep-alive goroutine and the sender share w; mu orders them, and
	// the handler waits for the goroutine before it returns.
	var mu sync.Mutex
	write := func(format string, args ...any) error {
		mu.Lock()
		defer mu.Unlock()
		if _, err := fmt.Fprintf(dw, format, args...); err != nil {
			return err
		}
		fl.Flush()
		return nil
	}
	ctx, cancel := context.WithCancel(r.Context())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(sseKeepAlive)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				_ = write(": keepalive\n\n")
			}
		}
	}()
	err = h.s.tail(ctx, id, after, func(ev *warrenv1.Event) error {
		b, err := api.MarshalEvent(ev)
		if err != nil {
			return err
		}
		return write("id: %d\nevent: %s\ndata: %s\n\n", ev.GetSeq(), ev.GetKind(), b)
	})
	cancel()
	wg.Wait()
	switch {
	case err == nil:
		_ = write("event: end\ndata: {}\n\n")
	case !errors.Is(err, context.Canceled):
		h.s.log.Debug("sse stream ended", "task", id, "err", err)
	}
}

// sseError answers a request the stream cannot start for: err mapped by
// toConnect, as the Connect API would answer it, with the HTTP status the
// Connect protocol gives its code and a body naming the code. Unavailable
// (a restore overlapped the read, no leader yet) adds Retry-After: 1.
func sseError(w http.ResponseWriter, err error) {
	var ce *connect.Error
	if !errors.As(toConnect(err), &ce) {
		ce = connect.NewError(connect.CodeInternal, err)
	}
	if ce.Code() == connect.CodeUnavailable {
		w.Header().Set("Retry-After", "1")
	}
	http.Error(w, ce.Error(), httpStatus(ce.Code()))
}

// httpStatus is the HTTP status the Connect protocol gives code (its
// spec's table; connect-go keeps its own unexported). Canceled's 499 is
// nginx's "client closed request".
func httpStatus(code connect.Code) int {
	switch code {
	case connect.CodeCanceled:
		return 499
	case connect.CodeInvalidArgument, connect.CodeFailedPrecondition, connect.CodeOutOfRange:
		return http.StatusBadRequest
	case connect.CodeDeadlineExceeded:
		return http.StatusGatewayTimeout
	case connect.CodeNotFound:
		return http.StatusNotFound
	case connect.CodeAlreadyExists, connect.CodeAborted:
		return http.StatusConflict
	case connect.CodePermissionDenied:
		return http.StatusForbidden
	case connect.CodeResourceExhausted:
		return http.StatusTooManyRequests
	case connect.CodeUnimplemented:
		return http.StatusNotImplemented
	case connect.CodeUnavailable:
		return http.StatusServiceUnavailable
	case connect.CodeUnauthenticated:
		return http.StatusUnauthorized
	}
	return http.StatusInternalServerError // internal, unknown, data_loss
}

// sseAfter reads the resume point: Last-Event-ID wins over ?after=.
func sseAfter(r *http.Request) (uint64, error) {
	field, v := "Last-Event-ID", r.Header.Get("Last-Event-ID")
	if v == "" {
		field, v = "after", r.URL.Query().Get("after")
	}
	if v == "" {
		return 0, nil
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s: %q is not a sequence number", field, v)
	}
	return n, nil
}
