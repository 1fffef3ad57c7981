package scheduler

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"

	"connectrpc.com/connect"
	"github.com/cockroachdb/pebble/v2"
	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	fsmv1 "github.com/warrenhq/warren/api/gen/warren/fsm/v1"
	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
)

// ErrStaleEpoch is the message of a refused append whose lease epoch is not
// the task's current one: the writer lost its lease.
var ErrStaleEpoch = errors.New("stale lease epoch")

// ErrSeqMismatch is the message of a refused append whose expected_seq is
// not the task's next seq (and which is not a retry of an applied append).
var ErrSeqMismatch = errors.New("seq mismatch")

// ErrNotFound is returned by queries for a task or member that does not exist.
var ErrNotFound = errors.New("not found")

// FSM is the replicated state machine. Raft calls ApplyBatch, Snapshot and
// Restore from one goroutine; the query methods are safe from any goroutine.
// Apply is idempotent on the raft index: entries at or below the persisted
// applied index are skipped, so a restart does not reapply the whole log.
type FSM struct {
	db      *pebble.DB
	log     *slog.Logger
	tmpDir  string // for snapshot checkpoints
	applied atomic.Uint64
	// restores counts the starts and ends of snapshot restores (odd while
	// one runs), so a read can tell whether one overlapped it: it could
	// have found tasks missing or old (see readGuard).
	restores atomic.Uint64
	// broken is set while the state is incomplete after a restore that
	// failed midway, until one succeeds: Snapshot refuses to take one of
	// it, and ApplyBatch panics rather than apply entries on top of it.
	broken atomic.Bool
	watch  *watchers
	idem   *idemSet  // FSM goroutine only
	reqs   *reqIndex // FSM goroutine only
	// live caches the record of every task that is not terminal and was
	// written or appended to since the process started (FSM goroutine
	// only). The applier reads a task from here instead of Pebble, where
	// under load the record is usually in an sstable block that is not
	// cached. An entry is the stored record caught up with the task's
	// events (catchUp: plain appends do not rewrite the record, see
	// applier.bumpTask); an applier uses it as the batch's working copy
	// (see applier.task).
	live   map[string]*warrenv1.Task
	noLive bool // benchmarks only: the baseline without the cache
	// unsorted makes the applier write events into the batch in the order
	// they were appended (benchmarks only: the baseline of sorting them).
	unsorted bool
	// evBuf and evs are the appliers' staging buffers for events, kept
	// between batches (FSM goroutine only; see applier.evs).
	evBuf []byte
	evs   []stagedEvent
	// lastReq remembers, for live tasks, the seq and request id of the
	// last event written since the process started (FSM goroutine only),
	// so a positioned append need not read the event before it.
	lastReq map[string]lastEvent
	// replanGen changes whenever placement could now place something it
	// could not before: a task became pending, or a node appeared, changed
	// or gained room. The leader's placement loop replans only then.
	replanGen atomic.Uint64
	stats     applyStats
	// poolsCh is closed, and forgotten, when the warm-pool targets change
	// (a SetPool applied, a snapshot restored); poolsChanged hands out the
	// current one. Under poolsMu.
	poolsMu sync.Mutex
	poolsCh chan struct{}
	// nodeRemoved, when set (before raft starts), is called on the FSM
	// goroutine with each node a committed batch removed, before
	// ApplyBatch returns: a session attaches only after its node's
	// registration is applied, so none of the id's registering again
	// (later in the batch or after it) has attached yet. The leader drops
	// its in-memory view of the node there.
	nodeRemoved func(id string)
}

// poolsChanged returns a channel closed at the next change of the
// warm-pool targets. Take it before reading them, so no change is missed.
func (f *FSM) poolsChanged() <-chan struct{} {
	f.poolsMu.Lock()
	defer f.poolsMu.Unlock()
	if f.poolsCh == nil {
		f.poolsCh = make(chan struct{})
	}
	return f.poolsCh
}

// notifyPools wakes poolsChanged's waiters.
func (f *FSM) notifyPools() {
	f.poolsMu.Lock()
	defer f.poolsMu.Unlock()
	if f.poolsCh != nil {
		close(f.poolsCh)
		f.poolsCh = nil
	}
}

// applyStats counts what the FSM applied since the process started: raft
// entries, the commands in them, and a histogram of commands per entry
// (bucket i holds entries of 2^(i-1) < n <= 2^i commands).
type applyStats struct {
	entries, commands atomic.Uint64
	perEntry          [16]atomic.Uint64
}

func (s *applyStats) add(n int) {
	s.entries.Add(1)
	s.commands.Add(uint64(n))
	b := 0
	for b < len(s.perEntry)-1 && 1<<b < n {
		b++
	}
	s.perEntry[b].Add(1)
}

// ApplyStats returns the entries and commands applied since start and the
// commands-per-entry histogram (bucket i: up to 2^i commands).
func (f *FSM) ApplyStats() (entries, commands uint64, perEntry []uint64) {
	perEntry = make([]uint64, len(f.stats.perEntry))
	for i := range perEntry {
		perEntry[i] = f.stats.perEntry[i].Load()
	}
	return f.stats.entries.Load(), f.stats.commands.Load(), perEntry
}

var _ raft.BatchingFSM = (*FSM)(nil)

