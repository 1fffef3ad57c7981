package raftlog

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/hashicorp/raft"
)

// The benchmarks run on the real disk (b.TempDir) with every write synced.
// bench/logstore compares the same operations with raft-boltdb and raft-wal.

func benchStore(b *testing.B) *Store {
	d := openTestDB(b, vfs.Default, b.TempDir())
	s, err := New(d.db)
	if err != nil {
		b.Fatal(err)
	}
	return s
}

func benchLogs(next uint64, n, size int) []*raft.Log {
	data := make([]byte, size)
	for i := range data {
		data[i] = byte(i)
	}
	logs := make([]*raft.Log, n)
	for i := range logs {
		logs[i] = &raft.Log{Index: next + uint64(i), Term: 1, Type: raft.LogCommand, Data: data}
	}
	return logs
}

func BenchmarkStoreLogs(b *testing.B) {
	for _, n := range []int{1, 16, 256} {
		b.Run(fmt.Sprintf("batch=%d", n), func(b *testing.B) {
			s := benchStore(b)
			logs := benchLogs(1, n, 1024)
			b.SetBytes(int64(n * 1024))
			b.ResetTimer()
			for range b.N {
				if err := s.StoreLogs(logs); err != nil {
					b.Fatal(err)
				}
				for _, l := range logs {
					l.Index += uint64(n)
				}
			}
		})
	}
}

func BenchmarkGetLog(b *testing.B) {
	const entries = 10000
	s := benchStore(b)
	for i := 1; i <= entries; i += 256 {
		if err := s.StoreLogs(benchLogs(uint64(i), 256, 1024)); err != nil {
			b.Fatal(err)
		}
	}
	r := rand.New(rand.NewPCG(1, 2))
	var l raft.Log
	b.ResetTimer()
	for range b.N {
		if err := s.GetLog(1+r.Uint64N(entries), &l); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDeleteRange times deleting the 64 oldest entries of the log, as
// Raft does after a snapshot (with many more entries per call).
//
// Each range deletion leaves a tombstone in the memtable, and Pebble
// re-fragments a memtable's tombstones once after each new one, when the
// next iterator or Get is built. Raft deletes once per snapshot, so a real
// memtable holds a handful; to measure that rather than a memtable with
// b.N tombstones, the benchmark flushes the memtable (untimed) every
// deleteChunk deletions, while it adds the next entries to delete.
func BenchmarkDeleteRange(b *testing.B) {
	const per, deleteChunk = 64, 256
	d := openTestDB(b, vfs.Default, b.TempDir())
	s, err := New(d.db)
	if err != nil {
		b.Fatal(err)
	}
	next := uint64(1) // next index to delete
	b.ResetTimer()
	for i := range b.N {
		if i%deleteChunk == 0 {
			b.StopTimer()
			for j := 0; j < deleteChunk*per; j += 4096 {
				if err := s.StoreLogs(benchLogs(next+uint64(j), 4096, 128)); err != nil {
					b.Fatal(err)
				}
			}
			if err := d.db.Flush(); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
		if err := s.DeleteRange(next, next+per-1); err != nil {
			b.Fatal(err)
		}
		next += per
	}
}
