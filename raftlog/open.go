package raftlog

import (
	"fmt"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/bloom"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// Keyspace: one Pebble DB per server, by first byte of the key.
const (
	// PrefixLog is followed by a uint64 big-endian index; the value is an
	// encoded raft.Log.
	PrefixLog byte = 0x01
	// PrefixStable is followed by the stable store's key bytes.
	PrefixStable byte = 0x02
	// FSMPrefixStart..FSMPrefixEnd (exclusive), that is 0x10..0x1f, are
	// reserved for the FSM (package scheduler); raftlog never touches them.
	FSMPrefixStart byte = 0x10
	FSMPrefixEnd   byte = 0x20 // exclusive
)

// Tuning for a database whose hot path is small synced appends (the Raft
// log) followed later by deletion of the oldest entries, shared with a
// moderately sized FSM.
const (
	// memTableSize is large enough that a typical window of Raft entries
	// (between two snapshots) is written and range-deleted while still in
	// memtables, so most log bytes never reach an sstable.
	memTableSize = 32 << 20
	// memTableStopWritesThreshold lets a flush run while up to three more
	// memtables fill, so a slow flush does not stall appends.
	memTableStopWritesThreshold = 4
	// l0StopWritesThreshold is raised from Pebble's default of 12 so that a
	// burst of flushes is absorbed by L0 instead of stalling commits.
	l0StopWritesThreshold = 32
	// l0CompactionThreshold (Pebble's default is 4) lets more flushed
	// sublevels gather in L0 before they are compacted into the base level.
	// The events keyspace is ordered by task, so every flush overlaps the
	// whole base level, and each L0 compaction rewrites it: fewer, larger
	// compactions rewrite it less often. Reads pay with more L0 sublevels to
	// merge, and the FSM's hot reads are cached or bloom-filtered. Measured
	// with bench/appends (1024 writers, 3 appenders): higher throughput in
	// 6 of 7 alternating pairs, about 4% (bench/README.md).
	l0CompactionThreshold = 16
	// cacheSize is the block cache for sstable reads (GetLog of entries
	// that were flushed, and the FSM).
	cacheSize = 32 << 20
	// bytesPerSync smooths sstable writes during flushes and compactions;
	// it has no effect on durability.
	bytesPerSync = 1 << 20
	// bloomBitsPerKey gives point lookups (GetLog, stable Get) a ~1% false
	// positive rate per sstable.
	bloomBitsPerKey = 10
)

// Open opens, creating it if needed, the server's Pebble database at dir with
// options tuned for a Raft log. The WAL is on and Store syncs every write.
// Flushes and compactions are paced (pace.go), and WAL files are
// zero-filled ahead of their writer (walfill.go). The caller closes the
// returned DB.
func Open(dir string) (*pebble.DB, error) {
	fs := newPacedFS(newWALFillFS(vfs.Default))
	o := options(fs)
	l := pebble.EventListener{}
	fs.listen(&l)
	o.EventListener = &l
	return open(dir, o)
}

// OpenWithFS is Open with an injected filesystem, for tests that use
// vfs.NewMem or errorfs, without pacing or WAL filling.
func OpenWithFS(dir string, fs vfs.FS) (*pebble.DB, error) {
	return open(dir, options(fs))
}

func open(dir string, o *pebble.Options) (*pebble.DB, error) {
	db, err := pebble.Open(dir, o)
	if err != nil {
		return nil, fmt.Errorf("raftlog: open %s: %w", dir, err)
	}
	return db, nil
}

func options(fs vfs.FS) *pebble.Options {
	o := &pebble.Options{
		FS:                          fs,
		FormatMajorVersion:          pebble.FormatNewest,
		MemTableSize:                memTableSize,
		MemTableStopWritesThreshold: memTableStopWritesThreshold,
		L0StopWritesThreshold:       l0StopWritesThreshold,
		L0CompactionThreshold:       l0CompactionThreshold,
		CacheSize:                   cacheSize,
		BytesPerSync:                bytesPerSync,
		Logger:                      QuietLogger{},
	}
	for i := range o.Levels {
		o.Levels[i].FilterPolicy = bloom.FilterPolicy(bloomBitsPerKey)
	}
	return o
}

// QuietLogger drops Pebble's informational messages (it logs every WAL
// replayed on open) and passes errors and fatal errors to Pebble's default
// logger, which writes them through the standard library's log package.
// The API takes no logger, so this is the least noisy honest choice.
type QuietLogger struct{}

func (QuietLogger) Infof(string, ...any) {}

func (QuietLogger) Errorf(format string, args ...any) {
	pebble.DefaultLogger.Errorf(format, args...)
}

func (QuietLogger) Fatalf(format string, args ...any) {
	pebble.DefaultLogger.Fatalf(format, args...)
}
