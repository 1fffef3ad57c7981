package guest

import (
	"context"
	"os"
	"path/filepath"
	"testing"
)

// StartFailureStatus reads the agent's own start failures as a shell
// would: 127 not found, 126 found but not run.
func TestStartFailureStatus(t *testing.T) {
	c := pair(t, &fakeSys{})
	dir := t.TempDir()
	plain := filepath.Join(dir, "plain")
	if err := os.WriteFile(plain, []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		req  ExecRequest
		want int
	}{
		{"not in PATH", ExecRequest{Argv: []string{"no-such-command"}}, 127},
		{"a path that does not exist", ExecRequest{Argv: []string{filepath.Join(dir, "missing")}}, 127},
		{"not executable", ExecRequest{Argv: []string{plain}}, 126},
		{"a directory", ExecRequest{Argv: []string{dir}}, 126},
		{"a working directory that does not exist", ExecRequest{Argv: []string{"true"}, Dir: filepath.Join(dir, "missing")}, 126},
	} {
		_, err := c.Exec(context.Background(), tc.req, nil, nil)
		if err == nil {
			t.Errorf("%s: started", tc.name)
			continue
		}
		// As an API client sees it: the node's and the server's prefixes.
		msg := "failed_precondition: sandbox sb-1: " + err.Error()
		if got := StartFailureStatus(msg); got != tc.want {
			t.Errorf("%s: StartFailureStatus(%q) = %d, want %d", tc.name, msg, got, tc.want)
		}
	}
	for _, msg := range []string{"", "unavailable: the sandbox's agent did not answer", `guest: read "/x": no such file or directory`} {
		if got := StartFailureStatus(msg); got != 0 {
			t.Errorf("StartFailureStatus(%q) = %d, want 0", msg, got)
		}
	}
}
