package raftlog

import (
	"github.com/cockroachdb/pebble/v2/vfs"
)

// Zero-filling the WAL ahead of its writer.
//
// Every acknowledged write ends in an fdatasync of Pebble's WAL. When the
// write made the file longer, the filesystem must also commit the new size
// and the newly written extents (on ext4 a journal commit, whether or not
// the space was fallocated, as Pebble does with FALLOC_FL_KEEP_SIZE), so
// the sync costs about what two do. Pebble avoids it by recycling old WAL
// files, overwriting blocks that were written before; but a database's
// first WALs, and any WAL created while no old one is free, grow with
// every write. Measured on this machine's ext4 (a throwaway program, 300
// appends each, write then fdatasync): 17 KB appends 265–274 µs growing
// the file against 157–176 µs overwriting written blocks and 165–194 µs
// with 1 MiB of zeros written ahead (bench/README.md, thirtieth session).
//
// So a WAL file here is kept walFillChunk or more bytes ahead of its
// writer in written zeros: when a write would reach past them, the next
// chunks are written first, and the fdatasync that follows pays for the
// size change once per chunk instead of once per write. Pebble's WAL
// reader reads a zeroed tail as the end of an unfinished log, as it must
// for preallocated and recycled files: the newest WAL after a crash ends
// that way, and older WALs end in the EOF trailer Pebble writes when it
// closes one. Filling is best effort: if writing zeros fails (a full
// disk), the file is written as Pebble would without it.
const (
	walFillChunk = 1 << 20
	// categoryWAL is the write category Pebble gives vfs.FS.Create and
	// ReuseForWrite for WAL files.
	categoryWAL vfs.DiskWriteCategory = "pebble-wal"
)

// walFillFS zero-fills WAL files ahead of their writer; other files pass
// through.
type walFillFS struct {
	vfs.FS
}

func newWALFillFS(fs vfs.FS) *walFillFS { return &walFillFS{FS: fs} }

func (w *walFillFS) Create(name string, category vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := w.FS.Create(name, category)
	if err != nil || category != categoryWAL {
		return f, err
	}
	return &walFillFile{File: f}, nil
}

// ReuseForWrite is how Pebble recycles an old WAL: it is overwritten from
// the start, so only writes past its old size need filling.
func (w *walFillFS) ReuseForWrite(oldname, newname string, category vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := w.FS.ReuseForWrite(oldname, newname, category)
	if err != nil || category != categoryWAL {
		return f, err
	}
	wf := &walFillFile{File: f}
	if fi, err := f.Stat(); err == nil {
		wf.filled = fi.Size()
	}
	return wf, nil
}

// walFillFile tracks its writer's offset (Pebble writes a WAL
// sequentially, with Write, from one goroutine at a time) and the end of
// the written zeros.
type walFillFile struct {
	vfs.File
	off    int64 // where the next Write goes
	filled int64 // bytes [0, filled) are written (zeros or data)
	failed bool  // a fill failed: stop filling this file
}

func (f *walFillFile) Write(p []byte) (int, error) {
	if end := f.off + int64(len(p)); end > f.filled && !f.failed {
		f.fill(end)
	}
	n, err := f.File.Write(p)
	f.off += int64(n)
	return n, err
}

// fill writes zeros from the end of what is written (or the writer's
// offset, if further) to at least one whole chunk past end.
func (f *walFillFile) fill(end int64) {
	to := (end+walFillChunk-1)/walFillChunk*walFillChunk + walFillChunk
	for from := max(f.filled, f.off); from < to; {
		n := min(to-from, int64(len(walZeros)))
		if _, err := f.File.WriteAt(walZeros[:n], from); err != nil {
			f.failed = true
			return
		}
		from += n
		f.filled = from
	}
}

// walZeros is what fill writes, a chunk at a time.
var walZeros = make([]byte, walFillChunk)
