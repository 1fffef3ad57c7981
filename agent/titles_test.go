package agent

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// A long issue title is cut at a character's start, never inside one.
func TestPRTitleIsCutAtACharacter(t *testing.T) {
	title := strings.Repeat("a", 199) + "é and more"
	got := prTitle(PRContent{IssueTitle: title})
	if !utf8.ValidString(got) {
		t.Fatalf("title %q is not valid UTF-8", got)
	}
	if want := "Fix: " + strings.Repeat("a", 199); got != want {
		t.Fatalf("title %q, want %q", got, want)
	}
}

// A finish without a summary says so, and only that (it read
// "give at least a summary (<nil>)").
func TestFinishWithoutASummarySaysSo(t *testing.T) {
	tl := newRepo(t)
	r := call(t, tl, ToolFinish, `{"summary":"  "}`)
	if !r.IsError || strings.Contains(r.View, "nil") || !strings.Contains(r.View, "give at least a summary") {
		t.Fatalf("finish without a summary: %+v", r)
	}
}
