// Package httpdeadline bounds each write of a streaming HTTP response. A
// client that keeps its connection open but stops reading (a zero receive
// window) would otherwise block the stream's next write for good, pinning
// the handler's goroutine and whatever it holds (a task's watch and a page
// of events; a sandbox command's call to its guest); past the timeout the
// write fails and the handler ends.
package httpdeadline

import (
	"net/http"
	"time"
)

// Writer gives each Write and Flush of a response its own write deadline,
// and clears it once the write is done: an HTTP/2 stream whose deadline
// passes is reset even while it waits, idle, for its next message.
type Writer struct {
	http.ResponseWriter
	rc *http.ResponseController
	d  time.Duration
}

// NewWriter wraps w with a deadline of d for each write.
func NewWriter(w http.ResponseWriter, d time.Duration) *Writer {
	return &Writer{ResponseWriter: w, rc: http.NewResponseController(w), d: d}
}

func (w *Writer) Write(p []byte) (int, error) {
	_ = w.rc.SetWriteDeadline(time.Now().Add(w.d))
	defer w.rc.SetWriteDeadline(time.Time{})
	return w.ResponseWriter.Write(p)
}

// Flush flushes within the deadline too.
func (w *Writer) Flush() {
	_ = w.rc.SetWriteDeadline(time.Now().Add(w.d))
	defer w.rc.SetWriteDeadline(time.Time{})
	_ = w.rc.Flush()
}

// Unwrap lets http.ResponseController (connect-go's full duplex) reach
// the writer underneath.
func (w *Writer) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// For gives the requests for the given paths, and only those (the set and
// clear cost each write something), a Writer whose timeout is d(), read
// for each request.
func For(h http.Handler, d func() time.Duration, paths ...string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for _, p := range paths {
			if r.URL.Path == p {
				w = NewWriter(w, d())
				break
			}
		}
		h.ServeHTTP(w, r)
	})
}
