package scheduler

import (
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
	"github.com/warrenhq/warren/api/gen/warren/v1/warrenv1connect"
)

// Checks that HEAD of a task's SSE stream (curl -I, a health probe)
// answers at once with the status and headers a GET would get, without
// tailing the task: the connection is reusable afterwards and no watch of
// the task is left behind. Before, the handler streamed into net/http's
// discarded HEAD body until the task ended.
func TestSSEHeadAnswersWithoutStreaming(t *testing.T) {
	n := startSingle(t)
	live := createVia(t, n, 1).GetId()
	ended := createVia(t, n, 2).GetId()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := n.tasks.CancelTask(ctx, connect.NewRequest(&warrenv1.CancelTaskRequest{TaskId: ended})); err != nil {
		t.Fatal(err)
	}
	c := &http.Client{Timeout: 3 * time.Second}
	for _, tc := range []struct {
		name, path string
		status     int
		ctype      string
	}{
		{"live task", "/v1/tasks/" + live + "/events", http.StatusOK, "text/event-stream"},
		{"ended task, resumed at its end", "/v1/tasks/" + ended + "/events?after=1000", http.StatusNoContent, ""},
		{"missing task", "/v1/tasks/01J00000000000000000000000/events", http.StatusNotFound, "text/plain; charset=utf-8"},
		{"bad resume point", "/v1/tasks/" + live + "/events?after=x", http.StatusBadRequest, "text/plain; charset=utf-8"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := c.Head(n.url + tc.path)
			if err != nil {
				t.Fatalf("HEAD: %v", err)
			}
			resp.Body.Close()
			if resp.StatusCode != tc.status || resp.Header.Get("Content-Type") != tc.ctype {
				t.Errorf("HEAD: %d %q; want %d %q", resp.StatusCode, resp.Header.Get("Content-Type"), tc.status, tc.ctype)
			}
			// The same client reuses the connection the HEAD went over.
			hr, err := c.Get(n.url + "/healthz")
			if err != nil {
				t.Fatalf("GET /healthz after the HEAD, same client: %v", err)
			}
			_, _ = io.Copy(io.Discard, hr.Body)
			hr.Body.Close()
		})
	}
	c.CloseIdleConnections() // goleak: no keep-alive readers left
	waitFor(t, "the HEADs to hold no watch", 3*time.Second, func() bool { return n.srv.FSM().watch.watched() == 0 })
}