// NewFSM opens the state machine over db. tmpDir holds snapshot checkpoints
// while they stream and must be on the same filesystem as db; it is the
// FSM's alone, and what a crash left there is removed here: a checkpoint
// is hard links to sstables, which would keep every one compaction has
// since dropped on the disk for good. (Raft keeps its own copy of each
// snapshot in its snapshot store.)
func NewFSM(db *pebble.DB, tmpDir string, log *slog.Logger) (*FSM, error) {
	if err := os.RemoveAll(tmpDir); err != nil {
		return nil, fmt.Errorf("remove what a crash left in %s: %w", tmpDir, err)
	}
	f := &FSM{db: db, log: log, tmpDir: tmpDir, watch: newWatchers(), idem: newIdemSet(), reqs: newReqIndex(), live: map[string]*warrenv1.Task{}, lastReq: map[string]lastEvent{}}
	if err := f.idem.load(db); err != nil {
		return nil, err
	}
	v, closer, err := db.Get(keyApplied)
	switch {
	case errors.Is(err, pebble.ErrNotFound):
	case err != nil:
		return nil, fmt.Errorf("read applied index: %w", err)
	default:
		if len(v) != 8 {
			closer.Close()
			return nil, fmt.Errorf("applied index: %d bytes, want 8", len(v))
		}
		f.applied.Store(binary.BigEndian.Uint64(v))
		closer.Close()
	}
	return f, nil
}

// Applied returns the raft index of the last applied entry.
func (f *FSM) Applied() uint64 { return f.applied.Load() }

// Apply applies one log entry. It returns []*fsmv1.Result, one per command.
func (f *FSM) Apply(l *raft.Log) interface{} {
	return f.ApplyBatch([]*raft.Log{l})[0]
}

// ApplyBatch applies committed entries in one Pebble batch. Each element of
// the returned slice is nil (skipped or not a command) or []*fsmv1.Result.
func (f *FSM) ApplyBatch(logs []*raft.Log) []interface{} {
	if f.broken.Load() {
		// Applied on top of a partial state, the entries would make a
		// state no other replica has, with an applied index past the
		// snapshot raft would restore next (which it would then skip).
		// The process ends instead; at its next start raft restores the
		// snapshot that failed (it is in the snapshot store before the
		// FSM restores it) in full, the applied index being gone, and
		// replays the log after it.
		panic(fmt.Sprintf("FSM: entry %d to apply on a state left incomplete by a snapshot restore that failed midway; restart the server, which restores the snapshot again", logs[0].Index))
	}
	out := make([]interface{}, len(logs))
	applied := f.applied.Load()
	b := f.db.NewIndexedBatch()
	defer b.Close()
	live := f.live
	if f.noLive {
		live = map[string]*warrenv1.Task{}
	}
	a := &applier{b: b, idem: f.idem, reqs: f.reqs, live: live, lastReq: f.lastReq, touched: map[string]struct{}{}, tasks: map[string]*cachedTask{}, nodes: map[string]*cachedNode{},
		evBuf: f.evBuf[:0], evs: f.evs[:0], unsorted: f.unsorted}
	defer f.keepStaging(a)
	last := applied
	for i, l := range logs {
		if invariants && i > 0 && l.Index <= logs[i-1].Index {
			panic(fmt.Sprintf("invariant: raft indexes out of order: %d after %d", l.Index, logs[i-1].Index))
		}
		if l.Index <= applied {
			continue // already applied before a restart
		}
		last = l.Index
		if l.Type != raft.LogCommand {
			continue
		}
		if len(l.Data) > 0 && CmdType(l.Data[0])&^FlagIgnorable == CmdBatch {
			sub, err := batchCommands(l.Data)
			if err != nil {
				panic(fmt.Sprintf("scheduler: raft entry %d: %v", l.Index, err))
			}
			res := make([]*fsmv1.Result, len(sub))
			for j, raw := range sub {
				if len(raw) > 0 && CmdType(raw[0])&^FlagIgnorable == CmdAppendEvents {
					if m, ok := decodeAppendEvents(raw[1:]); ok {
						res[j] = a.apply(Command{Type: CmdAppendEvents, Body: m})
						continue
					}
				}
				c, err := DecodeCommand(raw)
				if err != nil {
					panic(fmt.Sprintf("scheduler: raft entry %d command %d: %v", l.Index, j, err))
				}
				res[j] = a.apply(c)
			}
			out[i] = res
			f.stats.add(len(sub))
			continue
		}
		cmd, err := DecodeCommand(l.Data)
		if err != nil {
			// A committed entry this server cannot read: continuing would
			// let replicas diverge. Stop loudly.
			panic(fmt.Sprintf("scheduler: raft entry %d: %v", l.Index, err))
		}
		out[i] = []*fsmv1.Result{a.apply(cmd)}
		f.stats.add(1)
	}
	if last == applied {
		return out
	}
	a.flushEvents()
	a.flushTasks()
	a.flushNodes()
	if err := b.Set(keyApplied, binary.BigEndian.AppendUint64(nil, last), nil); err != nil {
		panic(fmt.Sprintf("scheduler: batch set: %v", err))
	}
	// No sync: the raft log in the same Pebble WAL is synced, and entries
	// above a lost applied index are simply applied again after a crash.
	if err := b.Commit(pebble.NoSync); err != nil {
		panic(fmt.Sprintf("scheduler: commit applied batch: %v", err))
	}
	f.applied.Store(last)
	if a.replan {
		f.replanGen.Add(1)
	}
	if a.pools {
		f.notifyPools()
	}
	if f.nodeRemoved != nil {
		for _, id := range a.removed {
			f.nodeRemoved(id)
		}
	}
	f.watch.notify(a.touched)
	return out
}

// applier applies commands into one indexed batch. Each command checks
// everything before it writes, so a refused command leaves no trace.
type applier struct {
	b       *pebble.Batch
	idem    *idemSet
	reqs    *reqIndex
	live    map[string]*warrenv1.Task // FSM.live
	lastReq map[string]lastEvent      // FSM.lastReq
	touched map[string]struct{}
	tasks   map[string]*cachedTask
	nodes   map[string]*cachedNode
	replan  bool     // see FSM.replanGen
	pools   bool     // a pool target changed (FSM.poolsChanged)
	removed []string // nodes removed (FSM.nodeRemoved)
	// evs are the events written by the batch's commands so far that are
	// not yet in b, their keys and values in evBuf: flushEvents adds them
	// to b sorted by key, before anything reads events from b and before
	// the commit. Pebble inserts a batch into its memtable in the batch's
	// order, and its skiplist inserter starts each search from where the
	// last insert ended, so keys in order (a task's events next to each
	// other, the tasks in id order) are cheaper to insert than keys in the
	// order the appends arrived (BenchmarkFSMAppend/sorted).
	evBuf    []byte
	evs      []stagedEvent
	unsorted bool // FSM.unsorted
	// reqID is stamped on every event written while it is set: the request
	// id of the append being applied (see appendAt and appendOnce).
	reqID string
}

