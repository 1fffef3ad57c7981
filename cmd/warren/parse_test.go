package main

import (
	"flag"
	"io"
	"slices"
	"strings"
	"testing"
)

// sandbox exec takes its flags before the command: from the command's name
// on, every argument is the command's. Before, `exec ID ls -la` failed on
// -la and `exec ID env -dir /x` took -dir as exec's own.
func TestParseUpToLeavesTheCommandsArgumentsAlone(t *testing.T) {
	for _, c := range []struct {
		args     []string
		pos      []string
		env, dir string
	}{
		{[]string{"ID", "ls", "-la"}, []string{"ID", "ls", "-la"}, "", ""},
		{[]string{"ID", "--", "ls", "-la"}, []string{"ID", "ls", "-la"}, "", ""},
		{[]string{"--env", "A=1", "ID", "env", "-dir", "/x"}, []string{"ID", "env", "-dir", "/x"}, "A=1", ""},
		{[]string{"ID", "--dir", "/w", "sh", "-c", "echo --env x -- y"}, []string{"ID", "sh", "-c", "echo --env x -- y"}, "", "/w"},
		{[]string{"ID", "grep", "--", "-v"}, []string{"ID", "grep", "--", "-v"}, "", ""},
		{[]string{"--stdin", "--", "ID", "cat"}, []string{"ID", "cat"}, "", ""},
	} {
		fs := flag.NewFlagSet("sandbox exec", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		env := fs.String("env", "", "")
		dir := fs.String("dir", "", "")
		fs.Bool("stdin", false, "")
		pos, err := parseUpTo(fs, c.args, 2)
		if err != nil {
			t.Errorf("%q: %v", c.args, err)
			continue
		}
		if !slices.Equal(pos, c.pos) || *env != c.env || *dir != c.dir {
			t.Errorf("%q: got %q env %q dir %q, want %q env %q dir %q", c.args, pos, *env, *dir, c.pos, c.env, c.dir)
		}
	}
}

// Other commands keep taking flags between and after their arguments, and
// "--" still ends them, unless it is a flag's value.
func TestParseTakesFlagsAnywhereUntilDashes(t *testing.T) {
	for _, c := range []struct {
		args []string
		pos  []string
		msg  string
	}{
		{[]string{"ID", "--msg", "hi", "more"}, []string{"ID", "more"}, "hi"},
		{[]string{"ID", "--", "--msg", "x"}, []string{"ID", "--msg", "x"}, ""},
		{[]string{"--msg", "--", "ID", "--msg", "y"}, []string{"ID"}, "y"},
	} {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		msg := fs.String("msg", "", "")
		pos, err := parse(fs, c.args)
		if err != nil {
			t.Errorf("%q: %v", c.args, err)
			continue
		}
		if !slices.Equal(pos, c.pos) || *msg != c.msg {
			t.Errorf("%q: got %q msg %q, want %q msg %q", c.args, pos, *msg, c.pos, c.msg)
		}
	}
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	if _, err := parse(fs, []string{"ID", "-la"}); err == nil || !strings.Contains(err.Error(), "-la") {
		t.Errorf("an unknown flag: %v, want an error naming it", err)
	}
}
