package agent

import (
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/warrenhq/warren/forge"
)

// TestPRBodyShowsTheFindingsFirst checks that the model's text (its
// finish) and the sandbox's test log, both untrusted, cannot hide the
// checks' findings in the rendered pull request: the findings come
// first, "<" in the model's text is escaped (no HTML comment, no HTML),
// the test log is fenced with more backticks than it holds in a row, and
// the body says the tests passed in a clean sandbox with only the diff.
func TestPRBodyShowsTheFindingsFirst(t *testing.T) {
	rep := &forge.Report{Files: 1, Added: 1, SHA256: strings.Repeat("a", 64),
		Findings: []forge.Finding{{Kind: forge.FindTests, Action: forge.Flag, Path: "calc/calc_test.go", Message: "edits tests, which the task did not ask for"}}}
	body := prBody(PRContent{TaskID: "t1", IssueTitle: "x", Report: rep,
		Finish:      &Finish{Summary: "Fixed Add. <!--", Cause: "<details><summary>x", Fix: "a < b"},
		TestCommand: "go test ./...", TestOutput: "ok\n````\n<!--\n"})
	checks, summary, tests := strings.Index(body, "## Checks"), strings.Index(body, "## Summary"), strings.Index(body, "## Tests")
	if checks < 0 || summary < checks || tests < summary {
		t.Errorf("want Checks, Summary, Tests in that order:\n%s", body)
	}
	if !strings.Contains(body, "edits tests") {
		t.Errorf("no finding:\n%s", body)
	}
	model := body[summary:tests]
	if strings.Contains(model, "<") {
		t.Errorf("the model's text keeps a raw <:\n%s", model)
	}
	for _, want := range []string{"Fixed Add. &lt;!--", "&lt;details>", "a &lt; b"} {
		if !strings.Contains(model, want) {
			t.Errorf("want %q in:\n%s", want, model)
		}
	}
	if !strings.Contains(body, "`go test ./...` passed in a clean sandbox (the base commit with only this diff applied):\n\n") {
		t.Errorf("the body does not say where the tests ran:\n%s", body)
	}
	// The log's fence is longer than its own run of 4 backticks, and
	// closes after it.
	if !strings.Contains(body, "\n`````\nok\n````\n<!--\n`````\n") {
		t.Errorf("the test log is not fenced with 5 backticks:\n%s", body)
	}
}

func TestPRBodyFencesAndSpans(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"go test ./...", "`go test ./...`"},
		{"echo `x`", "`` echo `x` ``"},
		{"a `b` c", "``a `b` c``"},
		{"`x`", "`` `x` ``"},
		{"a\nb", "`a b`"},
	} {
		if got := codeSpan(c.in); got != c.want {
			t.Errorf("codeSpan(%q) = %q, want %q", c.in, got, c.want)
		}
	}
	for _, c := range []struct{ in, want string }{
		{"ok\n", "```\nok\n```\n"},
		{"a ``` b", "````\na ``` b\n````\n"},
		{"", "```\n\n```\n"},
	} {
		if got := fenced(c.in); got != c.want {
			t.Errorf("fenced(%q) = %q, want %q", c.in, got, c.want)
		}
	}
	// A multi-line test command goes in a fence of its own.
	body := prBody(PRContent{TaskID: "t1", Finish: &Finish{Summary: "s"}, TestCommand: "set -e\nmake test", TestOutput: "ok"})
	if !strings.Contains(body, "The test command passed in a clean sandbox (the base commit with only this diff applied):\n\n```\nset -e\nmake test\n```\n") {
		t.Errorf("multi-line command:\n%s", body)
	}
}

// TestTestsRequestedIsAWordMatch checks that an issue asks for test
// edits only when it mentions tests as a word, not when "test" is part
// of another word ("latest", "fastest", "attestation", "contest").
func TestTestsRequestedIsAWordMatch(t *testing.T) {
	for issue, want := range map[string]bool{
		"Crash on the latest release":                  false,
		"Fastest path is wrong":                        false,
		"Attestation upload fails":                     false,
		"The contest page is blank; protest loudly":    false,
		"Detests empty input":                          false,
		"Add a test for Add":                           true,
		"Tests are missing for Sub":                    true,
		"Please add unit tests":                        true,
		"Add a unit-test":                              true,
		"The unittest suite fails":                     true,
		"Run pytest on it":                             true,
		"Improve testing of the parser":                true,
		"calc_test.go is wrong":                        true,
		"Fix test_parser.py":                           true,
		"TEST: Add(2, 2)":                              true,
		"Add is wrong\nSee the failing test in calc/.": true,
	} {
		if got := TestsRequested(issue); got != want {
			t.Errorf("TestsRequested(%q) = %v, want %v", issue, got, want)
		}
	}
}

// git commit refuses a NUL in its message on every try: the finish's
// text is checked for control characters, newlines and tabs aside.
func TestFinishControlChar(t *testing.T) {
	for _, tc := range []struct {
		f    Finish
		want string // "" for none
	}{
		{Finish{Summary: "Add adds.\n\n\tIndented, ✓ <ok>."}, ""},
		{Finish{Summary: "Add\x00adds."}, "summary holds the control character U+0000 at byte 3"},
		{Finish{Summary: "ok", Cause: "a \x1b[31mred\x1b[0m cause"}, "cause holds the control character U+001B at byte 2"},
		{Finish{Summary: "ok", Fix: "line\r\n"}, "fix holds the control character U+000D at byte 4"},
		{Finish{Summary: "ok", Fix: "c1 \u0085"}, "fix holds the control character U+0085 at byte 3"},
	} {
		err := tc.f.ControlChar()
		if got := fmt.Sprint(err); (tc.want == "" && err != nil) || (tc.want != "" && got != tc.want) {
			t.Errorf("%q: %v, want %q", tc.f, err, tc.want)
		}
	}
}

// GitHub refuses a pull request body over 65,536 characters (422) on
// every try; the model's text can be any length, and each "<" in it is
// four characters in the body. Before, the body had no cap and the task
// failed with its branch pushed and no pull request.
func TestPRBodyIsCapped(t *testing.T) {
	for name, f := range map[string]*Finish{
		"angles":     {Summary: strings.Repeat("<", 30000)},
		"multi-byte": {Summary: "ok", Fix: strings.Repeat("é", 70000)},
		"fields":     {Summary: strings.Repeat("s", 30000), Cause: strings.Repeat("c", 30000), Fix: strings.Repeat("f", 30000)},
	} {
		body := prBody(PRContent{TaskID: "t-1", Finish: f, TestCommand: "go test ./...", TestOutput: "ok",
			Report: &forge.Report{Files: 1, Added: 1, SHA256: "abc"}})
		if len(body) > maxPRBody || !utf8.ValidString(body) {
			t.Errorf("%s: a body of %d bytes (valid UTF-8 %v), want at most %d", name, len(body), utf8.ValidString(body), maxPRBody)
		}
		if !strings.Contains(body, "cut here") || !strings.HasSuffix(body, "Opened by warren for task `t-1`.\n") || !strings.HasPrefix(body, "## Checks") {
			t.Errorf("%s: the body does not keep its start and end with a note of the cut:\n%s…%s", name, body[:100], body[len(body)-300:])
		}
	}
	short := prBody(PRContent{TaskID: "t-1", Finish: &Finish{Summary: "Add adds."}})
	if strings.Contains(short, "cut here") {
		t.Errorf("a short body was cut:\n%s", short)
	}
}
