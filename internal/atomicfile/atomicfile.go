// Package atomicfile replaces a file's contents in one step and makes the
// change durable: readers see the old file or the new one, never a part,
// concurrent writers never share a temporary file, and once WriteFile
// returns, the new contents and name survive a power loss. It also makes
// durable a file another process wrote (Sync) and a directory's entries
// (SyncDir). It imports nothing of warren's.
package atomicfile

import (
	"os"
	"path/filepath"
)

// syncFile flushes f (a file or a directory) to stable storage. A variable
// so that tests can see which syncs happen, and in which order.
var syncFile = (*os.File).Sync

// WriteFile writes data to a new temporary file beside path, syncs it,
// renames it over path and syncs the directory. Without the syncs a power
// loss soon after (ext4 commits every 5 s, and writes data back after up
// to 30 s) could leave the old file, an empty one, or a part of the new
// one under path, though WriteFile had returned.
func WriteFile(path string, data []byte, perm os.FileMode) error {
	return write(path, data, perm, true)
}

// Replace is WriteFile without the syncs: readers still see the old file
// or the new one, but a power loss may leave the old one (or an empty
// one). For a record that matters only while the machine runs, written
// on a path where a sync's millisecond counts (a warm claim's).
func Replace(path string, data []byte, perm os.FileMode) error {
	return write(path, data, perm, false)
}

func write(path string, data []byte, perm os.FileMode, durable bool) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	_, err = f.Write(data)
	if err == nil {
		err = f.Chmod(perm)
	}
	if err == nil && durable {
		err = syncFile(f)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return err
	}
	if !durable {
		return nil
	}
	return SyncDir(filepath.Dir(path))
}

// Sync makes the file at path durable, its contents and its name: for a
// file written some other way (by another process).
func Sync(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	err = syncFile(f)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return SyncDir(filepath.Dir(path))
}

// SyncDir makes dir's entries durable: the files made, renamed or removed
// in it.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = syncFile(d)
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}
