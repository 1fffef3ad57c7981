package raftlog

import (
	"io"
	"path/filepath"
	"sync"
	"sync/atomic"

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
//
// A WAL being written is read only by a checkpoint (a raft snapshot),
// which copies it whole while the writer goes on. Without the zeros the
// copy is always a prefix of the log: the reader meets the end of the
// file where the writer is. With them it would read on into zeros and,
// if the writer crossed into the next block meanwhile, copy records,
// zeros, then newer records, which Pebble's reader rightly takes for
// corruption. So Open of a WAL being written returns the prefix written
// when it was opened: everything the checkpoint needs, since Pebble
// flushes the WAL before copying it (pebble.WithFlushedWAL).
type walFillFS struct {
	vfs.FS
	mu   sync.Mutex
	live map[string]*walFillFile // WALs being written, by path
}

func newWALFillFS(fs vfs.FS) *walFillFS {
	return &walFillFS{FS: fs, live: map[string]*walFillFile{}}
}

func (w *walFillFS) Create(name string, category vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := w.FS.Create(name, category)
	if err != nil || category != categoryWAL {
		return f, err
	}
	return w.track(name, &walFillFile{File: f}), nil
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
	return w.track(newname, wf), nil
}

func (w *walFillFS) track(name string, f *walFillFile) *walFillFile {
	f.fs, f.name = w, filepath.Clean(name)
	w.mu.Lock()
	w.live[f.name] = f
	w.mu.Unlock()
	return f
}

// Open of a WAL being written reads only what was written when it was
// opened.
func (w *walFillFS) Open(name string, opts ...vfs.OpenOption) (vfs.File, error) {
	f, err := w.FS.Open(name, opts...)
	if err != nil {
		return f, err
	}
	w.mu.Lock()
	wf := w.live[filepath.Clean(name)]
	w.mu.Unlock()
	if wf == nil {
		return f, nil
	}
	return &prefixFile{File: f, n: wf.written.Load()}, nil
}

// walFillFile tracks its writer's offset (Pebble writes a WAL
// sequentially, with Write, from one goroutine at a time) and the end of
// the written zeros.
type walFillFile struct {
	vfs.File
	fs   *walFillFS
	name string
	// written is where the next Write goes; the writer sets it, and
	// readers (walFillFS.Open) take it as the end of the log so far.
	written atomic.Int64
	filled  int64 // bytes [0, filled) are written (zeros or data)
	failed  bool  // a fill failed: stop filling this file
}

func (f *walFillFile) Write(p []byte) (int, error) {
	off := f.written.Load()
	if end := off + int64(len(p)); end > f.filled && !f.failed {
		f.fill(off, end)
	}
	n, err := f.File.Write(p)
	f.written.Store(off + int64(n))
	return n, err
}

func (f *walFillFile) Close() error {
	if f.fs != nil {
		f.fs.mu.Lock()
		if f.fs.live[f.name] == f {
			delete(f.fs.live, f.name)
		}
		f.fs.mu.Unlock()
	}
	return f.File.Close()
}

// fill writes zeros from the end of what is written (or the writer's
// offset off, if further) to at least one whole chunk past end.
func (f *walFillFile) fill(off, end int64) {
	to := (end+walFillChunk-1)/walFillChunk*walFillChunk + walFillChunk
	for from := max(f.filled, off); from < to; {
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

// prefixFile reads its file's first n bytes only.
type prefixFile struct {
	vfs.File
	n   int64
	pos int64 // for Read
}

func (f *prefixFile) Read(p []byte) (int, error) {
	n, err := f.ReadAt(p, f.pos)
	f.pos += int64(n)
	return n, err
}

func (f *prefixFile) ReadAt(p []byte, off int64) (int, error) {
	if off >= f.n {
		return 0, io.EOF
	}
	short := off+int64(len(p)) > f.n
	if short {
		p = p[:f.n-off]
	}
	n, err := f.File.ReadAt(p, off)
	if err == nil && short {
		err = io.EOF
	}
	return n, err
}

func (f *prefixFile) Stat() (vfs.FileInfo, error) {
	fi, err := f.File.Stat()
	if err != nil {
		return nil, err
	}
	return prefixInfo{fi, min(fi.Size(), f.n)}, nil
}

type prefixInfo struct {
	vfs.FileInfo
	size int64
}

func (i prefixInfo) Size() int64 { return i.size }