func fail(code connect.Code, format string, args ...any) *fsmv1.Result {
	return &fsmv1.Result{Code: uint32(code), Message: fmt.Sprintf(format, args...)}
}

func (a *applier) apply(c Command) *fsmv1.Result {
	switch m := c.Body.(type) {
	case nil:
		return &fsmv1.Result{} // unknown but ignorable
	case *fsmv1.CreateTask:
		return a.createTask(m)
	case *fsmv1.AppendEvents:
		if m.GetExpectedSeq() != 0 {
			return a.appendAt(m)
		}
		if m.GetRequestId() == "" {
			return a.appendEvents(m)
		}
		return a.appendOnce(m)
	case *fsmv1.SendMessage:
		return a.idempotent("msg/"+m.GetTaskId(), m.GetRequestId(), requestDigest(m.GetText()), func() *fsmv1.Result { return a.sendMessage(m) })
	case *fsmv1.Decide:
		return a.idempotent("decide/"+m.GetTaskId(), m.GetRequestId(), requestDigest(m.GetToolCallId(), strconv.FormatBool(m.GetApproved()), m.GetComment()),
			func() *fsmv1.Result { return a.decide(m) })
	case *fsmv1.CancelTask:
		return a.idempotent("cancel/"+m.GetTaskId(), m.GetRequestId(), requestDigest(m.GetReason()), func() *fsmv1.Result { return a.cancel(m) })
	case *fsmv1.GrantLease:
		return a.grantLease(m)
	case *fsmv1.SetMember:
		return a.setMember(m)
	case *fsmv1.RegisterNode:
		return a.registerNode(m)
	case *fsmv1.NodeOp:
		return a.nodeOp(m)
	case *fsmv1.ApplyPlan:
		return a.applyPlan(m)
	case *fsmv1.SetPool:
		return a.setPool(m)
	case *fsmv1.Batch:
		return fail(connect.CodeInvalidArgument, "nested batch")
	}
	return fail(connect.CodeInternal, "no handler for %s", c.Type)
}

// idempotent runs fn once per (scope, requestID): a repeat returns the
// recorded result. Failed results are not recorded, so a retry after a
// refusal is tried again. digest is what the request asks (requestDigest):
// the request id reused for another request (another text, another tool
// call or outcome) is refused with already_exists, as CreateTask does,
// instead of answered as if it had been applied.
func (a *applier) idempotent(scope, requestID string, digest []byte, fn func() *fsmv1.Result) *fsmv1.Result {
	if requestID == "" {
		return fn()
	}
	k := keyIdem(scope, requestID)
	var prev fsmv1.Result
	if a.getIdem(k, &prev) {
		if d := prev.GetRequestDigest(); len(d) > 0 && !bytes.Equal(d, digest) {
			return fail(connect.CodeAlreadyExists, "request_id %q was used for another request on this task", requestID)
		}
		prev.RequestDigest = nil
		return &prev
	}
	r := fn()
	// A result that appended nothing (a cancel of a task already
	// cancelled, or whose node was told) changed nothing a repeat could
	// apply twice, and is not recorded: the server names a request that
	// comes without an id (srv-...), so each such cancel would add a key,
	// on every replica, that is never deleted.
	if r.GetCode() == 0 && r.GetFirstSeq() != 0 {
		// Only the task's id and next seq: the record is kept for good,
		// on every replica, and a whole task (a spec of a megabyte) for
		// each cancel or message would grow the store by that much per
		// request. A repeat's caller reads the task itself (CancelTask
		// answers with the local replica's copy).
		rec := &fsmv1.Result{FirstSeq: r.GetFirstSeq(), LastSeq: r.GetLastSeq(), RequestDigest: digest}
		if t := r.GetTask(); t != nil {
			rec.Task = &warrenv1.Task{Id: t.GetId(), NextSeq: t.GetNextSeq()}
		}
		a.putIdem(k, rec)
	}
	return r
}

// requestDigest hashes a request's fields (16 bytes of SHA-256, each field
// length-prefixed) for idempotent.
func requestDigest(fields ...string) []byte {
	h := sha256.New()
	for _, f := range fields {
		_ = binary.Write(h, binary.BigEndian, uint32(len(f)))
		h.Write([]byte(f))
	}
	return h.Sum(nil)[:16]
}

// getIdem reads an idempotency record, skipping the read when the key was
// certainly never written.
func (a *applier) getIdem(k []byte, m proto.Message) bool {
	if !a.idem.mayContain(k) {
		return false
	}
	return a.get(k, m)
}

func (a *applier) putIdem(k []byte, m proto.Message) {
	a.put(k, m)
	a.idem.add(k)
}

// get reads key k into m, first adding the staged events to the batch
// when k is an event's, so that the read sees them.
func (a *applier) get(k []byte, m proto.Message) bool {
	if len(k) > 0 && k[0] == prefixEvent {
		a.flushEvents()
	}
	return a.read(k, m)
}

// read reads key k from the batch into m, reporting whether it was there;
// it does not look at the staged events (see get and peekEvent).
func (a *applier) read(k []byte, m proto.Message) bool {
	err := readProto(a.b, k, m)
	if errors.Is(err, ErrNotFound) {
		return false
	}
	if err != nil {
		panic(fmt.Sprintf("scheduler: read %x: %v", k, err))
	}
	return true
}

