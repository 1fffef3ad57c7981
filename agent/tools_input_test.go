package agent

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"
)

// A required field the model left out (or sent as null) is a tool error
// naming it, not "": read as "", a missing new_string deleted the text
// and a missing content emptied the file.
func TestMissingRequiredFieldsAreToolErrors(t *testing.T) {
	tl := newRepo(t)
	for _, c := range []struct{ tool, input, want string }{
		{ToolEditFile, `{"path":"go.mod","old_string":"module demo\n"}`, "new_string: required"},
		{ToolEditFile, `{"path":"go.mod","old_string":"module demo\n","new_string":null}`, "new_string: required"},
		{ToolEditFile, `{"path":"go.mod","new_string":"x"}`, "old_string: required"},
		{ToolEditFile, `{"old_string":"a","new_string":"b"}`, "path: required"},
		{ToolWriteFile, `{"path":"go.mod"}`, "content: required"},
		{ToolWriteFile, `{"path":"go.mod","content":null}`, "content: required"},
		{ToolWriteFile, `{"content":"x"}`, "path: required"},
	} {
		r := call(t, tl, c.tool, c.input)
		if !r.IsError || !strings.Contains(r.View, c.want) {
			t.Errorf("%s %s: %+v, want a tool error saying %q", c.tool, c.input, r, c.want)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(tl.Root, "go.mod")); string(b) != "module demo\n" {
		t.Errorf("go.mod is now %q", b)
	}
	// "" given outright still deletes, and writes an empty file.
	if r := call(t, tl, ToolWriteFile, `{"path":"empty.txt","content":""}`); r.IsError {
		t.Errorf("an empty file: %s", r.View)
	}
}

// An old_string whose matches overlap occurs more than once: the edit is
// refused as ambiguous, not made at the first match.
func TestEditFileCountsOverlappingMatches(t *testing.T) {
	tl := newRepo(t)
	p := filepath.Join(tl.Root, "x.txt")
	if err := os.WriteFile(p, []byte("}\n}\n}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r := call(t, tl, ToolEditFile, `{"path":"x.txt","old_string":"}\n}\n","new_string":"X\n"}`)
	if !r.IsError || !strings.Contains(r.View, "occurs 2 times") {
		t.Errorf("ambiguous edit: %+v", r)
	}
	if n := occurrences("aaaa", "aa"); n != 3 {
		t.Errorf("occurrences(aaaa, aa) = %d, want 3", n)
	}
}

// An edit may not make a file larger than write_file could write.
func TestEditFileKeepsTheSizeLimit(t *testing.T) {
	tl := newRepo(t)
	p := filepath.Join(tl.Root, "big.txt")
	if err := os.WriteFile(p, []byte(strings.Repeat("a", MaxFileBytes-10)+"MARK"), 0o644); err != nil {
		t.Fatal(err)
	}
	in, _ := json.Marshal(map[string]string{"path": "big.txt", "old_string": "MARK", "new_string": strings.Repeat("b", 1000)})
	r := call(t, tl, ToolEditFile, string(in))
	if !r.IsError || !strings.Contains(r.View, "over the limit") {
		t.Errorf("edit past the limit: %+v", r)
	}
	if fi, _ := os.Stat(p); fi.Size() > MaxFileBytes {
		t.Errorf("big.txt is %d bytes", fi.Size())
	}
}

// A timeout of more seconds than a time.Duration holds is the longest
// timeout, not a wrapped-around few milliseconds.
func TestRunCommandTimeoutDoesNotWrap(t *testing.T) {
	tl := newRepo(t)
	r := call(t, tl, ToolRunCommand, `{"command":"sleep 1; echo ok","timeout_seconds":18446744074}`)
	if r.IsError || !strings.Contains(r.View, "ok") {
		t.Errorf("%+v", r)
	}
}

// A view stays within ViewBytes and is cut between characters; a
// command's stdout and stderr share it.
func TestViewsStayWithinTheirSize(t *testing.T) {
	for _, b := range [][]byte{
		[]byte("x" + strings.Repeat("é", ViewBytes)),
		[]byte(strings.Repeat("é", ViewBytes) + "x"),
		[]byte(strings.Repeat("a", 10*ViewBytes)),
	} {
		if s := view(b); len(s) > ViewBytes || !utf8.ValidString(s) {
			t.Errorf("view of %d bytes: %d bytes, valid UTF-8 %v", len(b), len(s), utf8.ValidString(s))
		}
	}
	tl := newRepo(t)
	r := call(t, tl, ToolRunCommand, `{"command":"head -c 100000 /dev/zero | tr '\\0' a; head -c 100000 /dev/zero | tr '\\0' b >&2"}`)
	if len(r.View) > ViewBytes {
		t.Errorf("run_command's view is %d bytes, over %d", len(r.View), ViewBytes)
	}
}
