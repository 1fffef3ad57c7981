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

// lateTask is a containerd task whose Pause and Resume outlast their
// context, and which the shim then carries out all the same; its Status
// answers only a context that has not ended.
type lateTask struct {
	containerd.Task
	state   *containerd.ProcessStatus
	resumed *int
}

func (l lateTask) Pause(ctx context.Context) error {
	<-ctx.Done()
	*l.state = containerd.Paused
	return ctx.Err()
}

func (l lateTask) Resume(ctx context.Context) error {
	*l.resumed++
	<-ctx.Done()
	*l.state = containerd.Running
	return ctx.Err()
}

func (l lateTask) Status(ctx context.Context) (containerd.Status, error) {
	if err := ctx.Err(); err != nil {
		return containerd.Status{}, err
	}
	return containerd.Status{Status: *l.state}, nil
}

// A pause (or resume) that outlasts its time but that the shim carries
// out leaves the box in the container's state. Before, the box asked the
// task's state with the change's context, already ended, so it stayed
// "running" while frozen, and a resume returned at once without thawing.
func TestAChangeThatOutlastsItsTimeSettlesTheState(t *testing.T) {
	old := lifecycleWait
	lifecycleWait = 50 * time.Millisecond
	defer func() { lifecycleWait = old }()
	state, resumed := containerd.Running, 0
	b := &Box{id: "sb-late", state: "running", task: lateTask{state: &state, resumed: &resumed}}
	if err := b.Pause(context.Background()); err == nil {
		t.Fatal("a pause past its time returned no error")
	}
	if got := b.Info().State; got != "paused" {
		t.Fatalf("after a pause the shim carried out late: state %q, want paused", got)
	}
	if err := b.Resume(context.Background()); err == nil {
		t.Fatal("a resume past its time returned no error")
	}
	if resumed != 1 {
		t.Fatalf("the resume reached the task %d times, want 1", resumed)
	}
	if got := b.Info().State; got != "running" {
		t.Fatalf("after a resume the shim carried out late: state %q, want running", got)
	}
}
