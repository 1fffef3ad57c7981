package forge

import (
	"bytes"
	"compress/zlib"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// base85 is git's encoding of a binary hunk's deflated data: lines of at
// most 52 bytes, each led by its length (A-Z for 1-26, a-z for 27-52).
func base85(data []byte) string {
	const en85 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz!#$%&()*+-;<=>?@^_`{|}~"
	var zb bytes.Buffer
	zw := zlib.NewWriter(&zb)
	zw.Write(data)
	zw.Close()
	z := zb.Bytes()
	var b strings.Builder
	for len(z) > 0 {
		n := min(len(z), 52)
		if n <= 26 {
			b.WriteByte(byte('A' + n - 1))
		} else {
			b.WriteByte(byte('a' + n - 27))
		}
		for i := 0; i < n; i += 4 {
			var acc uint32
			for j := 0; j < 4; j++ {
				acc <<= 8
				if i+j < n {
					acc |= uint32(z[i+j])
				}
			}
			var enc [5]byte
			for k := 4; k >= 0; k-- {
				enc[k] = en85[acc%85]
				acc /= 85
			}
			b.Write(enc[:])
		}
		b.WriteByte('\n')
		z = z[n:]
	}
	return b.String()
}

// varint is a delta header's size.
func varint(v uint64) []byte {
	var out []byte
	for {
		c := byte(v & 0x7f)
		if v >>= 7; v != 0 {
			out = append(out, c|0x80)
			continue
		}
		return append(out, c)
	}
}

// A delta hunk's result size is inside its deflated data, not declared
// on its line: a 4 KiB delta makes git apply allocate and fill 256 MiB (or
// any size) before it checks the result's hash. git apply now runs under a
// memory limit; before, it had none.
func TestApplyRunsGitUnderAMemoryLimit(t *testing.T) {
	needGit(t)
	repo, _ := newRepo(t)
	src := make([]byte, 64<<10)
	for i := range src {
		src[i] = byte(i % 251)
	}
	os.WriteFile(filepath.Join(repo, "src.bin"), src, 0o644)
	sh(t, repo, "add", "-A")
	sh(t, repo, "commit", "-qm", "src")
	old := sh(t, repo, "hash-object", "src.bin")
	ws := newWorkspace(t, repo)

	const result = 256 << 20
	delta := append(varint(uint64(len(src))), varint(result)...)
	for i := 0; i < result/len(src); i++ {
		delta = append(delta, 0x80) // copy 64 KiB from offset 0
	}
	patch := fmt.Sprintf("diff --git a/src.bin b/src.bin\nindex %s..%s 100644\nGIT binary patch\ndelta %d\n%s\n",
		old, strings.Repeat("1", 40), len(delta), base85(delta))

	prev := applyMemory
	applyMemory = 128 << 20
	t.Cleanup(func() { applyMemory = prev })
	_, err := ws.Apply(context.Background(), []byte(patch))
	if !errors.Is(err, ErrDiffTooLarge) || !strings.Contains(err.Error(), "memory") {
		t.Fatalf("a delta to 256 MiB under a 128 MiB limit: Apply err %v, want ErrDiffTooLarge for memory", err)
	}
}

// git apply runs with a deadline; before, it had none.
func TestApplyRunsGitWithADeadline(t *testing.T) {
	needGit(t)
	repo, _ := newRepo(t)
	ws := newWorkspace(t, repo)
	prev := applyTimeout
	applyTimeout = time.Nanosecond
	t.Cleanup(func() { applyTimeout = prev })
	patch := "diff --git a/a.txt b/a.txt\n--- a/a.txt\n+++ b/a.txt\n@@ -1 +1 @@\n-two\n+three\n"
	if _, err := ws.Apply(context.Background(), []byte(patch)); !errors.Is(err, ErrDiffTooLarge) {
		t.Fatalf("Apply past its deadline: err %v, want ErrDiffTooLarge", err)
	}
}
