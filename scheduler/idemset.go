package scheduler

import (
	"bytes"
	"fmt"
	"hash/maphash"

	"github.com/cockroachdb/pebble/v2"
)

// idemSet holds a hash of every idempotency key in the database, so that
// the common case — a request id never seen before — needs no Pebble read.
// (Profiles showed those misses, which fall through every memtable and
// sstable, taking over 40% of the leader's CPU.) It only filters: a hash
// hit still reads the record, so a collision costs a read, never a wrong
// answer, and results stay identical on every replica. It is used from the
// FSM goroutine only.
type idemSet struct {
	seed maphash.Seed
	m    map[uint64]struct{}
	// appends: the database holds records of appends, which versions
	// before appendonce.go wrote; without them an append need not look.
	appends bool
}

func newIdemSet() *idemSet {
	return &idemSet{seed: maphash.MakeSeed(), m: map[uint64]struct{}{}}
}

func (s *idemSet) hash(k []byte) uint64 { return maphash.Bytes(s.seed, k) }

// mayContain is false only if k is certainly not stored.
func (s *idemSet) mayContain(k []byte) bool {
	_, ok := s.m[s.hash(k)]
	return ok
}

func (s *idemSet) add(k []byte) { s.m[s.hash(k)] = struct{}{} }

// load replaces the set with the keys stored in db.
func (s *idemSet) load(db *pebble.DB) error {
	s.m, s.appends = map[uint64]struct{}{}, false
	it, err := db.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixIdem}, UpperBound: []byte{prefixIdem + 1}})
	if err != nil {
		return err
	}
	defer it.Close()
	for ok := it.First(); ok; ok = it.Next() {
		s.add(it.Key())
		s.appends = s.appends || bytes.HasPrefix(it.Key()[1:], []byte(appendScope))
	}
	if err := it.Error(); err != nil {
		return fmt.Errorf("load idempotency keys: %w", err)
	}
	return nil
}