func (a *applier) put(k []byte, m proto.Message) {
	v, err := proto.Marshal(m)
	if err != nil {
		panic(fmt.Sprintf("scheduler: encode: %v", err))
	}
	if err := a.b.Set(k, v, nil); err != nil {
		panic(fmt.Sprintf("scheduler: batch set: %v", err))
	}
}

// cachedTask is a task read or written during one ApplyBatch. A changed
// task is written back once, at the end of the batch, however many
// commands of the batch changed it, and not at all if they only appended
// events to it (bumpTask).
type cachedTask struct {
	t     *warrenv1.Task
	orig  warrenv1.TaskState // state when first read (unspecified if new)
	dirty bool
	// bumped: events were appended and nothing else changed (bumpTask).
	bumped bool
}

// task returns the task (the batch's working copy; mutate it only once the
// command is sure to succeed, then call putTask, or bumpTask if the
// command only appended events).
func (a *applier) task(id string) (*warrenv1.Task, *fsmv1.Result) {
	if c, ok := a.tasks[id]; ok {
		return c.t, nil
	}
	if c, ok := a.live[id]; ok {
		if invariants {
			if stored, ok := a.stored(id); !ok || !proto.Equal(stored, c) {
				panic(fmt.Sprintf("invariant: cached task %s differs from its stored record and events", id))
			}
		}
		// The cached record itself is the working copy: commands mutate
		// it only once they are sure to succeed, and then putTask (or
		// bumpTask) it, so at the end of the batch it is what flushTasks
		// writes (or what the stored record and its events read as). (The
		// invariants build checks, in flushTasks, that a task no command
		// put or bumped was not changed either.)
		a.tasks[id] = &cachedTask{t: c, orig: c.GetState()}
		return c, nil
	}
	t, ok := a.stored(id)
	if !ok {
		return nil, fail(connect.CodeNotFound, "task %q not found", id)
	}
	a.tasks[id] = &cachedTask{t: t, orig: t.GetState()}
	return t, nil
}

// stored reads a task's record from the batch, caught up with its events
// (catchUp); false if there is none.
func (a *applier) stored(id string) (*warrenv1.Task, bool) {
	t := &warrenv1.Task{}
	if !a.get(keyTask(id), t) {
		return nil, false
	}
	a.flushEvents()
	if err := catchUp(a.b, t); err != nil {
		panic(fmt.Sprintf("scheduler: task %s: %v", id, err))
	}
	return t, true
}

// putTask marks the task changed; flushTasks writes it.
func (a *applier) putTask(t *warrenv1.Task) {
	c, ok := a.tasks[t.GetId()]
	if !ok {
		c = &cachedTask{}
		a.tasks[t.GetId()] = c
	}
	c.t, c.dirty = t, true
	a.touched[t.GetId()] = struct{}{}
}

// bumpTask marks a task whose commands only appended events. Its record is
// not rewritten: the events it gained carry its next seq (the last one's
// plus one) and its update time, and every read of a stored record catches
// up with them (catchUp). Most appends are such, and the record is the
// largest value they would write (bench/README.md, sixteenth session).
func (a *applier) bumpTask(t *warrenv1.Task) {
	c, ok := a.tasks[t.GetId()]
	if !ok || c.t != t {
		panic(fmt.Sprintf("scheduler: bumpTask of task %s not read in this batch", t.GetId()))
	}
	c.bumped = true
	a.touched[t.GetId()] = struct{}{}
}

// flushTasks writes every changed task and keeps the state index in step.
func (a *applier) flushTasks() {
	for id, c := range a.tasks {
		if !c.dirty {
			if invariants && (c.bumped || a.live[id] == c.t) { // FSM.live's record
				if stored, ok := a.stored(id); !ok || !proto.Equal(stored, c.t) {
					panic(fmt.Sprintf("invariant: cached task %s differs from its stored record and events: changed by a command that did not put it", id))
				}
			}
			if c.bumped { // appended to, so live (a finished task takes no events)
				a.live[id] = c.t
			}
			continue
		}
		if st := c.t.GetState(); c.orig != st {
			if c.orig == warrenv1.TaskState_TASK_STATE_PLACED {
				a.replan = true // a start finished: room under Config.MaxStarting
			}
			if c.orig != warrenv1.TaskState_TASK_STATE_UNSPECIFIED {
				if err := a.b.Delete(keyState(byte(c.orig), id), nil); err != nil {
					panic(fmt.Sprintf("scheduler: batch delete: %v", err))
				}
			}
			if err := a.b.Set(keyState(byte(st), id), nil, nil); err != nil {
				panic(fmt.Sprintf("scheduler: batch set: %v", err))
			}
		}
		a.put(keyTask(id), c.t)
		// The working copy is not used after the batch, so it becomes the
		// cached record.
		if Terminal(c.t.GetState()) {
			delete(a.live, id)
			delete(a.lastReq, id)
			a.reqs.end(id)
		} else {
			a.live[id] = c.t
		}
	}
}

// snapshotTask copies a task for a result, which must not change when later
// commands of the batch change the working copy.
func snapshotTask(t *warrenv1.Task) *warrenv1.Task { return proto.Clone(t).(*warrenv1.Task) }

