package scheduler

import "testing"

// A task's channel stays while anyone holds it, goes with its last holder,
// and a holder of a channel a change already closed does not remove the
// next one.
func TestWatchersLetGo(t *testing.T) {
	w := newWatchers()
	ch, release1 := w.task("a")
	_, release2 := w.task("a")
	release1()
	if n := w.watched(); n != 1 {
		t.Fatalf("with one holder left: %d watched, want 1", n)
	}
	w.notify(map[string]struct{}{"a": {}})
	select {
	case <-ch:
	default:
		t.Fatal("the change did not close the channel")
	}
	_, release3 := w.task("a") // a new channel for the next change
	release2()
	if n := w.watched(); n != 1 {
		t.Fatalf("an old holder let go: %d watched, want the new channel's 1", n)
	}
	release3()
	if n := w.watched(); n != 0 {
		t.Fatalf("all let go: %d watched, want 0", n)
	}
}
