package main

import (
	"fmt"
	"math/rand/v2"
	"os"
	"time"

	"github.com/hashicorp/raft"
)

// An operation measures the mean time of one call on a fresh store of the
// given kind, spending about budget in timed calls.
type operation struct {
	name    string
	measure func(k kind, budget time.Duration) (time.Duration, error)
}

var operations = []operation{
	{"StoreLogs 1 × 1 KiB", storeLogs(1)},
	{"StoreLogs 16 × 1 KiB", storeLogs(16)},
	{"StoreLogs 256 × 1 KiB", storeLogs(256)},
	{"GetLog (10k × 1 KiB, random)", measureGetLog},
	{"DeleteRange (64 oldest)", measureDeleteRange},
}

// withStore opens a store of kind k in a new temporary directory, runs f
// and removes everything.
func withStore(k kind, f func(s store) (time.Duration, error)) (time.Duration, error) {
	dir, err := os.MkdirTemp(*tmpDir, "logstore-"+k.name+"-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	s, err := k.open(dir)
	if err != nil {
		return 0, fmt.Errorf("open %s: %w", k.name, err)
	}
	d, err := f(s)
	if cerr := s.Close(); err == nil && cerr != nil {
		err = cerr
	}
	return d, err
}

// logs returns n entries with indexes next.. and size bytes of data each.
func logs(next uint64, n, size int) []*raft.Log {
	data := make([]byte, size)
	for i := range data {
		data[i] = byte(i * 7)
	}
	out := make([]*raft.Log, n)
	for i := range out {
		out[i] = &raft.Log{Index: next + uint64(i), Term: 1, Type: raft.LogCommand, Data: data, AppendedAt: time.Now()}
	}
	return out
}

// fill appends entries first..first+n-1 of size bytes in batches of 4096.
func fill(s store, first uint64, n, size int) error {
	for i := 0; i < n; i += 4096 {
		if err := s.StoreLogs(logs(first+uint64(i), min(4096, n-i), size)); err != nil {
			return err
		}
	}
	return nil
}

// storeLogs appends batches of n 1 KiB entries with indexes increasing from
// 1, as Raft does. The first ten batches warm up (file creation) untimed.
func storeLogs(n int) func(kind, time.Duration) (time.Duration, error) {
	return func(k kind, budget time.Duration) (time.Duration, error) {
		return withStore(k, func(s store) (time.Duration, error) {
			batch := logs(1, n, 1024)
			step := func() error {
				if err := s.StoreLogs(batch); err != nil {
					return err
				}
				for _, l := range batch {
					l.Index += uint64(n)
				}
				return nil
			}
			for range 10 {
				if err := step(); err != nil {
					return 0, err
				}
			}
			ops, start := 0, time.Now()
			for time.Since(start) < budget {
				if err := step(); err != nil {
					return 0, err
				}
				ops++
			}
			return time.Since(start) / time.Duration(ops), nil
		})
	}
}

// measureGetLog reads random entries of a 10,000-entry log of 1 KiB each.
func measureGetLog(k kind, budget time.Duration) (time.Duration, error) {
	const entries = 10000
	return withStore(k, func(s store) (time.Duration, error) {
		if err := fill(s, 1, entries, 1024); err != nil {
			return 0, err
		}
		r := rand.New(rand.NewPCG(1, 2))
		var l raft.Log
		ops, start := 0, time.Now()
		for time.Since(start) < budget {
			for range 100 {
				if err := s.GetLog(1+r.Uint64N(entries), &l); err != nil {
					return 0, err
				}
			}
			ops += 100
		}
		return time.Since(start) / time.Duration(ops), nil
	})
}

// measureDeleteRange deletes the 64 oldest entries at a time, as Raft
// compacts its log after a snapshot. Untimed, every 256 deletions it
// appends the next 256 × 64 entries (128 bytes) and calls settle.
func measureDeleteRange(k kind, budget time.Duration) (time.Duration, error) {
	const per, round = 64, 256
	return withStore(k, func(s store) (time.Duration, error) {
		var elapsed time.Duration
		ops, next := 0, uint64(1)
		for elapsed < budget {
			if err := fill(s, next, round*per, 128); err != nil {
				return 0, err
			}
			if err := s.settle(); err != nil {
				return 0, err
			}
			start := time.Now()
			for range round {
				if err := s.DeleteRange(next, next+per-1); err != nil {
					return 0, err
				}
				next += per
			}
			elapsed += time.Since(start)
			ops += round
		}
		return elapsed / time.Duration(ops), nil
	})
}
