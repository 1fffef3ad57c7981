package capacity

import (
	"errors"
	"sync"
	"testing"
)

func TestInParallelCoversEveryChunkOnce(t *testing.T) {
	var mu sync.Mutex
	seen := make([]int, 1003)
	err := inParallel(len(seen), 10, 4, func(w, lo, hi int) error {
		if w < 0 || w >= 4 || hi-lo > 10 || hi > len(seen) {
			t.Errorf("worker %d got [%d, %d)", w, lo, hi)
		}
		mu.Lock()
		defer mu.Unlock()
		for i := lo; i < hi; i++ {
			seen[i]++
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for i, n := range seen {
		if n != 1 {
			t.Fatalf("item %d handled %d times", i, n)
		}
	}
}

func TestInParallelStopsAfterAnError(t *testing.T) {
	boom := errors.New("boom")
	var mu sync.Mutex
	calls := 0
	err := inParallel(1000, 1, 1, func(_, lo, _ int) error {
		mu.Lock()
		calls++
		mu.Unlock()
		if lo == 3 {
			return boom
		}
		return nil
	})
	if !errors.Is(err, boom) || calls != 4 {
		t.Fatalf("err %v after %d calls, want boom after 4", err, calls)
	}
}
