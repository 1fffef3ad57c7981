package raftlog

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"

	"github.com/cockroachdb/pebble/v2"
	"github.com/hashicorp/raft"
)

// ErrZeroIndex is returned by StoreLogs for a log with Index 0, which Raft
// never writes and which FirstIndex/LastIndex use to mean "no entries".
var ErrZeroIndex = errors.New("raftlog: log index 0 is reserved")

// Store is a raft.LogStore and raft.StableStore on a Pebble database. It
// does not own the database: the caller closes it after it stops using the
// Store.
//
// All methods are safe for concurrent use. Writes (StoreLog, StoreLogs,
// DeleteRange, Set, SetUint64) are synced before they return nil; log
// writes are serialised (Raft issues them from one goroutine anyway).
// Values returned by GetLog and Get are owned by the caller. Use one Store
// per database: the cached bounds see only the log writes made through it.
type Store struct {
	db *pebble.DB

	// wmu serialises log writes so that bounds is updated in commit order.
	wmu sync.Mutex
	// bounds caches the first and last log index. It is replaced, never
	// mutated, after each committed log write; both are 0 when the log is
	// empty. Readers may see the value from just before a write that is
	// still returning.
	bounds atomic.Pointer[bounds]
}

type bounds struct{ first, last uint64 }

var (
	_ raft.LogStore          = (*Store)(nil)
	_ raft.StableStore       = (*Store)(nil)
	_ raft.MonotonicLogStore = (*Store)(nil)
)

var (
	logLower = []byte{PrefixLog}
	logUpper = []byte{PrefixLog + 1}
)

// logKeyLen is the length of a PrefixLog key.
const logKeyLen = 1 + 8

// New returns a Store on db, loading the first and last log index from it.
func New(db *pebble.DB) (*Store, error) {
	s := &Store{db: db}
	b, err := s.loadBounds()
	if err != nil {
		return nil, err
	}
	s.bounds.Store(&b)
	return s, nil
}

// loadBounds reads the first and last log index from the database.
func (s *Store) loadBounds() (bounds, error) {
	it, err := s.logIter()
	if err != nil {
		return bounds{}, err
	}
	defer it.Close()
	var b bounds
	if it.First() {
		if b.first, err = parseLogKey(it.Key()); err != nil {
			return bounds{}, err
		}
		if !it.Last() {
			return bounds{}, fmt.Errorf("raftlog: load last index: %w", it.Error())
		}
		if b.last, err = parseLogKey(it.Key()); err != nil {
			return bounds{}, err
		}
	}
	if err := it.Error(); err != nil {
		return bounds{}, fmt.Errorf("raftlog: load log bounds: %w", err)
	}
	return b, nil
}

// FirstIndex returns the first index in the log, or 0 if it is empty.
func (s *Store) FirstIndex() (uint64, error) { return s.bounds.Load().first, nil }

// LastIndex returns the last index in the log, or 0 if it is empty.
func (s *Store) LastIndex() (uint64, error) { return s.bounds.Load().last, nil }

// GetLog reads the entry at index into l. It returns raft.ErrLogNotFound if
// there is none, and an error wrapping ErrCorrupt if it cannot be decoded.
func (s *Store) GetLog(index uint64, l *raft.Log) error {
	var k [logKeyLen]byte
	val, closer, err := s.db.Get(logKey(&k, index))
	if errors.Is(err, pebble.ErrNotFound) {
		return raft.ErrLogNotFound
	}
	if err != nil {
		return fmt.Errorf("raftlog: get log %d: %w", index, err)
	}
	buf := make([]byte, len(val))
	copy(buf, val)
	if err := closer.Close(); err != nil {
		return fmt.Errorf("raftlog: get log %d: %w", index, err)
	}
	if err := decodeLog(buf, l); err != nil {
		return fmt.Errorf("raftlog: get log %d: %w", index, err)
	}
	if l.Index != index {
		return fmt.Errorf("raftlog: get log %d: %w: entry holds index %d", index, ErrCorrupt, l.Index)
	}
	return nil
}

// StoreLog stores one entry; see StoreLogs.
func (s *Store) StoreLog(l *raft.Log) error { return s.StoreLogs([]*raft.Log{l}) }

