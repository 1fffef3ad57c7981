package main

import (
	"bytes"
	"errors"
	"flag"
	"os"
	"strings"
	"testing"
)

// A bad flag is reported once, by the error main prints, with where to
// find the flags, and not followed by the whole usage; -h still prints
// the flags.
func TestFlagErrorIsOneLineNotTheUsage(t *testing.T) {
	var out, errb bytes.Buffer
	err := run([]string{"task", "list", "--nosuch", "--server", "http://127.0.0.1:1"}, &out, &errb)
	if err == nil || !strings.Contains(err.Error(), "flag provided but not defined: -nosuch") ||
		!strings.Contains(err.Error(), "run `warren task list -h` for its flags") {
		t.Errorf("task list --nosuch: %v", err)
	}
	if out.Len() > 0 || errb.Len() > 0 {
		t.Errorf("task list --nosuch printed more than its error: %q %q", out.String(), errb.String())
	}
	// -h: the flags, on the FlagSet's output, and flag.ErrHelp.
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	var help bytes.Buffer
	fs.SetOutput(&help)
	fs.Int("limit", 0, "stop after this many")
	if _, err := parse(fs, []string{"-h"}); !errors.Is(err, flag.ErrHelp) || !strings.Contains(help.String(), "-limit") {
		t.Errorf("-h: %v, printed %q; want the flags", err, help.String())
	}
	if fs.Output() != &help {
		t.Error("parse did not give the FlagSet its output back")
	}
}

// --deadline is drain's: cordon and uncordon refuse it rather than
// ignore it.
func TestCordonRefusesDeadline(t *testing.T) {
	for _, verb := range []string{"cordon", "uncordon"} {
		var out, errb bytes.Buffer
		err := run([]string{"nodes", verb, "n1", "--deadline", "1m", "--server", "http://127.0.0.1:1"}, &out, &errb)
		if err == nil || !strings.Contains(err.Error(), "-deadline") {
			t.Errorf("nodes %s --deadline: %v, want the flag refused", verb, err)
		}
	}
}

// `image list` of a store that is not there fails, naming it: a typo in
// --dir listed nothing and exited 0.
func TestImageListOfAMissingStoreFails(t *testing.T) {
	var out, errb bytes.Buffer
	missing := t.TempDir() + "/nosuch"
	err := run([]string{"image", "list", "--dir", missing}, &out, &errb)
	if err == nil || !strings.Contains(err.Error(), "image list: --dir: ") || !strings.Contains(err.Error(), missing) {
		t.Errorf("image list --dir %s: %v", missing, err)
	}
	if err := run([]string{"image", "list", "--dir", t.TempDir()}, &out, &errb); err != nil {
		t.Errorf("image list of an empty store: %v", err)
	}
}

// `task create --model-script` checks the script in full before it
// submits, naming the line: the servers check only that each line is a
// JSON object, and the node the rest, once the task has a sandbox.
func TestTaskCreateChecksTheModelScript(t *testing.T) {
	script := t.TempDir() + "/turns.jsonl"
	if err := os.WriteFile(script, []byte(`{"content":[{"type":"tool_use","name":"","input":{}}]}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	err := run([]string{"task", "create", "--repo", "https://git.example.com/a/b.git", "--base", "main", "--title", "t",
		"--model-script", script, "--server", "http://127.0.0.1:1"}, &out, &errb)
	if err == nil || !strings.Contains(err.Error(), "model-script: scripted: "+script+":1: content[0]: a tool_use needs a name") {
		t.Errorf("task create --model-script with a nameless tool_use: %v", err)
	}
}
