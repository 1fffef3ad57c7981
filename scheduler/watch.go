package scheduler

import "sync"

// watchers wakes streams when a task changes. A stream takes the channel
// for its task before it reads, then waits on it; the next apply that
// touches the task closes it. Nothing is lost between the read and the wait.
type watchers struct {
	mu     sync.Mutex
	byTask map[string]chan struct{}
	// applied is closed and replaced after every applied batch.
	applied chan struct{}
}

func newWatchers() *watchers {
	return &watchers{byTask: map[string]chan struct{}{}, applied: make(chan struct{})}
}

// task returns a channel closed at the next change of task id.
func (w *watchers) task(id string) <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	ch, ok := w.byTask[id]
	if !ok {
		ch = make(chan struct{})
		w.byTask[id] = ch
	}
	return ch
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
		if ch, ok := w.byTask[id]; ok {
			close(ch)
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
	for id, ch := range w.byTask {
		close(ch)
		delete(w.byTask, id)
	}
	close(w.applied)
	w.applied = make(chan struct{})
}
