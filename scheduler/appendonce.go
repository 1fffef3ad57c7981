package scheduler

import (
	"encoding/binary"
	"fmt"
	"hash/maphash"

	fsmv1 "github.com/warrenhq/warren/api/gen/warren/fsm/v1"
	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
)

// An append without expected_seq is applied once per request id, like every
// write, but it keeps no idempotency record: each event it writes carries
// its request id, so the log itself says which requests a task has seen.
// Finding a request id among a task's events is a scan, so reqIndex keeps,
// per task, the hashes of the request ids on its events, and the scan runs
// only on a hash hit (a retry, or a 64-bit collision). The index is a cache:
// a task's set is built from its events the first time it is needed after
// the process starts, and every replica scans the same events, so results
// stay identical whatever each one holds in memory. This saves a Pebble key
// per append on every replica (bench/README.md, eighteenth session).
type reqIndex struct {
	seed  maphash.Seed
	tasks map[string]*reqSet
	// ended lists the ended tasks whose sets are kept, oldest first. An
	// ended task takes no events, but a retry of the append that ended it
	// (or a late append) still looks it up; at most maxEndedReqSets are
	// kept, so memory follows the live tasks.
	ended []string
}

const maxEndedReqSets = 64

// appendScope is the idempotency scope of the records appends once kept.
const appendScope = "append/"

func newReqIndex() *reqIndex {
	return &reqIndex{seed: maphash.MakeSeed(), tasks: map[string]*reqSet{}}
}

func (x *reqIndex) hash(req string) uint64 { return maphash.String(x.seed, req) }

// reset forgets every set (after a snapshot replaced the database).
func (x *reqIndex) reset() {
	clear(x.tasks)
	x.ended = nil
}

// noted records that task id's events now carry req, if its set is loaded
// (an unloaded set is built from the events when needed).
func (x *reqIndex) noted(id, req string) {
	if s, ok := x.tasks[id]; ok {
		s.add(x.hash(req))
	}
}

// end moves a task's set to the bounded list of ended tasks.
func (x *reqIndex) end(id string) {
	if _, ok := x.tasks[id]; !ok {
		return
	}
	x.ended = append(x.ended, id)
	if len(x.ended) > maxEndedReqSets {
		delete(x.tasks, x.ended[0])
		x.ended = x.ended[1:]
	}
}

// mayHave is false only if no event of task t carries req.
func (a *applier) mayHave(t *warrenv1.Task, req string) bool {
	id := t.GetId()
	s, ok := a.reqs.tasks[id]
	if !ok {
		s = &reqSet{}
		a.eachRequestID(id, false, func(_ uint64, r string) bool {
			if r != "" {
				s.add(a.reqs.hash(r))
			}
			return true
		})
		a.reqs.tasks[id] = s
		if Terminal(t.GetState()) {
			a.reqs.end(id)
		}
	}
	return s.has(a.reqs.hash(req))
}

// appendOnce applies an append that names no expected_seq and carries a
// request id. A retry gets the seqs its first attempt was given, before
// the task's state is checked: the append being retried may have ended
// the task.
func (a *applier) appendOnce(m *fsmv1.AppendEvents) *fsmv1.Result {
	id, req := m.GetTaskId(), m.GetRequestId()
	// Appends applied before events carried their request id left a record.
	if a.idem.appends {
		var prev fsmv1.Result
		if a.getIdem(keyIdem(appendScope+id, req), &prev) {
			return &prev
		}
	}
	t, r := a.task(id)
	if r != nil {
		return r
	}
	if a.mayHave(t, req) {
		if first, last := a.findAppend(id, req); last != 0 {
			return &fsmv1.Result{FirstSeq: first, LastSeq: last, CancelRequested: t.GetCancelRequested()}
		}
	} else if invariants {
		if _, last := a.findAppend(id, req); last != 0 {
			panic(fmt.Sprintf("invariant: task %s has events of request %q its request index lacks", id, req))
		}
	}
	a.reqID = req
	defer func() { a.reqID = "" }()
	return a.appendEvents(m)
}

// findAppend returns the seqs of the last run of task id's events that
// carry req (0, 0 if none does), scanning back from the newest event: a
// retry usually follows its first attempt closely.
func (a *applier) findAppend(id, req string) (first, last uint64) {
	a.eachRequestID(id, true, func(seq uint64, r string) bool {
		if r != req {
			return last == 0 // past the run: stop
		}
		if last == 0 {
			last = seq
		}
		first = seq
		return true
	})
	return first, last
}

// eachRequestID calls fn with the seq and request id of each of task id's
// events, oldest first or (backward) newest first, until fn returns false.
// It reads only the request id of each (eventRequestID).
func (a *applier) eachRequestID(id string, backward bool, fn func(seq uint64, req string) bool) {
	a.flushEvents()
	it, err := eventsFrom(a.b, id, 1)
	if err != nil {
		panic(fmt.Sprintf("scheduler: task %s events: %v", id, err))
	}
	defer it.Close()
	first, next := it.First, it.Next
	if backward {
		first, next = it.Last, it.Prev
	}
	for ok := first(); ok; ok = next() {
		r, err := eventRequestID(it.Value())
		if err != nil {
			panic(fmt.Sprintf("scheduler: task %s event %x: %v", id, it.Key(), err))
		}
		if !fn(binary.BigEndian.Uint64(it.Key()[1+len(id):]), r) {
			break
		}
	}
	if err := it.Error(); err != nil {
		panic(fmt.Sprintf("scheduler: task %s events: %v", id, err))
	}
}
