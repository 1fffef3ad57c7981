package main

import (
	"bytes"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/warrenhq/warren/internal/freeaddr"
	"github.com/warrenhq/warren/scheduler"
)

// inProcessServer starts a single-voter scheduler in the test process and
// returns its API URL; tweaks change its config first.
func inProcessServer(t *testing.T, tweaks ...func(*scheduler.Config)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + ln.Addr().String()
	cfg := scheduler.Config{ID: "s1", DataDir: filepath.Join(t.TempDir(), "s1"),
		RaftAddr: freeaddr.Loopback(t), APIURL: url, Bootstrap: true, RaftLevel: "error"}
	for _, tweak := range tweaks {
		tweak(&cfg)
	}
	srv, err := scheduler.Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: srv.Handler()}
	go hs.Serve(ln)
	t.Cleanup(func() { srv.Close(); hs.Close() })
	deadline := time.Now().Add(15 * time.Second)
	for {
		var out, errb bytes.Buffer
		if run([]string{"cluster", "status", "--server", url}, &out, &errb) == nil {
			return url
		}
		if time.Now().After(deadline) {
			t.Fatal("server did not come up")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Client commands take --server URL[,URL...] (or $WARREN_SERVER), and
// the README's tour kills the leader of the three: a command whose server
// is down tries the next (only `task watch` did; the others failed with
// the first URL down).
func TestClientCommandsTryTheNextServer(t *testing.T) {
	live := inProcessServer(t)
	dead := "http://" + freeaddr.Loopback(t) // nothing listens there
	servers := dead + "," + live
	for _, args := range [][]string{
		{"cluster", "status"},
		{"nodes", "list"},
		{"task", "list"},
		{"task", "create", "--repo", "https://git.example.com/a/b.git", "--base", "main", "--title", "t", "-q"},
		{"pool", "list"},
		{"pool", "set", "default", "0"},
		{"sandbox", "ls"},
	} {
		var out, errb bytes.Buffer
		err := run(append(args, "--server", servers, "--timeout", "5s"), &out, &errb)
		if err != nil {
			t.Errorf("warren %s --server %s: %v (the second server is up)", strings.Join(args, " "), servers, err)
		}
	}
}

// A server that takes the connection and never answers (a hung process;
// a host that lost power behind a kept connection) is left for the next
// too: each attempt gets a share of --timeout. Before, the first attempt
// held all of it and the command failed with deadline_exceeded though
// the second server was up.
func TestClientCommandsLeaveASilentServer(t *testing.T) {
	live := inProcessServer(t)
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var held []net.Conn
	done := make(chan struct{})
	go func() { // accept, read nothing, answer nothing
		defer close(done)
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			held = append(held, c)
		}
	}()
	t.Cleanup(func() {
		silent.Close()
		<-done
		for _, c := range held {
			c.Close()
		}
	})
	servers := "http://" + silent.Addr().String() + "," + live
	for _, args := range [][]string{
		{"cluster", "status"},
		{"task", "list"},
		{"task", "create", "--repo", "https://git.example.com/a/b.git", "--base", "main", "--title", "t", "-q"},
		{"sandbox", "ls"},
	} {
		var out, errb bytes.Buffer
		start := time.Now()
		err := run(append(args, "--server", servers, "--timeout", "6s"), &out, &errb)
		if err != nil {
			t.Errorf("warren %s --server %s: %v after %v (the second server is up)", strings.Join(args, " "), servers, err, time.Since(start))
		}
	}
}

// `--script-steps 0` goes to the server, which refuses it naming
// spec.script.steps (it was dropped, and the task ran the agent loop);
// the other script flags without it are refused.
func TestScriptStepsZeroIsRefused(t *testing.T) {
	live := inProcessServer(t)
	for _, c := range []struct {
		flags []string
		want  string
	}{
		{[]string{"--script-steps", "0"}, "spec.script.steps"},
		{[]string{"--script-step-millis", "5"}, "--script-step-millis: only with --script-steps"},
	} {
		var out, errb bytes.Buffer
		err := run(append([]string{"task", "create", "--repo", "https://git.example.com/a/b.git", "--base", "main", "--title", "t",
			"--driver", "sim", "-o", "json", "--server", live}, c.flags...), &out, &errb)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v (created %s), want an error naming %s", c.flags, err, out.String(), c.want)
		}
	}
}
