package client_test

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"connectrpc.com/connect"

	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
	"github.com/warrenhq/warren/api/gen/warren/v1/warrenv1connect"
	"github.com/warrenhq/warren/client"
)

// getTaskServer is a TaskService whose GetTask answers a task of its id.
type getTaskServer struct {
	warrenv1connect.UnimplementedTaskServiceHandler
}

func (getTaskServer) GetTask(_ context.Context, req *connect.Request[warrenv1.GetTaskRequest]) (*connect.Response[warrenv1.GetTaskResponse], error) {
	return connect.NewResponse(&warrenv1.GetTaskResponse{Task: &warrenv1.Task{Id: req.Msg.GetId()}}), nil
}

// Read moves past a server that stopped (connection refused) and one that
// takes connections but never answers (lost power behind a kept
// connection, say), to a live one, and stays there. Node daemons read
// through it: their appends follow the leader, so before it nothing moved
// their reads off a follower that died, and every read failed against it
// for as long as it was gone.
func TestReadMovesPastServersThatAreGone(t *testing.T) {
	old := client.ReadAttempt
	client.ReadAttempt = 300 * time.Millisecond
	t.Cleanup(func() { client.ReadAttempt = old })

	stopped := httptest.NewServer(http.NotFoundHandler())
	stopped.Close()
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	go func() { // accept, read nothing, answer nothing
		var held []net.Conn
		defer func() {
			for _, c := range held {
				c.Close()
			}
		}()
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			held = append(held, c)
		}
	}()
	mux := http.NewServeMux()
	mux.Handle(warrenv1connect.NewTaskServiceHandler(getTaskServer{}))
	live := httptest.NewServer(mux)
	defer live.Close()

	c, err := client.New(stopped.URL + ",http://" + silent.Addr().String() + "," + live.URL)
	if err != nil {
		t.Fatal(err)
	}
	read := func() error {
		return c.Read(context.Background(), func(ctx context.Context, tc warrenv1connect.TaskServiceClient) error {
			_, err := tc.GetTask(ctx, connect.NewRequest(&warrenv1.GetTaskRequest{Id: "t"}))
			return err
		})
	}
	start := time.Now()
	if err := read(); err != nil {
		t.Fatalf("Read: %v", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("Read took %v", took)
	}
	if c.URL() != live.URL {
		t.Errorf("the client's server is %s, want the live one %s", c.URL(), live.URL)
	}
	start = time.Now()
	if err := read(); err != nil || time.Since(start) > time.Second {
		t.Errorf("the next Read: %v after %v, want the live server's answer at once", err, time.Since(start))
	}

	// With one server, one attempt: the caller decides.
	one, err := client.New(stopped.URL)
	if err != nil {
		t.Fatal(err)
	}
	err = one.Read(context.Background(), func(ctx context.Context, tc warrenv1connect.TaskServiceClient) error {
		_, err := tc.GetTask(ctx, connect.NewRequest(&warrenv1.GetTaskRequest{Id: "t"}))
		return err
	})
	if connect.CodeOf(err) != connect.CodeUnavailable {
		t.Errorf("one stopped server: %v, want unavailable", err)
	}
}
