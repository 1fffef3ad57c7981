package scheduler

import (
	"hash/maphash"
	"math/rand/v2"
	"testing"

	"pgregory.net/rapid"
)

// reqSet answers exactly as a hash set does, through filter rebuilds and
// repeated adds.
func TestReqSetIsASet(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		seed := maphash.MakeSeed()
		// A small pool of ids makes hits and repeats; fresh ids make misses.
		pool := rapid.SliceOfN(rapid.String(), 1, 20).Draw(rt, "pool")
		var s reqSet
		model := map[uint64]bool{}
		for i := range rapid.IntRange(0, 3000).Draw(rt, "ops") {
			var h uint64
			if rapid.Bool().Draw(rt, "from_pool") {
				h = maphash.String(seed, rapid.SampledFrom(pool).Draw(rt, "id"))
			} else {
				h = maphash.String(seed, "fresh-"+string(rune(i)))
			}
			if got := s.has(h); got != model[h] {
				rt.Fatalf("op %d: has = %v, want %v (%d hashes)", i, got, model[h], len(model))
			}
			if rapid.Bool().Draw(rt, "add") {
				s.add(h)
				model[h] = true
			}
		}
	})
}

// A hash the filter lets through but the set does not hold is not in the
// set: the list decides.
func TestReqSetFilterHitIsChecked(t *testing.T) {
	var s reqSet
	r := rand.New(rand.NewPCG(1, 2))
	for range 5000 {
		s.add(r.Uint64())
	}
	held := map[uint64]bool{}
	for _, h := range s.hashes {
		held[h] = true
	}
	falsePos := 0
	for range 200000 {
		h := r.Uint64()
		if held[h] || !s.maybe(h) {
			continue
		}
		falsePos++
		if s.has(h) {
			t.Fatalf("%x: reported held after a filter hit", h)
		}
	}
	if falsePos == 0 {
		t.Fatal("no filter false positive in 200,000 probes: the list scan was not exercised")
	}
	// The design's rate is about 1 in 3,000; far more means a broken filter.
	if falsePos > 200 {
		t.Fatalf("%d false positives in 200,000 probes", falsePos)
	}
	for h := range held {
		if !s.has(h) {
			t.Fatalf("%x: added but not found", h)
		}
	}
}