// appendEvent writes one event at the task's next seq.
func (a *applier) appendEvent(t *warrenv1.Task, ts *timestamppb.Timestamp, kind string, payload []byte, epoch uint64) uint64 {
	seq := t.GetNextSeq()
	if invariants {
		var ev warrenv1.Event
		if a.peekEvent(t.GetId(), seq, &ev) {
			panic(fmt.Sprintf("invariant: task %s event %d written twice", t.GetId(), seq))
		}
		if seq > 1 && !a.peekEvent(t.GetId(), seq-1, &ev) {
			panic(fmt.Sprintf("invariant: task %s event %d written with no event %d", t.GetId(), seq, seq-1))
		}
	}
	k0 := len(a.evBuf)
	a.evBuf = appendKeyEvent(a.evBuf, t.GetId(), seq)
	k1 := len(a.evBuf)
	a.evBuf = appendEventValue(a.evBuf, seq, ts, kind, payload, epoch, a.reqID)
	a.evs = append(a.evs, stagedEvent{k0: k0, k1: k1, v1: len(a.evBuf)})
	if a.unsorted {
		a.flushEvents()
	}
	a.lastReq[t.GetId()] = lastEvent{seq: seq, req: a.reqID}
	if a.reqID != "" {
		a.reqs.noted(t.GetId(), a.reqID)
	}
	t.NextSeq = seq + 1
	t.UpdatedAt = ts
	return seq
}

// stagedEvent is an event in applier.evBuf: its key is evBuf[k0:k1] and
// its value evBuf[k1:v1].
type stagedEvent struct{ k0, k1, v1 int }

// flushEvents adds the staged events to the batch in key order (see
// applier.evs). Each key is written once (a task's seqs only grow), and
// the sort is stable besides, so the batch holds what writing them one by
// one would have left.
func (a *applier) flushEvents() {
	if len(a.evs) == 0 {
		return
	}
	buf := a.evBuf
	if len(a.evs) > 1 {
		slices.SortStableFunc(a.evs, func(x, y stagedEvent) int {
			return bytes.Compare(buf[x.k0:x.k1], buf[y.k0:y.k1])
		})
	}
	for _, e := range a.evs {
		if err := a.b.Set(buf[e.k0:e.k1], buf[e.k1:e.v1], nil); err != nil { // Set copies both
			panic(fmt.Sprintf("scheduler: batch set: %v", err))
		}
	}
	a.evs, a.evBuf = a.evs[:0], a.evBuf[:0]
}

// peekEvent reads task id's event at seq into m from the staged events or
// the batch, without flushing the staged ones: for invariant checks, so
// that builds with them keep the batch's order as it is without them.
func (a *applier) peekEvent(id string, seq uint64, m proto.Message) bool {
	k := keyEvent(id, seq)
	for _, e := range a.evs {
		if bytes.Equal(a.evBuf[e.k0:e.k1], k) {
			if err := proto.Unmarshal(a.evBuf[e.k1:e.v1], m); err != nil {
				panic(fmt.Sprintf("scheduler: staged event %x: %v", k, err))
			}
			return true
		}
	}
	return a.read(k, m)
}

// maxKeptStaging bounds the staging buffer the FSM keeps between batches,
// so one huge batch does not pin its size for the life of the process.
const maxKeptStaging = 4 << 20

// keepStaging keeps an applier's emptied staging buffers for the next.
func (f *FSM) keepStaging(a *applier) {
	if cap(a.evBuf) <= maxKeptStaging {
		f.evBuf, f.evs = a.evBuf[:0], a.evs[:0]
	}
}

// catchUp brings a task record read from r up to date with the events
// appended after it was last written (bumpTask): next_seq follows the last
// event, and updated_at is that event's time, as appendEvent set them on
// the record the FSM holds in memory.
func catchUp(r pebble.Reader, t *warrenv1.Task) error {
	id := t.GetId()
	it, err := eventsFrom(r, id, t.GetNextSeq())
	if err != nil {
		return err
	}
	defer it.Close()
	if !it.Last() {
		return it.Error()
	}
	k := it.Key()
	if len(k) != 1+len(id)+8 {
		return fmt.Errorf("event key %x: malformed", k)
	}
	var ev warrenv1.Event
	if err := proto.Unmarshal(it.Value(), &ev); err != nil {
		return fmt.Errorf("decode event %x: %w", k, err)
	}
	t.NextSeq = binary.BigEndian.Uint64(k[1+len(id):]) + 1
	t.UpdatedAt = ev.GetTime()
	return nil
}

// lastEvent is an entry of FSM.lastReq.
type lastEvent struct {
	seq uint64
	req string
}

func (a *applier) setState(t *warrenv1.Task, ts *timestamppb.Timestamp, to warrenv1.TaskState, extra map[string]any) uint64 {
	p := map[string]any{"from": StateName(t.GetState()), "to": StateName(to)}
	for k, v := range extra {
		p[k] = v
	}
	t.State = to
	return a.appendEvent(t, ts, KindStateChanged, mustJSON(p), t.GetLease().GetEpoch())
}

func (a *applier) createTask(m *fsmv1.CreateTask) *fsmv1.Result {
	scope := "create/" + m.GetTenant()
	if m.GetRequestId() != "" {
		var prev fsmv1.Result
		if a.getIdem(keyIdem(scope, m.GetRequestId()), &prev) {
			t, r := a.task(prev.GetTask().GetId())
			if r != nil {
				return r
			}
			// A retry sends the same spec; another spec under the same
			// key is a client's mistake, which must not pass for a create.
			if !proto.Equal(t.GetSpec(), m.GetSpec()) {
				return fail(connect.CodeAlreadyExists, "request_id %q: task %s was created with it for another spec", m.GetRequestId(), t.GetId())
			}
			return &fsmv1.Result{Task: snapshotTask(t)}
		}
	}
	// Handlers make only such ids; this holds whatever reaches the log.
	if !isTaskID(m.GetId()) {
		return fail(connect.CodeInvalidArgument, "id %q: not a task id in canonical form", m.GetId())
	}
	if _, r := a.task(m.GetId()); r == nil {
		return fail(connect.CodeAlreadyExists, "task %q already exists", m.GetId())
	}
	t := &warrenv1.Task{
		Id:        m.GetId(),
		Tenant:    m.GetTenant(),
		Spec:      m.GetSpec(),
		State:     warrenv1.TaskState_TASK_STATE_PENDING,
		NextSeq:   1,
		CreatedAt: m.GetTime(),
		Lease:     &warrenv1.Lease{},
	}
	a.appendEvent(t, m.GetTime(), KindTaskCreated, mustJSON(map[string]any{
		"title": m.GetSpec().GetIssueTitle(), "repo": m.GetSpec().GetRepo(), "base": m.GetSpec().GetBase(),
	}), 0)
	a.putTask(t)
	a.replan = true
	if m.GetRequestId() != "" {
		a.putIdem(keyIdem(scope, m.GetRequestId()), &fsmv1.Result{Task: &warrenv1.Task{Id: t.GetId()}})
	}
	return &fsmv1.Result{Task: snapshotTask(t), Created: true, FirstSeq: 1, LastSeq: 1}
}