// StoreLogs stores the entries in one synced batch: either all of them are
// durable when it returns nil, or, after a crash, none of them. Entries may
// leave gaps and may overwrite existing ones.
func (s *Store) StoreLogs(logs []*raft.Log) error {
	if len(logs) == 0 {
		return nil
	}
	size := 0
	lo, hi := uint64(math.MaxUint64), uint64(0)
	for _, l := range logs {
		if l.Index == 0 {
			return ErrZeroIndex
		}
		lo, hi = min(lo, l.Index), max(hi, l.Index)
		// Batch record overhead per Set is a kind byte and two varint
		// lengths; 16 bytes is an upper bound for these sizes.
		size += logKeyLen + encodedLen(l) + 16
	}
	b := s.db.NewBatch(pebble.WithInitialSizeBytes(size + 32))
	defer b.Close()
	for _, l := range logs {
		op := b.SetDeferred(logKeyLen, encodedLen(l))
		op.Key[0] = PrefixLog
		binary.BigEndian.PutUint64(op.Key[1:], l.Index)
		encodeLog(op.Value, l)
		if err := op.Finish(); err != nil {
			return fmt.Errorf("raftlog: store logs %d..%d: %w", lo, hi, err)
		}
	}

	s.wmu.Lock()
	defer s.wmu.Unlock()
	if err := b.Commit(pebble.Sync); err != nil {
		return fmt.Errorf("raftlog: store logs %d..%d: %w", lo, hi, err)
	}
	old := s.bounds.Load()
	nb := bounds{first: lo, last: hi}
	if old.first != 0 {
		nb.first, nb.last = min(old.first, lo), max(old.last, hi)
	}
	s.bounds.Store(&nb)
	return nil
}

// IsMonotonic reports true, so that after installing a snapshot Raft deletes
// every entry up to the last one (one range deletion here) rather than
// keep up to TrailingLogs of them below it. Those may be entries a
// partitioned leader appended and that never committed; kept, they would
// reach a lagging follower as committed ones if this server led later
// (hashicorp/raft#697). The next entry stored is the snapshot's index plus
// one, in an empty log; StoreLogs accepts it as it accepts any gap.
func (*Store) IsMonotonic() bool { return true }

// DeleteRange deletes the entries with index in [lo, hi] with one synced
// range deletion. Deleting absent entries is not an error.
func (s *Store) DeleteRange(lo, hi uint64) error {
	if lo > hi {
		return nil
	}
	var start, end [logKeyLen]byte
	endKey := logUpper
	if hi < math.MaxUint64 {
		endKey = logKey(&end, hi+1)
	}

	s.wmu.Lock()
	defer s.wmu.Unlock()
	if err := s.db.DeleteRange(logKey(&start, lo), endKey, pebble.Sync); err != nil {
		return fmt.Errorf("raftlog: delete logs %d..%d: %w", lo, hi, err)
	}
	old := s.bounds.Load()
	nb, err := s.boundsAfterDelete(*old, lo, hi)
	if err != nil {
		// The deletion is durable but the new bounds are unknown: fall back
		// to reading both from scratch rather than serve stale ones.
		if nb, err = s.loadBounds(); err != nil {
			return fmt.Errorf("raftlog: delete logs %d..%d: reload bounds: %w", lo, hi, err)
		}
	}
	s.bounds.Store(&nb)
	return nil
}

// boundsAfterDelete returns the log bounds after [lo, hi] was deleted from a
// log with bounds b. It reads the database only when the deletion removed
// the first or the last entry but not all of them.
func (s *Store) boundsAfterDelete(b bounds, lo, hi uint64) (bounds, error) {
	switch {
	case b.first == 0 || hi < b.first || lo > b.last:
		return b, nil // nothing deleted
	case lo <= b.first && hi >= b.last:
		return bounds{}, nil // everything deleted
	case lo <= b.first:
		// Head truncation: the new first entry is the next one after hi,
		// which exists because hi < b.last.
		first, err := s.seek(hi+1, false)
		return bounds{first: first, last: b.last}, err
	case hi >= b.last:
		// Tail truncation: the new last entry is the one before lo.
		last, err := s.seek(lo, true)
		return bounds{first: b.first, last: last}, err
	default:
		return b, nil // a hole in the middle
	}
}

// seek returns the index of the first entry >= index, or with before set,
// of the last entry < index. The entry must exist.
func (s *Store) seek(index uint64, before bool) (uint64, error) {
	it, err := s.logIter()
	if err != nil {
		return 0, err
	}
	defer it.Close()
	var k [logKeyLen]byte
	var ok bool
	if before {
		ok = it.SeekLT(logKey(&k, index))
	} else {
		ok = it.SeekGE(logKey(&k, index))
	}
	if !ok {
		if err := it.Error(); err != nil {
			return 0, fmt.Errorf("raftlog: seek %d: %w", index, err)
		}
		return 0, fmt.Errorf("raftlog: seek %d: no entry (log bounds out of date)", index)
	}
	return parseLogKey(it.Key())
}

func (s *Store) logIter() (*pebble.Iterator, error) {
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: logLower, UpperBound: logUpper})
	if err != nil {
		return nil, fmt.Errorf("raftlog: new iterator: %w", err)
	}
	return it, nil
}

func logKey(k *[logKeyLen]byte, index uint64) []byte {
	k[0] = PrefixLog
	binary.BigEndian.PutUint64(k[1:], index)
	return k[:]
}

func parseLogKey(k []byte) (uint64, error) {
	if len(k) != logKeyLen || k[0] != PrefixLog {
		return 0, fmt.Errorf("raftlog: %w: malformed log key %x", ErrCorrupt, k)
	}
	return binary.BigEndian.Uint64(k[1:]), nil
}
