package raftlog

import (
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// Pacing of Pebble's background writes.
//
// A memtable flush or a compaction is CPU work done in a burst: on a busy
// server it competes with raft and the FSM for the same cores, and every
// server of a cluster flushes at about the same moment (they apply the same
// entries). Measured with bench/appends (1024 writers, 3 servers on 2
// cores), each flush slowed appends for a quarter of a second and the first
// large compaction for almost two, and those moments held most of the
// slowest 1% of appends. Pacing spreads the same work over a longer time:
// after each write of a flush's or a compaction's sstable, the writer
// sleeps for k times as long as it worked since its previous write, so it
// uses at most 1/(1+k) of a core while it runs. Nothing is skipped and no
// guarantee changes; the work just finishes later.
//
// Pacing never prolongs a write stall: while Pebble is holding foreground
// writes back (too many memtables waiting for a flush, or too many L0
// sublevels), background writes run at full speed.
const (
	// flushPace: a flush takes about twice as long. A 32 MiB memtable
	// flushed in ~0.3 s (bench/appends) then takes ~0.6 s, well inside
	// the ~1.3 s the next one takes to fill at 27,000 events/s; three
	// more may fill before writes stop.
	flushPace = 1.0
	// compactionPace: a compaction takes about four times as long. L0
	// gathers a few more sublevels meanwhile, far from the stop-writes
	// threshold of 32.
	compactionPace = 3.0
	// maxPaceSleep bounds one sleep, so a writer that was descheduled for
	// long (which counts as work) does not then sleep for as long again.
	maxPaceSleep = 100 * time.Millisecond
)

// Write categories Pebble gives vfs.FS.Create for sstables.
const (
	categoryFlush      vfs.DiskWriteCategory = "pebble-memtable-flush"
	categoryCompaction vfs.DiskWriteCategory = "pebble-compaction"
)

// pacedFS paces the sstables written by flushes and compactions; every
// other file (the WAL above all) is written at once.
type pacedFS struct {
	vfs.FS
	// stalled is > 0 while Pebble stalls foreground writes.
	stalled atomic.Int32
	sleep   func(time.Duration) // time.Sleep; tests replace it
}

func newPacedFS(fs vfs.FS) *pacedFS { return &pacedFS{FS: fs, sleep: time.Sleep} }

// listen adds the write-stall tracking to l.
func (p *pacedFS) listen(l *pebble.EventListener) {
	begin, end := l.WriteStallBegin, l.WriteStallEnd
	l.WriteStallBegin = func(i pebble.WriteStallBeginInfo) {
		p.stalled.Store(1)
		if begin != nil {
			begin(i)
		}
	}
	l.WriteStallEnd = func() {
		p.stalled.Store(0)
		if end != nil {
			end()
		}
	}
}

func (p *pacedFS) Create(name string, category vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := p.FS.Create(name, category)
	if err != nil {
		return f, err
	}
	var k float64
	switch category {
	case categoryFlush:
		k = flushPace
	case categoryCompaction:
		k = compactionPace
	default:
		return f, nil
	}
	return &pacedFile{File: f, fs: p, k: k}, nil
}

// pacedFile sleeps before each write for k times the time since its
// previous write began (at most maxPaceSleep; not during a write stall).
// Pebble writes an sstable from one goroutine at a time.
type pacedFile struct {
	vfs.File
	fs   *pacedFS
	k    float64
	last time.Time
}

func (f *pacedFile) Write(b []byte) (int, error) {
	if !f.last.IsZero() && f.fs.stalled.Load() == 0 {
		if d := min(time.Duration(float64(time.Since(f.last))*f.k), maxPaceSleep); d > 0 {
			f.fs.sleep(d)
		}
	}
	f.last = time.Now()
	return f.File.Write(b)
}
