package client_test

import (
	"context"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"time"

	"connectrpc.com/connect"

	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
	"github.com/warrenhq/warren/client"
	"github.com/warrenhq/warren/scheduler"
)

// startDev starts a single-voter server in this process, as `warren dev`
// does, and returns its URL and a stop function.
func startDev() (string, func()) {
	dir, err := os.MkdirTemp("", "warren-example-")
	if err != nil {
		log.Fatal(err)
	}
	api, _ := net.Listen("tcp", "127.0.0.1:0")
	raftLn, _ := net.Listen("tcp", "127.0.0.1:0")
	raftAddr := raftLn.Addr().String()
	raftLn.Close()
	url := "http://" + api.Addr().String()
	srv, err := scheduler.Open(scheduler.Config{ID: "dev", DataDir: dir, RaftAddr: raftAddr, APIURL: url, Bootstrap: true, RaftLevel: "off"})
	if err != nil {
		log.Fatal(err)
	}
	hs := &http.Server{Handler: srv.Handler()}
	go hs.Serve(api)
	for srv.Status().GetLeaderApiUrl() == "" {
		time.Sleep(10 * time.Millisecond)
	}
	return url, func() { srv.Close(); hs.Close(); os.RemoveAll(dir) }
}

func Example() {
	url, stop := startDev()
	defer stop()

	c, err := client.New(url)
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	created, err := c.Tasks().CreateTask(ctx, connect.NewRequest(&warrenv1.CreateTaskRequest{
		RequestId: "example-1",
		Spec: &warrenv1.TaskSpec{
			Repo: "https://git.example.com/acme/calc.git", Base: "main",
			IssueTitle: "add() is wrong for negative numbers",
		},
	}))
	if err != nil {
		log.Fatal(err)
	}
	id := created.Msg.GetTask().GetId()
	if _, err := c.Tasks().SendMessage(ctx, connect.NewRequest(&warrenv1.SendMessageRequest{TaskId: id, Text: "check the sign handling"})); err != nil {
		log.Fatal(err)
	}
	if _, err := c.Tasks().CancelTask(ctx, connect.NewRequest(&warrenv1.CancelTaskRequest{TaskId: id, Reason: "example over"})); err != nil {
		log.Fatal(err)
	}
	// Watch returns once the task has ended and every event was delivered.
	err = c.Watch(ctx, id, 0, func(ev *warrenv1.Event) error {
		fmt.Println(ev.GetSeq(), ev.GetKind(), string(ev.GetPayload()))
		return nil
	}, nil)
	if err != nil {
		log.Fatal(err)
	}
	// Output:
	// 1 task_created {"base":"main","repo":"https://git.example.com/acme/calc.git","title":"add() is wrong for negative numbers"}
	// 2 message {"from":"user","text":"check the sign handling"}
	// 3 cancel_requested {"reason":"example over"}
	// 4 state_changed {"from":"pending","reason":"cancelled before placement","to":"cancelled"}
}
