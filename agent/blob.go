package agent

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// BlobStore keeps tool outputs too large for an event: content-addressed,
// so a retried step stores the same blob once.
type BlobStore interface {
	// Put stores data and returns its reference, "sha256:<hex>".
	Put(data []byte) (string, error)
}

// DirBlobs is a BlobStore in a directory on the node:
// <dir>/<first two hex digits>/<the rest>. A blob's mtime is when it was
// last written or reused (Put); Sweep removes those unused for long.
type DirBlobs struct{ Dir string }

// sweepMu keeps Sweep from removing a blob between Put's finding it and
// refreshing its mtime: Put holds it shared, Sweep each removal alone.
// (One process uses a blob directory: the node's.)
var sweepMu sync.RWMutex

// Put writes data unless a blob with its hash is there already (write,
// then rename: a crash leaves no half blob under the name). A blob it
// reuses gets a fresh mtime, so Sweep keeps it.
func (d DirBlobs) Put(data []byte) (string, error) {
	sum := sha256.Sum256(data)
	h := hex.EncodeToString(sum[:])
	p := filepath.Join(d.Dir, h[:2], h[2:])
	sweepMu.RLock()
	defer sweepMu.RUnlock()
	if _, err := os.Stat(p); err == nil {
		now := time.Now()
		if err := os.Chtimes(p, now, now); err != nil {
			return "", fmt.Errorf("blob: %w", err)
		}
		return "sha256:" + h, nil
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return "", fmt.Errorf("blob: %w", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(p), ".tmp-*")
	if err != nil {
		return "", fmt.Errorf("blob: %w", err)
	}
	if _, err = tmp.Write(data); err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), p)
	}
	if err != nil {
		os.Remove(tmp.Name())
		return "", fmt.Errorf("blob: %w", err)
	}
	return "sha256:" + h, nil
}

// Get reads a blob back, checking its hash.
func (d DirBlobs) Get(ref string) ([]byte, error) {
	h, ok := strings.CutPrefix(ref, "sha256:")
	if !ok || !isHex(h, 64) {
		return nil, fmt.Errorf("blob: %q is not a sha256: reference", ref)
	}
	b, err := os.ReadFile(filepath.Join(d.Dir, h[:2], h[2:]))
	if err != nil {
		return nil, fmt.Errorf("blob: %w", err)
	}
	sum := sha256.Sum256(b)
	if hex.EncodeToString(sum[:]) != h {
		return nil, errors.New("blob: the content does not match its hash")
	}
	return b, nil
}

// StaleTmpAge is how old a Put's temporary file (".tmp-*") must be for
// Sweep to take it for one a crash left: a Put writes at most a tool's
// output, in seconds.
const StaleTmpAge = time.Hour

// Sweep removes the blobs last written or reused (Put) more than
// olderThan before now, and the temporary files of Puts that did not
// finish, older than StaleTmpAge. It reports how
// many files it removed and their bytes. Files that are neither (another
// name, a folder) are left alone, and so are the two-digit folders, which
// a Put may be about to write in. A missing directory has nothing to
// sweep. The error joins every removal that failed; Sweep goes on past
// each. Sweep is safe to call while Puts run.
func (d DirBlobs) Sweep(olderThan time.Duration, now time.Time) (removed int, freed int64, err error) {
	tops, err := os.ReadDir(d.Dir)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, 0, nil
	}
	if err != nil {
		return 0, 0, fmt.Errorf("blob sweep: %w", err)
	}
	var errs []error
	for _, top := range tops {
		if !top.IsDir() || !isHex(top.Name(), 2) {
			continue
		}
		dir := filepath.Join(d.Dir, top.Name())
		files, err := os.ReadDir(dir)
		if err != nil {
			errs = append(errs, fmt.Errorf("blob sweep: %w", err))
			continue
		}
		for _, f := range files {
			age := olderThan
			switch name := f.Name(); {
			case !f.Type().IsRegular():
				continue
			case strings.HasPrefix(name, ".tmp-"):
				age = StaleTmpAge
			case !isHex(name, 62):
				continue
			}
			n, err := sweepFile(filepath.Join(dir, f.Name()), now.Add(-age))
			if err != nil {
				errs = append(errs, fmt.Errorf("blob sweep: %w", err))
			}
			if n >= 0 {
				removed++
				freed += n
			}
		}
	}
	return removed, freed, errors.Join(errs...)
}

// sweepFile removes p if its mtime is before cutoff, and returns its size
// (-1: kept, or gone already).
func sweepFile(p string, cutoff time.Time) (int64, error) {
	sweepMu.Lock()
	defer sweepMu.Unlock()
	fi, err := os.Lstat(p) // now, under the lock: a Put may have reused it
	if errors.Is(err, fs.ErrNotExist) {
		return -1, nil
	}
	if err != nil {
		return -1, err
	}
	if !fi.ModTime().Before(cutoff) {
		return -1, nil
	}
	if err := os.Remove(p); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return -1, nil
		}
		return -1, err
	}
	return fi.Size(), nil
}

// isHex reports whether s is n lowercase hex digits.
func isHex(s string, n int) bool {
	return len(s) == n && strings.Trim(s, "0123456789abcdef") == ""
}
