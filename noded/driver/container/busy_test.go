package container

import (
	"context"
	"testing"
	"time"

	"github.com/containerd/containerd"
)

// slowTask is a containerd task whose Pause and Resume wait for release:
// a shim freezing a busy container's processes.
type slowTask struct {
	containerd.Task
	entered chan string
	release chan struct{}
}

func (s slowTask) Pause(context.Context) error  { s.entered <- "pausing"; <-s.release; return nil }
func (s slowTask) Resume(context.Context) error { s.entered <- "resuming"; <-s.release; return nil }

// Info does not wait for a pause or resume under way: it says "pausing" or
// "resuming". Before, it waited for the lock the change held, and a node's
// list of its sandboxes waited with it, for as long as the shim took.
func TestInfoDoesNotWaitForAPauseOrResume(t *testing.T) {
	task := slowTask{entered: make(chan string), release: make(chan struct{})}
	b := &Box{id: "sb-busy", state: "running", task: task}
	for _, change := range []struct {
		do   func(context.Context) error
		want string
	}{{b.Pause, "paused"}, {b.Resume, "running"}} {
		done := make(chan error, 1)
		go func() { done <- change.do(context.Background()) }()
		busy := <-task.entered
		info := make(chan string, 1)
		go func() { info <- b.Info().State }()
		select {
		case got := <-info:
			if got != busy {
				t.Errorf("during the change: state %q, want %q", got, busy)
			}
		case <-time.After(2 * time.Second):
			close(task.release)
			t.Fatalf("Info waited for the %s", busy)
		}
		task.release <- struct{}{}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if got := b.Info().State; got != change.want {
			t.Errorf("after the change: state %q, want %q", got, change.want)
		}
	}
}
