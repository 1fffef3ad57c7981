package noded

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
	"github.com/warrenhq/warren/noded/driver/sim"
)

// A task that names a model on a node without a model provider fails,
// even when the servers refuse the failure's first append with an error
// the actor retries (here once, as internal). The retry came back to an
// actor that had not begun (the failure is written before it begins) and
// was dropped, so the task stayed placed for good.
func TestANoModelFailureIsRetried(t *testing.T) {
	var refused atomic.Bool
	wrap := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if strings.HasSuffix(r.URL.Path, "/AppendEventsBatch") && !refused.Load() {
				body, _ := io.ReadAll(r.Body)
				r.Body = io.NopCloser(bytes.NewReader(body))
				if bytes.Contains(body, []byte("/no-model")) && refused.CompareAndSwap(false, true) {
					w.Header().Set("Content-Type", "application/json")
					w.WriteHeader(http.StatusInternalServerError)
					io.WriteString(w, `{"code":"internal","message":"test: the first no-model append is refused"}`)
					return
				}
			}
			next.ServeHTTP(w, r)
		})
	}
	d, id := taskOnNode(t, sim.New(sim.Config{}), wrap, "no-model-retry",
		&warrenv1.TaskSpec{Repo: "https://example.com/r.git", Base: "main", IssueTitle: "a model", Driver: "sim", Model: "claude-test"})
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := d.cl.Tasks().GetTask(context.Background(), connect.NewRequest(&warrenv1.GetTaskRequest{Id: id}))
		if err != nil {
			t.Fatal(err)
		}
		if st := resp.Msg.GetTask().GetState(); st == warrenv1.TaskState_TASK_STATE_FAILED {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("task %s is %v 30 s on (the failure's append refused once: %v), want failed", id, st, refused.Load())
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !refused.Load() {
		t.Fatal("no append of the no-model failure was refused: the test did not exercise the retry")
	}
}
