package main

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"connectrpc.com/connect"

	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
	"github.com/warrenhq/warren/api/gen/warren/v1/warrenv1connect"
)

// lostAnswers is a TaskService that records each write's request id and
// answers none of them: each waits until its caller gives up, as a write
// that may commit after the client's deadline does.
type lostAnswers struct {
	warrenv1connect.UnimplementedTaskServiceHandler
	mu  sync.Mutex
	ids []string
}

func (l *lostAnswers) lose(ctx context.Context, id string) error {
	l.mu.Lock()
	l.ids = append(l.ids, id)
	l.mu.Unlock()
	<-ctx.Done()
	return connect.NewError(connect.CodeUnavailable, ctx.Err())
}

func (l *lostAnswers) last() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.ids) == 0 {
		return ""
	}
	return l.ids[len(l.ids)-1]
}

func (l *lostAnswers) CreateTask(ctx context.Context, req *connect.Request[warrenv1.CreateTaskRequest]) (*connect.Response[warrenv1.CreateTaskResponse], error) {
	return nil, l.lose(ctx, req.Msg.GetRequestId())
}

func (l *lostAnswers) SendMessage(ctx context.Context, req *connect.Request[warrenv1.SendMessageRequest]) (*connect.Response[warrenv1.SendMessageResponse], error) {
	return nil, l.lose(ctx, req.Msg.GetRequestId())
}

func (l *lostAnswers) Approve(ctx context.Context, req *connect.Request[warrenv1.DecideRequest]) (*connect.Response[warrenv1.DecideResponse], error) {
	return nil, l.lose(ctx, req.Msg.GetRequestId())
}

func (l *lostAnswers) CancelTask(ctx context.Context, req *connect.Request[warrenv1.CancelTaskRequest]) (*connect.Response[warrenv1.CancelTaskResponse], error) {
	return nil, l.lose(ctx, req.Msg.GetRequestId())
}

// A write whose answer never came may have been applied: its error names
// the request id it was sent with, and --request-id sends it again with
// that id, so running it again applies it at most once. Before, the id
// was random and never shown (steer, approve and cancel had no flag), so
// running a lost create again made a second task.
func TestAnUnsureWriteNamesItsRequestID(t *testing.T) {
	la := &lostAnswers{}
	mux := http.NewServeMux()
	mux.Handle(warrenv1connect.NewTaskServiceHandler(la))
	hs := httptest.NewServer(mux)
	defer hs.Close()
	const id = "01J00000000000000000000000"
	for _, args := range [][]string{
		{"task", "create", "--repo", "https://git.example.com/a/b.git", "--base", "main", "--title", "t"},
		{"task", "steer", id, "use the other API"},
		{"task", "approve", id, "call-1"},
		{"task", "cancel", id},
	} {
		name := strings.Join(args[:2], " ")
		var out, errb bytes.Buffer
		err := run(append(args, "--server", hs.URL, "--timeout", "300ms"), &out, &errb)
		sent := la.last()
		if err == nil || sent == "" || !strings.Contains(err.Error(), "--request-id "+sent) {
			t.Errorf("%s with its answer lost: %v; want an error naming --request-id %s", name, err, sent)
			continue
		}
		_ = run(append(args, "--server", hs.URL, "--timeout", "300ms", "--request-id", sent), &out, &errb)
		if again := la.last(); again != sent {
			t.Errorf("%s --request-id %s sent request id %q", name, sent, again)
		}
	}
}