// Checks that methods other than GET and HEAD on the SSE route get 405
// with an Allow header, not the stream.
func TestSSEOtherMethodsAreNotAllowed(t *testing.T) {
	n := startSingle(t)
	id := createVia(t, n, 1).GetId()
	for _, m := range []string{http.MethodPost, http.MethodPut, http.MethodDelete} {
		req, _ := http.NewRequest(m, n.url+"/v1/tasks/"+id+"/events", nil)
		resp, err := (&http.Client{Timeout: 3 * time.Second}).Do(req)
		if err != nil {
			t.Fatalf("%s: %v", m, err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != "GET, HEAD" {
			t.Errorf("%s: %d, Allow %q; want 405, Allow \"GET, HEAD\"", m, resp.StatusCode, resp.Header.Get("Allow"))
		}
	}
}

// Checks that a read a snapshot restore overlapped (errRestoring, which
// the Connect API reports as unavailable) is 503 with Retry-After over
// SSE, with a body naming the code, as every error goes through toConnect;
// it was 500 "internal: unavailable: …".
func TestSSEDuringARestoreIsUnavailable(t *testing.T) {
	n := startSingle(t)
	task := createVia(t, n, 1)
	f := n.srv.FSM()
	f.restores.Add(1) // as Restore does while it runs
	defer f.restores.Add(1)
	resp, err := http.Get(n.url + "/v1/tasks/" + task.GetId() + "/events")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "1" || !strings.HasPrefix(string(body), "unavailable: ") {
		t.Errorf("SSE during a restore: %d, Retry-After %q, body %q; want 503, 1, \"unavailable: …\"",
			resp.StatusCode, resp.Header.Get("Retry-After"), strings.TrimSpace(string(body)))
	}
}

// Checks httpStatus against the Connect protocol's code-to-status table.
func TestHTTPStatusOfConnectCodes(t *testing.T) {
	for code, want := range map[connect.Code]int{
		connect.CodeCanceled:           499,
		connect.CodeUnknown:            500,
		connect.CodeInvalidArgument:    400,
		connect.CodeDeadlineExceeded:   504,
		connect.CodeNotFound:           404,
		connect.CodeAlreadyExists:      409,
		connect.CodePermissionDenied:   403,
		connect.CodeResourceExhausted:  429,
		connect.CodeFailedPrecondition: 400,
		connect.CodeAborted:            409,
		connect.CodeOutOfRange:         400,
		connect.CodeUnimplemented:      501,
		connect.CodeInternal:           500,
		connect.CodeUnavailable:        503,
		connect.CodeDataLoss:           500,
		connect.CodeUnauthenticated:    401,
	} {
		if got := httpStatus(code); got != want {
			t.Errorf("httpStatus(%s) = %d, want %d", code, got, want)
		}
	}
}

// A resume point past a live task's last event is refused, out_of_range,
// by StreamEvents and by the SSE gateway: tailing from it would skip the
// events up to it without a word. One the task reaches within the wait
// (a client that got it from a server ahead of this one) is served.
func TestResumePastALiveTasksEndIsRefused(t *testing.T) {
	n := startSingle(t)
	task := createVia(t, n, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	last := task.GetNextSeq() - 1
	st, err := n.tasks.StreamEvents(ctx, connect.NewRequest(&warrenv1.StreamEventsRequest{TaskId: task.GetId(), AfterSeq: last + 5}))
	if err != nil {
		t.Fatal(err)
	}
	for st.Receive() {
		t.Errorf("an event past the resume point: %v", st.Msg().GetEvent())
	}
	if err := st.Err(); connect.CodeOf(err) != connect.CodeOutOfRange || !strings.Contains(err.Error(), "after_seq") ||
		!strings.Contains(err.Error(), "past task") {
		t.Errorf("StreamEvents after_seq %d of %d: %v; want out_of_range naming after_seq", last+5, last, err)
	}
	st.Close()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, n.url+"/v1/tasks/"+task.GetId()+"/events", nil)
	req.Header.Set("Last-Event-ID", strconv.FormatUint(last+1, 10))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), "out_of_range") {
		t.Errorf("SSE Last-Event-ID %d of %d: %d %q; want 400 out_of_range", last+1, last, resp.StatusCode, b)
	}
	// A point the task reaches while the server waits.
	go func() {
		time.Sleep(300 * time.Millisecond)
		_, _ = n.tasks.SendMessage(ctx, connect.NewRequest(&warrenv1.SendMessageRequest{TaskId: task.GetId(), Text: "one"}))
		_, _ = n.tasks.SendMessage(ctx, connect.NewRequest(&warrenv1.SendMessageRequest{TaskId: task.GetId(), Text: "two"}))
	}()
	st, err = n.tasks.StreamEvents(ctx, connect.NewRequest(&warrenv1.StreamEventsRequest{TaskId: task.GetId(), AfterSeq: last + 1}))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if !st.Receive() || st.Msg().GetEvent().GetSeq() != last+2 {
		t.Errorf("after_seq %d, reached within the wait: %v %v; want seq %d", last+1, st.Msg().GetEvent(), st.Err(), last+2)
	}
}

// The node list, like a task read, is unavailable while a snapshot
// restore runs (it empties the FSM's keyspace first): before, ListNodes
// answered with what had been copied back so far, maybe nothing, and OK.
func TestListNodesDuringARestoreIsUnavailable(t *testing.T) {
	n := startSingle(t)
	f := n.srv.FSM()
	f.restores.Add(1) // as Restore does while it runs
	defer f.restores.Add(1)
	c := warrenv1connect.NewClusterServiceClient(http.DefaultClient, n.url)
	if _, err := c.ListNodes(context.Background(), connect.NewRequest(&warrenv1.ListNodesRequest{})); connect.CodeOf(err) != connect.CodeUnavailable {
		t.Fatalf("ListNodes during a restore: %v, want unavailable", err)
	}
}