// writable returns the task if client and writer events may still be added.
func (a *applier) writable(id string) (*warrenv1.Task, *fsmv1.Result) {
	t, r := a.task(id)
	if r != nil {
		return nil, r
	}
	if Terminal(t.GetState()) {
		return nil, fail(connect.CodeFailedPrecondition, "task %s is %s", id, StateName(t.GetState()))
	}
	return t, nil
}

// appendable returns the task an append writes to, or why it may not: the
// task is missing or ended, or the append's lease epoch is not the task's.
func (a *applier) appendable(m *fsmv1.AppendEvents) (*warrenv1.Task, *fsmv1.Result) {
	t, r := a.writable(m.GetTaskId())
	if r != nil {
		return nil, r
	}
	if m.GetLeaseEpoch() != t.GetLease().GetEpoch() {
		return nil, fail(connect.CodeFailedPrecondition, "%v: append carries epoch %d, task %s is at epoch %d",
			ErrStaleEpoch, m.GetLeaseEpoch(), t.GetId(), t.GetLease().GetEpoch())
	}
	return t, nil
}

func (a *applier) appendEvents(m *fsmv1.AppendEvents) *fsmv1.Result {
	t, r := a.appendable(m)
	if r != nil {
		return r
	}
	// Check every event (and the state walk) before writing any.
	state := t.GetState()
	pending := append([]string(nil), t.GetPendingApprovals()...)
	park := false
	// What no task's state allows (appendShape) is refused at its event,
	// as the checks of the loop are. It is checked at apply time too: no
	// writer the servers and nodes run appends such a shape (a node never
	// writes placed, and parks with a lone parked event), so only a buggy
	// or hostile client's entry, which left a task stuck (placed on no
	// node, parked in another state) or an event after the end, which
	// streams end on, is applied differently than before.
	shape := appendShape(m.GetEvents())
	for i, ev := range m.GetEvents() {
		if err := checkEventApplied(i, ev); err != nil {
			return fail(connect.CodeInvalidArgument, "%v", err)
		}
		if len(shape) > 0 && shape[0].i == i {
			return fail(connect.CodeFailedPrecondition, "%s: task %s: %s", shape[0].field(), t.GetId(), shape[0].issue)
		}
		switch ev.GetKind() {
		case KindStateChanged:
			to := payloadState(ev.GetPayload())
			if !CanTransition(state, to) {
				return fail(connect.CodeFailedPrecondition, "events[%d]: task %s cannot go from %s to %s",
					i, t.GetId(), StateName(state), StateName(to))
			}
			state = to
		case KindApprovalRequested:
			// Once: a second request for a call already waiting (a writer
			// that asked again) would need a second decision, and the
			// task would wait for good after the first.
			if id := payloadString(ev.GetPayload(), "tool_call_id"); !slices.Contains(pending, id) {
				pending = append(pending, id)
			}
		case KindParked:
			if state != warrenv1.TaskState_TASK_STATE_WAITING_APPROVAL {
				return fail(connect.CodeFailedPrecondition, "events[%d]: task %s is %s: only a task waiting for approval parks",
					i, t.GetId(), StateName(state))
			}
			park = true
		}
	}
	first := t.GetNextSeq()
	plain := !park && state == t.GetState() && len(pending) == len(t.GetPendingApprovals())
	for _, ev := range m.GetEvents() {
		payload := ev.GetPayload()
		if len(payload) == 0 {
			payload = []byte("{}")
		}
		a.appendEvent(t, m.GetTime(), ev.GetKind(), payload, m.GetLeaseEpoch())
		if ev.GetKind() == KindModelCall {
			addUsage(t, payload)
			plain = false
		}
	}
	if plain {
		a.bumpTask(t)
		return &fsmv1.Result{FirstSeq: first, LastSeq: t.GetNextSeq() - 1, CancelRequested: t.GetCancelRequested()}
	}
	if park {
		// The holder lets the task go while it waits: its node's room is
		// free, and appends under its epoch are refused from now on.
		a.letGo(t)
		t.Parked = true
		t.State, t.PendingApprovals = state, pending
		switch {
		case t.GetCancelRequested(): // cancelled meanwhile: nothing will resume it
			t.Parked = false
			a.setState(t, m.GetTime(), warrenv1.TaskState_TASK_STATE_CANCELLED, map[string]any{"reason": "cancelled while parking for approval"})
		case len(pending) == 0: // decided meanwhile: resume at once
			a.unpark(t, m.GetTime(), "decided while parking")
		}
		a.putTask(t)
		return &fsmv1.Result{FirstSeq: first, LastSeq: t.GetNextSeq() - 1, CancelRequested: t.GetCancelRequested()}
	}
	if from := t.GetState(); state != from {
		switch {
		case Terminal(state):
			a.release(t) // the lease stays on record: where it ran
		case state == warrenv1.TaskState_TASK_STATE_PENDING:
			// The holder gives the task back (a drain, a step boundary):
			// later appends under its epoch are refused.
			t.LastFailedNode = a.letGo(t)
			a.replan = true
		}
	}
	t.State = state
	t.PendingApprovals = pending
	if state == warrenv1.TaskState_TASK_STATE_PENDING && t.GetCancelRequested() {
		// Given back after a cancel: nothing should place it again only
		// to record that (nor leave it pending where no node fits).
		a.setState(t, m.GetTime(), warrenv1.TaskState_TASK_STATE_CANCELLED, map[string]any{"reason": "cancelled before its node gave it back"})
	}
	a.putTask(t)
	return &fsmv1.Result{FirstSeq: first, LastSeq: t.GetNextSeq() - 1, CancelRequested: t.GetCancelRequested()}
}

