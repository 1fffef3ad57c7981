package forge

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
)

// MaxTreeBytes bounds a task's tree at its commit, in the bytes of its tar
// archive (Workspace.Tar, which the node holds in memory whole for each
// task it starts, in a buffer sized once from Checkout's count, then
// copies into the sandbox): Checkout counts it from the tree's listing before it
// writes a file (each file's size and a 512-byte header for each entry,
// as in the archive), and Tar stops git past it. 1 GiB is far more than
// the trees of the repositories coding tasks work on (tens to hundreds of
// MB; the Linux kernel's, well over a GB, is refused) and far less
// than a node's memory, which it must share with its sandboxes. A
// repository of a few KB can name one large blob from thousands of paths,
// or one tree from thousands of trees: a tree of many GB, which would
// fill the node's memory or disk. A variable for the tests.
var MaxTreeBytes = 1 << 30

// ErrTreeTooLarge is a tree over MaxTreeBytes. A task on it cannot start.
var ErrTreeTooLarge = errors.New("the repository's tree is too large")

// treeSize counts, from git ls-tree -r -t -l -z's output written to it, the
// bytes git archive would make of the tree, and fails a write once that is
// over max: the caller then stops git.
type treeSize struct {
	max     int
	n       int    // so far: 20 KiB of the archive's global header, end and padding
	partial []byte // an entry not yet ended by its NUL
}

func newTreeSize(max int) *treeSize { return &treeSize{max: max, n: 20 << 10} }

func (t *treeSize) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		i := bytes.IndexByte(p, 0)
		if i < 0 {
			if len(t.partial)+len(p) > 64<<10 { // a path is at most 4 KiB
				return 0, errors.New("git ls-tree: an entry without an end")
			}
			t.partial = append(t.partial, p...)
			break
		}
		entry := p[:i]
		if len(t.partial) > 0 {
			entry = append(t.partial, entry...)
			t.partial = t.partial[:0]
		}
		p = p[i+1:]
		t.n += entrySize(entry)
		if t.n > t.max {
			return 0, ErrTreeTooLarge
		}
	}
	return n, nil
}

// entrySize is what one entry of ls-tree -l ("<mode> <type> <id> <size>\t<path>",
// size "-" for a tree or a submodule) takes in a tar archive: a header, a
// pax header for a path over 100 bytes, and the content rounded up to
// 512-byte blocks.
func entrySize(entry []byte) int {
	meta, path, _ := bytes.Cut(entry, []byte{'\t'})
	size := 0
	if f := bytes.Fields(meta); len(f) == 4 {
		size, _ = strconv.Atoi(string(f[3])) // "-": 0
	}
	n := 512 + (size+511)/512*512
	if len(path) >= 100 {
		n += 512 + (len(path)+64+511)/512*512
	}
	return n
}

// treeTooLarge is the error of a tree over MaxTreeBytes.
func treeTooLarge(what, repo, commit string) error {
	return fmt.Errorf("%s of %s at %s: %w: over %d bytes (forge.MaxTreeBytes), counting a 512-byte header for each file and directory; it may name one large file from many paths",
		what, repo, commit, ErrTreeTooLarge, MaxTreeBytes)
}
