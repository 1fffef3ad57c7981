package raftlog

import (
	"errors"
	"math"
	"math/rand"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/hashicorp/raft"
)

// TestStoreMatchesAModel drives Store with random StoreLogs and
// DeleteRange calls (including indexes near 2^63 and MaxUint64) and checks
// FirstIndex, LastIndex and GetLog against a map, across reopens.
func TestStoreMatchesAModel(t *testing.T) {
	d := openTestDB(t, vfs.NewMem(), "db")
	s, err := New(d.db)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewSource(1))
	model := map[uint64]uint64{} // index -> term
	bases := []uint64{1, 1 << 32, 1<<63 - 20, 1 << 63, math.MaxUint64 - 40}
	pick := func(base uint64) uint64 { return base + uint64(rng.Intn(40)) }
	check := func(step int) {
		var lo, hi uint64
		for k := range model {
			if lo == 0 || k < lo {
				lo = k
			}
			if k > hi {
				hi = k
			}
		}
		f, _ := s.FirstIndex()
		l, _ := s.LastIndex()
		if f != lo || l != hi {
			t.Fatalf("step %d: bounds %d..%d, want %d..%d", step, f, l, lo, hi)
		}
		for _, b := range bases {
			for i := 0; i < 45; i++ {
				idx := b + uint64(i)
				if idx < b {
					break
				}
				var lg raft.Log
				err := s.GetLog(idx, &lg)
				term, ok := model[idx]
				switch {
				case ok && err != nil:
					t.Fatalf("step %d: GetLog(%d): %v", step, idx, err)
				case ok && lg.Term != term:
					t.Fatalf("step %d: GetLog(%d) term %d want %d", step, idx, lg.Term, term)
				case !ok && !errors.Is(err, raft.ErrLogNotFound):
					t.Fatalf("step %d: GetLog(%d) of missing = %v", step, idx, err)
				}
			}
		}
	}
	for step := 0; step < 400; step++ {
		base := bases[rng.Intn(len(bases))]
		switch rng.Intn(5) {
		case 0, 1, 2:
			n := 1 + rng.Intn(6)
			var logs []*raft.Log
			for i := 0; i < n; i++ {
				idx := pick(base)
				term := uint64(step + 1)
				logs = append(logs, &raft.Log{Index: idx, Term: term, Type: raft.LogCommand, Data: []byte("x")})
			}
			if err := s.StoreLogs(logs); err != nil {
				t.Fatal(err)
			}
			for _, l := range logs {
				model[l.Index] = l.Term
			}
		case 3:
			a, b := pick(base), pick(base)
			if rng.Intn(4) == 0 {
				b = math.MaxUint64
			}
			if rng.Intn(4) == 0 {
				a = 1
			}
			if a > b {
				a, b = b, a
			}
			if err := s.DeleteRange(a, b); err != nil {
				t.Fatal(err)
			}
			for k := range model {
				if k >= a && k <= b {
					delete(model, k)
				}
			}
		case 4:
			s = d.reopen()
		}
		check(step)
	}
}
