package scheduler

import (
	"net/http"
	"time"
)

// streamWriteTimeout bounds each write of an event stream (StreamEvents,
// the SSE gateway) to its client. A client that keeps its connection open
// but stops reading (a zero receive window) would otherwise block the
// stream's send for good, pinning its goroutine and the page of events it
// holds; past the timeout the write fails and the stream ends (the client
// resumes with its last seq). A variable for tests.
var streamWriteTimeout = 30 * time.Second

// deadlineWriter gives each Write and Flush of a response its own write
// deadline, and clears it once the write is done: an HTTP/2 stream whose
// deadline passes is reset even while it waits, idle, for its next event.
type deadlineWriter struct {
	http.ResponseWriter
	rc *http.ResponseController
	d  time.Duration
}

func newDeadlineWriter(w http.ResponseWriter, d time.Duration) *deadlineWriter {
	return &deadlineWriter{ResponseWriter: w, rc: http.NewResponseController(w), d: d}
}

func (w *deadlineWriter) Write(p []byte) (int, error) {
	_ = w.rc.SetWriteDeadline(time.Now().Add(w.d))
	defer w.rc.SetWriteDeadline(time.Time{})
	return w.ResponseWriter.Write(p)
}

func (w *deadlineWriter) Flush() {
	_ = w.rc.SetWriteDeadline(time.Now().Add(w.d))
	defer w.rc.SetWriteDeadline(time.Time{})
	_ = w.rc.Flush()
}

// Unwrap lets http.ResponseController (connect-go's full duplex) reach
// the writer underneath.
func (w *deadlineWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// streamDeadlines gives the requests for procedure, and only those (the
// set and clear cost each write something), a deadlineWriter.
func streamDeadlines(procedure string, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == procedure {
			w = newDeadlineWriter(w, streamWriteTimeout)
		}
		h.ServeHTTP(w, r)
	})
}
