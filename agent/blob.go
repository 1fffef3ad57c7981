package agent

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// BlobStore keeps tool outputs too large for an event: content-addressed,
// so a retried step stores the same blob once.
type BlobStore interface {
	// Put stores data and returns its reference, "sha256:<hex>".
	Put(data []byte) (string, error)
}

// DirBlobs is a BlobStore in a directory on the node:
// <dir>/<first two hex digits>/<the rest>.
type DirBlobs struct{ Dir string }

// Put writes data unless a blob with its hash is there already (write,
// then rename: a crash leaves no half blob under the name).
func (d DirBlobs) Put(data []byte) (string, error) {
	sum := sha256.Sum256(data)
	h := hex.EncodeToString(sum[:])
	p := filepath.Join(d.Dir, h[:2], h[2:])
	if _, err := os.Stat(p); err == nil {
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
	if !ok || len(h) != 64 || strings.Trim(h, "0123456789abcdef") != "" {
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
