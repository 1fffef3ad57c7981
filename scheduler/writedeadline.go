package scheduler

import (
	"net/http"
	"time"

	"github.com/warrenhq/warren/internal/httpdeadline"
)

// streamWriteTimeout bounds each write of a stream to its client: event
// streams (StreamEvents, the SSE gateway) and a sandbox command's output
// (SandboxService.Exec); and each write (each MiB) of a sandbox ReadFile's
// or ListFiles' answer. A client that keeps its connection open but stops
// reading would otherwise block the stream's send for good; past the
// timeout the write fails and the stream ends (an event stream's client
// resumes with its last seq). A variable for tests.
var streamWriteTimeout = 30 * time.Second

func writeTimeout() time.Duration { return streamWriteTimeout }

// newDeadlineWriter is httpdeadline.NewWriter (for the SSE gateway).
func newDeadlineWriter(w http.ResponseWriter, d time.Duration) *httpdeadline.Writer {
	return httpdeadline.NewWriter(w, d)
}

// streamDeadlines gives the requests for procedures, and only those, a
// deadline on each write.
func streamDeadlines(h http.Handler, procedures ...string) http.Handler {
	return httpdeadline.For(h, writeTimeout, procedures...)
}
