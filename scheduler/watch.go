package scheduler

import "sync"

// watchers wakes streams when a task changes. A stream takes the channel
// for its task before it reads, then waits on it; the next apply that
// touches the task closes it. Nothing is lost between the read and the wait.
// Each channel counts its holders, and the last to let go of one that was
// never closed removes it: a stream of a task that does not exist, or
// that ended, would otherwise leave an entry behind for good.
type watchers struct {
	mu     sync.Mutex
	byTask map[string]*taskWatch
	// applied is closed and replaced after every applied batch.
	applied chan struct{}
}

type taskWatch struct {
	ch      chan struct{}
	holders int
}

func newWatchers() *watchers {
	return &watchers{byTask: map[string]*taskWatch{}, applied: make(chan struct{})}
}

// task returns a channel closed at the next change of task id, and the
// call that lets go of it (once the wait is over).
func (w *watchers) task(id string) (<-chan struct{}, func()) {
	w.mu.Lock()
	defer w.mu.Unlock()
	tw, ok := w.byTask[id]
	if !ok {
		tw = &taskWatch{ch: make(chan struct{})}
		w.byTask[id] = tw
	}
	tw.holders++
	return tw.ch, func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		if tw.holders--; tw.holders == 0 && w.byTask[id] == tw {
			delete(w.byTask, id)
		}
	}
}

// watched is how many tasks have a channel (for tests).
func (w *watchers) watched() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.byTask)
}

// next returns a channel closed after the next applied batch.
func (w *watchers) next() <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.applied
}

// notify wakes the watchers of the given tasks and of the applied index.
func (w *watchers) notify(ids map[string]struct{}) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for id := range ids {
		if tw, ok := w.byTask[id]; ok {
			close(tw.ch)
			delete(w.byTask, id)
		}
	}
	close(w.applied)
	w.applied = make(chan struct{})
}

// notifyAll wakes every watcher (after a snapshot restore).
func (w *watchers) notifyAll() {
	w.mu.Lock()
	defer w.mu.Unlock()
	for id, tw := range w.byTask {
		close(tw.ch)
		delete(w.byTask, id)
	}
	close(w.applied)
	w.applied = make(chan struct{})
}
