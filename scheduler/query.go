package scheduler

import (
	"context"
	"errors"
	"fmt"
	"math"

	"github.com/cockroachdb/pebble/v2"
	"google.golang.org/protobuf/proto"

	fsmv1 "github.com/warrenhq/warren/api/gen/warren/fsm/v1"
	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
)

// Queries read the local replica's applied state. They are safe from any
// goroutine and return fresh messages the caller owns.

func (f *FSM) getProto(k []byte, m proto.Message) error { return readProto(f.db, k, m) }

// readProto decodes the value at k in r into m, or returns ErrNotFound.
func readProto(r pebble.Reader, k []byte, m proto.Message) error {
	v, closer, err := r.Get(k)
	if errors.Is(err, pebble.ErrNotFound) {
		return ErrNotFound
	}
	if err != nil {
		return err
	}
	defer closer.Close()
	return proto.Unmarshal(v, m)
}

// Task returns a task or ErrNotFound. The record and the events it is
// caught up with (catchUp) are read from one snapshot.
func (f *FSM) Task(id string) (*warrenv1.Task, error) {
	snap := f.db.NewSnapshot()
	defer snap.Close()
	return taskAt(snap, id)
}

// taskAt reads task id as snap has it.
func taskAt(snap *pebble.Snapshot, id string) (*warrenv1.Task, error) {
	t := &warrenv1.Task{}
	if err := readProto(snap, keyTask(id), t); err != nil {
		return nil, fmt.Errorf("task %q: %w", id, err)
	}
	if err := catchUp(snap, t); err != nil {
		return nil, fmt.Errorf("task %q: %w", id, err)
	}
	return t, nil
}

// Events returns up to limit events of task id with seq > after, in order.
func (f *FSM) Events(id string, after uint64, limit int) ([]*warrenv1.Event, error) {
	evs, _, err := f.EventsPage(id, after, limit, 0)
	return evs, err
}

// eventWireOverhead bounds what an event of a page costs on the wire over
// its stored bytes: its task_id field's tag and length (the id itself is
// counted apart) and the list entry's tag and length.
const eventWireOverhead = 8

// EventsPage is Events with a byte budget: with maxBytes > 0 the page also
// ends before an event that would take the page's size on the wire (each
// event's stored bytes, its task id and their framing) past maxBytes (it
// always holds at least one event). full reports that the page ended at
// limit or maxBytes, so more events may follow.
func (f *FSM) EventsPage(id string, after uint64, limit, maxBytes int) (evs []*warrenv1.Event, full bool, err error) {
	if after == math.MaxUint64 { // after+1 would wrap to 0: every event
		return nil, false, nil
	}
	it, err := eventsFrom(f.db, id, after+1)
	if err != nil {
		return nil, false, err
	}
	defer it.Close()
	size := 0
	for ok := it.First(); ok; ok = it.Next() {
		v := it.Value()
		cost := len(v) + len(id) + eventWireOverhead
		if len(evs) == limit || maxBytes > 0 && len(evs) > 0 && size+cost > maxBytes {
			return evs, true, it.Error()
		}
		size += cost
		ev := &warrenv1.Event{}
		if err := proto.Unmarshal(v, ev); err != nil {
			return nil, false, fmt.Errorf("decode event %x: %w", it.Key(), err)
		}
		ev.TaskId = id
		evs = append(evs, ev)
	}
	return evs, false, it.Error()
}

// ListTasks returns up to limit tasks in id order (creation order), after
// the id `after`. With state unspecified it lists every state. next is the
// id to pass as after for the next page, or "" at the end. With maxBytes >
// 0 a page also ends before a task that would take its encoded size past
// maxBytes (it always holds at least one task).
func (f *FSM) ListTasks(state warrenv1.TaskState, after string, limit, maxBytes int) (tasks []*warrenv1.Task, next string, err error) {
	var lower, upper []byte
	var idOf func(k []byte) string
	if state == warrenv1.TaskState_TASK_STATE_UNSPECIFIED {
		lower, upper = []byte{prefixTask}, []byte{prefixTask + 1}
		idOf = func(k []byte) string { return string(k[1:]) }
	} else {
		lower = []byte{prefixState, byte(state)}
		upper = prefixEnd(lower)
		idOf = func(k []byte) string { return string(k[2:]) }
	}
	if after != "" {
		lower = append(append(append([]byte(nil), lower[:len(lower)]...), after...), 0)
	}
	// One snapshot for the index and the records: a task that changes
	// state meanwhile is listed as it was under the filter it matched (a
	// record read afresh could be in another state than the filter's).
	snap := f.db.NewSnapshot()
	defer snap.Close()
	it, err := snap.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: upper})
	if err != nil {
		return nil, "", err
	}
	defer it.Close()
	size := 0
	for ok := it.First(); ok; ok = it.Next() {
		if len(tasks) == limit {
			return tasks, tasks[len(tasks)-1].GetId(), nil
		}
		t, err := taskAt(snap, idOf(it.Key()))
		if err != nil {
			return nil, "", err
		}
		if maxBytes > 0 {
			n := proto.Size(t)
			if len(tasks) > 0 && size+n > maxBytes {
				return tasks, tasks[len(tasks)-1].GetId(), nil
			}
			size += n
		}
		tasks = append(tasks, t)
	}
	return tasks, "", it.Error()
}

// Member returns a server's recorded addresses or ErrNotFound.
func (f *FSM) Member(id string) (*fsmv1.Member, error) {
	m := &fsmv1.Member{}
	if err := f.getProto(keyMember(id), m); err != nil {
		return nil, fmt.Errorf("member %q: %w", id, err)
	}
	return m, nil
}

// WatchTask returns a channel closed at the next change to task id, and
// the call that lets go of it. Take it before reading, then wait on it,
// then let go.
func (f *FSM) WatchTask(id string) (<-chan struct{}, func()) { return f.watch.task(id) }

// WaitApplied blocks until the applied index reaches idx or ctx ends.
func (f *FSM) WaitApplied(ctx context.Context, idx uint64) error {
	for {
		ch := f.watch.next()
		if f.Applied() >= idx {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
