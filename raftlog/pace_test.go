package raftlog

import (
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
)

func TestPacedWritesSleepInProportionToWork(t *testing.T) {
	var slept []time.Duration
	fs := newPacedFS(vfs.NewMem())
	fs.sleep = func(d time.Duration) { slept = append(slept, d) }

	// Only flushes' and compactions' sstables are paced.
	for _, cat := range []vfs.DiskWriteCategory{vfs.WriteCategoryUnspecified, "pebble-wal", "pebble-manifest"} {
		f, err := fs.Create(string(cat), cat)
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := f.(*pacedFile); ok {
			t.Errorf("a file of category %q is paced", cat)
		}
	}
	for _, c := range []struct {
		cat vfs.DiskWriteCategory
		k   float64
	}{{categoryFlush, flushPace}, {categoryCompaction, compactionPace}} {
		slept = nil
		vf, err := fs.Create("x-"+string(c.cat), c.cat)
		if err != nil {
			t.Fatal(err)
		}
		f, ok := vf.(*pacedFile)
		if !ok {
			t.Fatalf("%s: not paced", c.cat)
		}
		write := func() {
			t.Helper()
			if _, err := f.Write([]byte("block")); err != nil {
				t.Fatal(err)
			}
		}
		if f.k != c.k {
			t.Fatalf("%s: paced with k %v, want %v", c.cat, f.k, c.k)
		}
		write() // nothing to pace yet
		if len(slept) != 0 {
			t.Fatalf("%s: first write slept %v", c.cat, slept)
		}
		time.Sleep(5 * time.Millisecond) // work
		write()
		if len(slept) != 1 || slept[0] < time.Duration(5*float64(time.Millisecond)*c.k) {
			t.Fatalf("%s: after 5ms of work slept %v, want at least %v times that", c.cat, slept, c.k)
		}
		// A writer that was away for long sleeps at most maxPaceSleep.
		f.last = time.Now().Add(-time.Second)
		write()
		if len(slept) != 2 || slept[1] != maxPaceSleep {
			t.Fatalf("%s: after 1s away slept %v, want %v", c.cat, slept[1:], maxPaceSleep)
		}
		// During a write stall nothing sleeps.
		fs.stalled.Store(1)
		time.Sleep(5 * time.Millisecond)
		write()
		fs.stalled.Store(0)
		if len(slept) != 2 {
			t.Fatalf("%s: slept %v during a write stall", c.cat, slept[2:])
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

func TestPacingFollowsWriteStalls(t *testing.T) {
	fs := newPacedFS(vfs.NewMem())
	var began, ended int
	l := pebble.EventListener{
		WriteStallBegin: func(pebble.WriteStallBeginInfo) { began++ },
		WriteStallEnd:   func() { ended++ },
	}
	fs.listen(&l)
	l.WriteStallBegin(pebble.WriteStallBeginInfo{Reason: "memtable count limit reached"})
	if fs.stalled.Load() == 0 || began != 1 {
		t.Fatalf("after a stall began: stalled %d, earlier listener called %d times", fs.stalled.Load(), began)
	}
	l.WriteStallEnd()
	if fs.stalled.Load() != 0 || ended != 1 {
		t.Fatalf("after the stall ended: stalled %d, earlier listener called %d times", fs.stalled.Load(), ended)
	}
}

// TestPacedDBWorks writes enough through a paced database to flush and
// compact, and reads it all back.
func TestPacedDBWorks(t *testing.T) {
	fs := newPacedFS(vfs.NewMem())
	var paced int
	fs.sleep = func(time.Duration) { paced++ }
	o := options(fs)
	o.MemTableSize = 1 << 20
	o.L0CompactionThreshold = 2
	l := pebble.EventListener{}
	fs.listen(&l)
	var flushes, compactions int
	l.FlushEnd = func(pebble.FlushInfo) { flushes++ }
	l.CompactionEnd = func(pebble.CompactionInfo) { compactions++ }
	o.EventListener = &l
	db, err := open("db", o)
	if err != nil {
		t.Fatal(err)
	}
	val := make([]byte, 1024)
	for i := range 8000 {
		if err := db.Set([]byte{FSMPrefixStart, byte(i >> 8), byte(i)}, val, pebble.NoSync); err != nil {
			t.Fatal(err)
		}
	}
	if err := db.Flush(); err != nil {
		t.Fatal(err)
	}
	for i := range 8000 {
		v, closer, err := db.Get([]byte{FSMPrefixStart, byte(i >> 8), byte(i)})
		if err != nil || len(v) != len(val) {
			t.Fatalf("key %d: %v (%d bytes)", i, err, len(v))
		}
		closer.Close()
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if flushes == 0 || paced == 0 {
		t.Fatalf("%d flushes and %d paced writes; want some of each", flushes, paced)
	}
	t.Logf("%d flushes, %d compactions, %d paced writes", flushes, compactions, paced)
}
