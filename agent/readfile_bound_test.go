package agent

import (
	"bytes"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// read_file of a file of 8 MiB of newlines over a range of 9 million
// lines returns at most MaxFileBytes, and says where to go on. Before, it
// split the file into 8.4 million lines (a slice of 134 MiB) and numbered
// them all: some 75 MiB of output, kept whole as the result's Full (and
// by the loop as a blob).
func TestReadFileOfManyLinesIsBounded(t *testing.T) {
	tl := newRepo(t)
	if err := os.WriteFile(filepath.Join(tl.Root, "lines.txt"), bytes.Repeat([]byte("\n"), MaxFileBytes), 0o644); err != nil {
		t.Fatal(err)
	}
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	r := call(t, tl, ToolReadFile, `{"path":"lines.txt","start_line":1,"end_line":9000000}`)
	runtime.ReadMemStats(&after)
	if r.IsError {
		t.Fatalf("read_file: %s", r.View)
	}
	if len(r.Full) > MaxFileBytes {
		t.Errorf("read_file: %d bytes of Full; want at most %d", len(r.Full), MaxFileBytes)
	}
	if !strings.Contains(r.View, "of 8388608: read_file returns at most 8388608 bytes; ask for more with start_line ") {
		t.Errorf("the view's end does not say what was cut: %q", r.View[max(len(r.View)-300, 0):])
	}
	// The file itself (8 MiB, read by the test's sandbox), the output and
	// its copies: under 64 MiB here, 112 MiB with the race detector (make
	// test), well under what the old code allocated (853 MiB).
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 256<<20 {
		t.Errorf("read_file allocated %d MiB", alloc>>20)
	}
}

func TestNumberLines(t *testing.T) {
	for _, c := range []struct {
		name, content string
		start, end    int
		limit         int
		want          string
	}{
		{"all", "a\nb\n", 0, 0, 1000, "     1\ta\n     2\tb\n"},
		{"no newline at the end", "a\nb", 2, 0, 1000, "     2\tb\n"},
		{"empty", "", 0, 0, 1000, ""},
		{"a range", "a\nb\nc\n", 2, 2, 1000, "     2\tb\n[lines 2-2 of 3; ask for more with start_line]\n"},
		{"cut by the limit", strings.Repeat("x\n", 100), 1, 100, 160 + 30,
			"     1\tx\n     2\tx\n     3\tx\n[lines 1-3 of 100: read_file returns at most 190 bytes; ask for more with start_line 4]\n"},
		// room for 4 bytes of the line: the cut falls before the é (bytes 3-4)
		{"one line over the limit", "aaaé" + strings.Repeat("y", 100) + "\n", 0, 0, 160 + 12,
			"     1\taaa\n[line 1 of 1 cut after its first 3 bytes: read_file returns at most 172 bytes; see the rest with run_command]\n"},
	} {
		r := numberLines([]byte(c.content), "f", c.start, c.end, c.limit)
		if r.IsError || string(r.Full) != c.want || r.View != c.want {
			t.Errorf("%s: %q (error %v), want %q", c.name, r.Full, r.IsError, c.want)
		}
	}
	if r := numberLines([]byte("a\n"), "f", 3, 0, 1000); !r.IsError || !strings.Contains(r.View, "f has 1 lines; start_line 3 is past the end") {
		t.Errorf("past the end: %+v", r)
	}
}

// A file over MaxFileBytes is refused whole, whatever range is asked for,
// and the model is told to look into it another way: the message said
// "read a range of lines", and a range was refused the same way.
func TestReadFileOverTheLimitSaysWhatToDo(t *testing.T) {
	tl := newRepo(t)
	if err := os.WriteFile(filepath.Join(tl.Root, "big.txt"), bytes.Repeat([]byte("x\n"), MaxFileBytes/2+1), 0o644); err != nil {
		t.Fatal(err)
	}
	r := call(t, tl, ToolReadFile, `{"path":"big.txt","start_line":1,"end_line":10}`)
	if !r.IsError || !strings.Contains(r.View, "too large for read_file, whatever range you ask for; look into it with run_command") {
		t.Fatalf("read_file of a range of a file over the limit: %q", r.View)
	}
}
