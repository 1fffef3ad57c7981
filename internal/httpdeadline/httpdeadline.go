// Package httpdeadline bounds each write of an HTTP response. A client
// that keeps its connection open but stops reading (a zero receive
// window) would otherwise block the response's next write for good,
// pinning the handler's goroutine and whatever it holds (a task's watch
// and a page of events; a sandbox command's call to its guest; a file
// being answered and its room in the sandbox API's gate); past the
// timeout the write fails and the handler ends.
package httpdeadline

import (
	"net/http"
	"time"
)

// Writer gives each Write (each piece of a large one) and Flush of a
// response its own write deadline, and clears it once the write is done:
// an HTTP/2 stream whose deadline passes is reset even while it waits,
// idle, for its next message.
type Writer struct {
	http.ResponseWriter
	rc *http.ResponseController
	d  time.Duration
}

// NewWriter wraps w with a deadline of d for each write.
func NewWriter(w http.ResponseWriter, d time.Duration) *Writer {
	return &Writer{ResponseWriter: w, rc: http.NewResponseController(w), d: d}
}

// piece is the most of a write that one deadline covers: a large write
// (a whole 32 MiB file in one answer) goes out in pieces, each within the
// timeout, so a client that reads slowly but steadily gets it (a piece in
// 30 s is 35 KB/s), and one that stops reading is cut off a timeout later.
const piece = 1 << 20

func (w *Writer) Write(p []byte) (n int, err error) {
	defer w.rc.SetWriteDeadline(time.Time{})
	for {
		k := min(len(p), piece)
		_ = w.rc.SetWriteDeadline(time.Now().Add(w.d))
		m, err := w.ResponseWriter.Write(p[:k])
		n += m
		if err != nil || k == len(p) {
			return n, err
		}
		p = p[k:]
	}
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
