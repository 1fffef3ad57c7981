// Package atomicfile replaces a file's contents in one step: readers see
// the old file or the new one, never a part, and concurrent writers never
// share a temporary file. It imports nothing of warren's.
package atomicfile

import (
	"os"
	"path/filepath"
)

// WriteFile writes data to a new temporary file beside path and renames it
// over path.
func WriteFile(path string, data []byte, perm os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	_, err = f.Write(data)
	if err == nil {
		err = f.Chmod(perm)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
	}
	return err
}
