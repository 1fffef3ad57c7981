package scheduler

import (
	"archive/tar"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/cockroachdb/pebble/v2"
	"github.com/hashicorp/raft"

	"github.com/warrenhq/warren/raftlog"
)

// A snapshot is a Pebble checkpoint of the FSM's key span, taken on the
// FSM goroutine (cheap: hard links plus a WAL copy) and streamed as a tar
// archive through raft's sink while applies go on.

var fsmSpan = pebble.CheckpointSpan{Start: []byte{raftlog.FSMPrefixStart}, End: []byte{raftlog.FSMPrefixEnd}}

// Snapshot implements raft.FSM.
func (f *FSM) Snapshot() (raft.FSMSnapshot, error) {
	if f.broken.Load() {
		// Its applied index is 0, so any server would restore it in
		// full, and serve reads of its missing tasks.
		return nil, errors.New("no snapshot of a state left incomplete by a snapshot restore that failed midway")
	}
	if err := os.MkdirAll(f.tmpDir, 0o700); err != nil {
		return nil, err
	}
	parent, err := os.MkdirTemp(f.tmpDir, "snap-")
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(parent, "db")
	applied := f.Applied() // on the FSM goroutine: what the checkpoint holds
	if err := f.db.Checkpoint(dir, pebble.WithFlushedWAL(), pebble.WithRestrictToSpans([]pebble.CheckpointSpan{fsmSpan})); err != nil {
		os.RemoveAll(parent)
		return nil, fmt.Errorf("checkpoint: %w", err)
	}
	return &checkpointSnapshot{parent: parent, dir: dir, applied: applied}, nil
}

type checkpointSnapshot struct {
	parent, dir string
	applied     uint64
}

// appliedEntry is the archive's first entry: the applied index the
// checkpoint holds (8 bytes, big-endian). A restore that finds it at or
// below its own skips the archive without unpacking it: raft restores the
// newest snapshot at every start, and unpacking a large one only to skip
// it took its size again on the disk (a nearly full disk then failed the
// start).
const appliedEntry = "warren-applied-index"

func (s *checkpointSnapshot) Persist(sink raft.SnapshotSink) error {
	if err := writeTar(sink, s.dir, s.applied); err != nil {
		sink.Cancel()
		return fmt.Errorf("stream snapshot: %w", err)
	}
	return sink.Close()
}

func (s *checkpointSnapshot) Release() { os.RemoveAll(s.parent) }

func writeTar(w io.Writer, dir string, applied uint64) error {
	tw := tar.NewWriter(w)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	if err := tw.WriteHeader(&tar.Header{Name: appliedEntry, Mode: 0o600, Size: 8, Typeflag: tar.TypeReg}); err != nil {
		return err
	}
	if _, err := tw.Write(binary.BigEndian.AppendUint64(nil, applied)); err != nil {
		return err
	}
	for _, e := range entries {
		if !e.Type().IsRegular() {
			continue
		}
		if err := addFile(tw, dir, e.Name()); err != nil {
			return err
		}
	}
	return tw.Close()
}

func addFile(tw *tar.Writer, dir, name string) error {
	fh, err := os.Open(filepath.Join(dir, name))
	if err != nil {
		return err
	}
	defer fh.Close()
	st, err := fh.Stat()
	if err != nil {
		return err
	}
	if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o600, Size: st.Size(), Typeflag: tar.TypeReg}); err != nil {
		return err
	}
	_, err = io.Copy(tw, fh)
	return err
}

