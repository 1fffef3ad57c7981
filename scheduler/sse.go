package scheduler

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/warrenhq/warren/api"
	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
)

// sseHandler serves GET /v1/tasks/{id}/events as Server-Sent Events: each
// event's `id:` is its seq, so a client resumes with Last-Event-ID (or
// ?after=SEQ). After the event that made the task terminal it sends
// `event: end` and closes. A comment line every 15 s keeps proxies open.
type sseHandler struct{ s *Server }

const sseKeepAlive = 15 * time.Second

func (h sseHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	var p problems
	p.taskID("id", id)
	after, err := sseAfter(r)
	if err != nil {
		p = append(p, err)
	}
	if err := p.err(); err != nil {
		http.Error(w, "invalid_argument: "+err.Error(), http.StatusBadRequest)
		return
	}
	t, err := h.s.readTask(r.Context(), id)
	if errors.Is(err, ErrNotFound) {
		http.Error(w, "not_found: "+err.Error(), http.StatusNotFound)
		return
	} else if err != nil { // the replica cannot read it: not the client's fault
		http.Error(w, "internal: "+err.Error(), http.StatusInternalServerError)
		return
	}
	// A task that has ended, with nothing after the resume point: 204 tells
	// an EventSource to stop reconnecting (it would reconnect after the
	// `end` event and the close, get `end` again, and so on).
	if Terminal(t.GetState()) && after >= t.GetNextSeq()-1 {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	fl, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "internal: streaming unsupported", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	fmt.Fprint(w, "retry: 1000\n\n")
	fl.Flush()

	// The keep-alive goroutine and the sender share w; mu orders them, and
	// the handler waits for the goroutine before it returns.
	var mu sync.Mutex
	write := func(format string, args ...any) error {
		mu.Lock()
		defer mu.Unlock()
		if _, err := fmt.Fprintf(w, format, args...); err != nil {
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