// appendAt applies an append that names the seq of its first event
// (expected_seq). Its exactly-once check needs no idempotency record: every
// event it writes, including any state_changed the FSM adds, carries its
// request id, so a retry finds them at expected_seq and gets the same seqs
// back. That saves a key per append on every replica.
func (a *applier) appendAt(m *fsmv1.AppendEvents) *fsmv1.Result {
	want := m.GetExpectedSeq()
	t, r := a.task(m.GetTaskId())
	if r != nil {
		return r
	}
	id, req := t.GetId(), m.GetRequestId()
	if next := t.GetNextSeq(); next != want {
		// A retry is recognised before the task's state is checked: the
		// append being retried may have ended the task.
		if next > want && req != "" {
			if last := a.appendedBy(id, want, req, want+uint64(len(m.GetEvents()))+maxAddedEvents); last != 0 {
				return &fsmv1.Result{FirstSeq: want, LastSeq: last, CancelRequested: t.GetCancelRequested()}
			}
		}
		// Not a retry. A writer that lost its lease or whose task ended
		// hears that, as from any append, rather than that the seq moved.
		if _, r := a.appendable(m); r != nil {
			return r
		}
		return fail(connect.CodeFailedPrecondition, "%v: expected_seq %d, task %s is at seq %d", ErrSeqMismatch, want, id, next)
	}
	// The events just before carrying this request id would make this
	// append's events and theirs one run, and a retry of the earlier
	// append would then get this one's seqs too.
	if req != "" && want > 1 && a.requestIDAt(id, want-1) == req {
		return fail(connect.CodeAlreadyExists, "request_id %q: the append just before seq %d used it; give each append its own", req, want)
	}
	a.reqID = req
	defer func() { a.reqID = "" }()
	return a.appendEvents(m)
}

// requestIDAt returns the request id on the task's event at seq ("" if
// there is no such event): from the FSM's memory of the last event written
// to each live task when that is the one asked for, else read from the log
// (the memory only saves the read, so replicas answer alike either way).
func (a *applier) requestIDAt(taskID string, seq uint64) string {
	var ev warrenv1.Event
	if l, ok := a.lastReq[taskID]; ok && l.seq == seq {
		if invariants {
			if !a.peekEvent(taskID, seq, &ev) || ev.GetRequestId() != l.req {
				panic(fmt.Sprintf("invariant: remembered request id %q of task %s event %d differs from the log's %q", l.req, taskID, seq, ev.GetRequestId()))
			}
		}
		return l.req
	}
	if !a.get(keyEvent(taskID, seq), &ev) {
		return ""
	}
	return ev.GetRequestId()
}

// maxAddedEvents bounds, with room to spare, the events the FSM adds to an
// append of its own (today at most one: the state_changed when a parking
// append cancels or resumes the task).
const maxAddedEvents = 4

// appendedBy returns the last seq of the run of events that starts at seq
// and carries requestID, or 0 when no such run starts there (the event at
// seq does not carry it, or the one before it does too: then seq is inside
// another append's events, not at their start), or when the run reaches
// limit: one append does not write that many, so the id was reused, and a
// retry never costs more reads than the append wrote. requestID is never
// empty here (an event without one would match it).
func (a *applier) appendedBy(taskID string, seq uint64, requestID string, limit uint64) uint64 {
	if seq > 1 && a.requestIDAt(taskID, seq-1) == requestID {
		return 0
	}
	var last uint64
	for ; seq < limit; seq++ {
		if a.requestIDAt(taskID, seq) != requestID {
			return last
		}
		last = seq
	}
	return 0
}

func payloadState(p []byte) warrenv1.TaskState {
	s, _ := ParseState(payloadString(p, "to"))
	return s
}

func payloadString(p []byte, field string) string {
	var m map[string]json.RawMessage
	if json.Unmarshal(p, &m) != nil {
		return ""
	}
	var s string
	if json.Unmarshal(m[field], &s) != nil {
		return ""
	}
	return s
}

func (a *applier) sendMessage(m *fsmv1.SendMessage) *fsmv1.Result {
	t, r := a.writable(m.GetTaskId())
	if r != nil {
		return r
	}
	seq := a.appendEvent(t, m.GetTime(), KindMessage, mustJSON(map[string]string{"from": "user", "text": m.GetText()}), 0)
	a.bumpTask(t)
	return &fsmv1.Result{FirstSeq: seq, LastSeq: seq}
}

func (a *applier) decide(m *fsmv1.Decide) *fsmv1.Result {
	t, r := a.writable(m.GetTaskId())
	if r != nil {
		return r
	}
	idx := slices.Index(t.GetPendingApprovals(), m.GetToolCallId())
	if idx < 0 {
		return fail(connect.CodeFailedPrecondition, "task %s has no pending approval for tool call %q", t.GetId(), m.GetToolCallId())
	}
	t.PendingApprovals = append(t.PendingApprovals[:idx:idx], t.PendingApprovals[idx+1:]...)
	seq := a.appendEvent(t, m.GetTime(), KindApprovalDecided, mustJSON(map[string]any{
		"tool_call_id": m.GetToolCallId(), "approved": m.GetApproved(), "comment": m.GetComment(),
	}), 0)
	if t.GetParked() && len(t.GetPendingApprovals()) == 0 {
		a.unpark(t, m.GetTime(), "approval decided")
	}
	a.putTask(t)
	return &fsmv1.Result{FirstSeq: seq, LastSeq: t.GetNextSeq() - 1}
}