// Restore implements raft.FSM. It unpacks the checkpoint, and if it is
// newer than the local state, replaces the FSM span with its contents. A
// snapshot at or below the local applied index is skipped: committed
// entries never change, so the local state already includes it.
func (f *FSM) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	if err := os.MkdirAll(f.tmpDir, 0o700); err != nil {
		return err
	}
	parent, err := os.MkdirTemp(f.tmpDir, "restore-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(parent)
	dir := filepath.Join(parent, "db")
	skip := func(index uint64) bool { return index != 0 && index <= f.Applied() }
	if err := readTar(rc, dir, skip); errors.Is(err, errSnapshotOld) {
		f.log.Info("snapshot restore skipped: local state is newer", "applied", f.Applied())
		return nil
	} else if err != nil {
		return fmt.Errorf("unpack snapshot: %w", err)
	}
	src, err := pebble.Open(dir, &pebble.Options{ReadOnly: true, Logger: raftlog.QuietLogger{}})
	if err != nil {
		return fmt.Errorf("open snapshot: %w", err)
	}
	defer src.Close()
	var snapIndex uint64
	if v, closer, err := src.Get(keyApplied); err == nil {
		if len(v) != 8 {
			closer.Close()
			return fmt.Errorf("snapshot: its applied index is %d bytes, want 8", len(v))
		}
		snapIndex = binary.BigEndian.Uint64(v)
		closer.Close()
	} else if !errors.Is(err, pebble.ErrNotFound) {
		return err
	}
	if snapIndex != 0 && snapIndex <= f.Applied() {
		f.log.Info("snapshot restore skipped: local state is newer", "snapshot_index", snapIndex, "applied", f.Applied())
		return nil
	}
	// Odd while restoring. A restore that failed after it began to
	// replace the state leaves the counter odd (see below), so this one
	// may find it odd already.
	wasBroken := f.restores.Load()%2 == 1
	if !wasBroken {
		f.restores.Add(1)
	}
	restored, replacing := false, false
	defer func() {
		switch {
		case restored:
		case replacing:
			// The state may be anything between the old one and the
			// snapshot's. Forget the applied index, so that whatever
			// snapshot raft restores next (an older one, at start, or
			// the leader's again) is restored in full rather than
			// skipped as older than the local state; and keep the
			// counter odd, so that reads (readGuard) fail until one is.
			f.applied.Store(0)
			f.broken.Store(true)
			f.log.Error("snapshot restore failed midway: local state unusable until a snapshot is restored", "snapshot_index", snapIndex)
			// Streams waiting for their next event read again, meet
			// readGuard's refusal and end, so that their clients go to
			// another server: woken by nothing else, they waited silent
			// for as long as restores kept failing.
			f.watch.notifyAll()
		case !wasBroken:
			f.restores.Add(1) // nothing replaced: reads go on as before
		}
	}()
	clear(f.live) // before the copy: a failed copy must not leave stale entries
	clear(f.lastReq)
	f.reqs.reset()
	replacing = true
	if err := f.replaceFrom(src); err != nil {
		return fmt.Errorf("restore snapshot: %w", err)
	}
	if err := f.idem.load(f.db); err != nil {
		return fmt.Errorf("restore snapshot: load idempotency records: %w", err)
	}
	f.applied.Store(snapIndex)
	f.broken.Store(false)
	f.replanGen.Add(1)
	f.restores.Add(1) // even again, before the wake-up: streams read on
	restored = true
	f.watch.notifyAll()
	f.notifyPools()
	f.log.Info("snapshot restored", "index", snapIndex)
	return nil
}

// restoreCopyHook, when set (tests only), runs in replaceFrom after the
// FSM span was cleared and before the copy; an error it returns fails the
// restore there, as a failed write midway would.
var restoreCopyHook func() error

// replaceFrom clears the FSM span and copies src's FSM span in, in
// chunks. The applied index is removed first and written last, so a crash
// midway leaves applied=0 and raft restores the snapshot again on start.
func (f *FSM) replaceFrom(src *pebble.DB) error {
	if err := f.db.Delete(keyApplied, pebble.Sync); err != nil {
		return err
	}
	if err := f.db.DeleteRange(fsmSpan.Start, fsmSpan.End, pebble.Sync); err != nil {
		return err
	}
	if restoreCopyHook != nil {
		if err := restoreCopyHook(); err != nil {
			return err
		}
	}
	it, err := src.NewIter(&pebble.IterOptions{LowerBound: fsmSpan.Start, UpperBound: fsmSpan.End})
	if err != nil {
		return err
	}
	defer it.Close()
	b := f.db.NewBatch()
	var applied []byte
	for ok := it.First(); ok; ok = it.Next() {
		if string(it.Key()) == string(keyApplied) {
			applied = append([]byte(nil), it.Value()...)
			continue
		}
		if err := b.Set(it.Key(), it.Value(), nil); err != nil {
			return err
		}
		if b.Len() > 4<<20 {
			if err := b.Commit(pebble.NoSync); err != nil {
				return err
			}
			b = f.db.NewBatch()
		}
	}
	if err := it.Error(); err != nil {
		return err
	}
	if applied != nil {
		if err := b.Set(keyApplied, applied, nil); err != nil {
			return err
		}
	}
	return b.Commit(pebble.Sync)
}

// errSnapshotOld is readTar's answer to an archive skip refused.
var errSnapshotOld = errors.New("snapshot not newer than the local state")

// readTar unpacks a snapshot archive into dir. An archive that starts
// with its applied index (appliedEntry; older ones do not) is not
// unpacked when skip says so.
// sparse reports whether h is a sparse file (PAX GNU.sparse.* records):
// archive/tar would expand it to its declared size, so a few KiB of
// archive could fill the disk. A snapshot never has one.
func sparse(h *tar.Header) bool {
	for k := range h.PAXRecords {
		if strings.HasPrefix(k, "GNU.sparse.") {
			return true
		}
	}
	return false
}

func readTar(r io.Reader, dir string, skip func(index uint64) bool) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	tr := tar.NewReader(r)
	for first := true; ; first = false {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if h.Name == appliedEntry {
			var b [8]byte
			if !first || h.Size != 8 {
				return fmt.Errorf("unexpected entry %q in snapshot", h.Name)
			}
			if _, err := io.ReadFull(tr, b[:]); err != nil {
				return err
			}
			if skip(binary.BigEndian.Uint64(b[:])) {
				return errSnapshotOld
			}
			continue
		}
		name := filepath.Base(h.Name)
		if h.Typeflag != tar.TypeReg || name != h.Name || strings.HasPrefix(name, ".") || sparse(h) {
			return fmt.Errorf("unexpected entry %q in snapshot", h.Name)
		}
		out, err := os.OpenFile(filepath.Join(dir, name), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
		if err != nil {
			return err
		}
		_, err = io.Copy(out, tr)
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
	}
}