// unpark puts a parked task whose approvals are all decided back to
// pending, to resume from its log on any node.
func (a *applier) unpark(t *warrenv1.Task, ts *timestamppb.Timestamp, reason string) {
	t.Parked = false
	a.replan = true
	a.setState(t, ts, warrenv1.TaskState_TASK_STATE_PENDING, map[string]any{"reason": reason, "epoch": t.GetLease().GetEpoch()})
}

// addUsage adds a model_call event's usage and cost to the task's.
func addUsage(t *warrenv1.Task, payload []byte) {
	var p struct {
		Usage struct {
			In         uint64 `json:"input_tokens"`
			CacheWrite uint64 `json:"cache_write_tokens"`
			CacheRead  uint64 `json:"cache_read_tokens"`
			Out        uint64 `json:"output_tokens"`
		} `json:"usage"`
		Cost uint64 `json:"cost_micro_usd"`
	}
	_ = json.Unmarshal(payload, &p) // a payload without usage counts the call only
	u := t.GetUsage()
	if u == nil {
		u = &warrenv1.Usage{}
	}
	u.ModelCalls++
	u.InputTokens += p.Usage.In
	u.CacheWriteTokens += p.Usage.CacheWrite
	u.CacheReadTokens += p.Usage.CacheRead
	u.OutputTokens += p.Usage.Out
	u.CostMicroUsd += p.Cost
	if prompt := u.InputTokens + u.CacheWriteTokens + u.CacheReadTokens; prompt > 0 {
		u.CacheHitRate = float64(u.CacheReadTokens) / float64(prompt)
	}
	t.Usage = u
}

func (a *applier) cancel(m *fsmv1.CancelTask) *fsmv1.Result {
	t, r := a.task(m.GetTaskId())
	if r != nil {
		return r
	}
	switch {
	case t.GetState() == warrenv1.TaskState_TASK_STATE_CANCELLED:
		return &fsmv1.Result{Task: snapshotTask(t)} // already done
	case Terminal(t.GetState()):
		return fail(connect.CodeFailedPrecondition, "task %s already %s", t.GetId(), StateName(t.GetState()))
	case t.GetCancelRequested() && t.GetState() != warrenv1.TaskState_TASK_STATE_PENDING && !t.GetParked():
		return &fsmv1.Result{Task: snapshotTask(t)} // the node has been told
	}
	old := t.GetState()
	first := a.appendEvent(t, m.GetTime(), KindCancelRequested, mustJSON(map[string]string{"reason": m.GetReason()}), 0)
	t.CancelRequested = true
	switch {
	case old == warrenv1.TaskState_TASK_STATE_PENDING:
		// Nothing runs it yet: cancel at once.
		a.setState(t, m.GetTime(), warrenv1.TaskState_TASK_STATE_CANCELLED, map[string]any{"reason": "cancelled before placement"})
	case t.GetParked():
		// Nothing runs it while it waits: cancel at once.
		t.Parked = false
		a.setState(t, m.GetTime(), warrenv1.TaskState_TASK_STATE_CANCELLED, map[string]any{"reason": "cancelled while parked for approval"})
	}
	a.putTask(t)
	return &fsmv1.Result{Task: snapshotTask(t), FirstSeq: first, LastSeq: t.GetNextSeq() - 1}
}

func (a *applier) grantLease(m *fsmv1.GrantLease) *fsmv1.Result {
	t, r := a.writable(m.GetTaskId())
	if r != nil {
		return r
	}
	if m.GetNode() == "" {
		return fail(connect.CodeInvalidArgument, "node: required")
	}
	old := t.GetState()
	if old != warrenv1.TaskState_TASK_STATE_PENDING {
		return fail(connect.CodeFailedPrecondition, "task %s is %s, not pending", t.GetId(), StateName(old))
	}
	t.Lease = &warrenv1.Lease{Node: m.GetNode(), Epoch: t.GetLease().GetEpoch() + 1}
	seq := a.setState(t, m.GetTime(), warrenv1.TaskState_TASK_STATE_PLACED, map[string]any{"node": m.GetNode(), "epoch": t.GetLease().GetEpoch()})
	a.putTask(t)
	return &fsmv1.Result{Task: snapshotTask(t), FirstSeq: seq, LastSeq: seq}
}

// setPool records a template's warm-pool target (0 removes it: a node's
// next session gets the complete set, in which an absent template is 0).
func (a *applier) setPool(m *fsmv1.SetPool) *fsmv1.Result {
	if !reTemplate.MatchString(m.GetTemplate()) {
		return fail(connect.CodeInvalidArgument, "template: %q is not a template name", truncate(m.GetTemplate(), 80))
	}
	a.pools = true
	if m.GetTarget() == 0 {
		if err := a.b.Delete(keyPool(m.GetTemplate()), nil); err != nil {
			panic(fmt.Sprintf("scheduler: batch delete: %v", err))
		}
		return &fsmv1.Result{}
	}
	a.put(keyPool(m.GetTemplate()), &fsmv1.SetPool{Template: m.GetTemplate(), Target: m.GetTarget()})
	return &fsmv1.Result{}
}

func (a *applier) setMember(m *fsmv1.SetMember) *fsmv1.Result {
	if m.GetId() == "" {
		return fail(connect.CodeInvalidArgument, "id: required")
	}
	a.put(keyMember(m.GetId()), &fsmv1.Member{Id: m.GetId(), RaftAddress: m.GetRaftAddress(), ApiUrl: m.GetApiUrl()})
	return &fsmv1.Result{}
}
