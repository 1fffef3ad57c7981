package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
	"github.com/warrenhq/warren/api/gen/warren/v1/warrenv1connect"
	"github.com/warrenhq/warren/internal/freeaddr"
)

// TestCLIContract runs the documented commands against `warren dev` and
// checks the parts users script against: `.id` from create -o json, one
// JSON object per line with seq and kind from watch -o json, watch exiting
// when the task ends, and clear errors naming the bad field.
func TestCLIContract(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a server process")
	}
	api := freeaddr.Loopback(t)
	host, port, _ := net.SplitHostPort(api)
	p, _ := strconv.Atoi(port)
	if p >= 65534 {
		t.Skip("no room for the raft port")
	}
	dev := exec.Command(warrenBin, "dev", "--data", filepath.Join(t.TempDir(), "dev"), "--api", api, "--raft", freeaddr.Loopback(t), "--log-level", "warn")
	if err := dev.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Process.Kill(); dev.Wait() })
	server := "--server=http://" + net.JoinHostPort(host, port)
	run := func(args ...string) (string, string, error) {
		cmd := exec.Command(warrenBin, append(args, server)...)
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		return out.String(), errb.String(), err
	}
	waitUntil(t, "dev to serve", 20*time.Second, func() bool {
		_, _, err := run("cluster", "status")
		return err == nil
	})

	out, stderr, err := run("task", "create", "--repo", "https://git.example.com/a/b.git", "--base", "main", "--title", "t", "-o", "json")
	if err != nil {
		t.Fatalf("create: %v %s", err, stderr)
	}
	var task struct {
		ID    string `json:"id"`
		State string `json:"state"`
	}
	if err := json.Unmarshal([]byte(out), &task); err != nil || task.ID == "" {
		t.Fatalf("create -o json printed %q: %v", out, err)
	}
	if _, stderr, err := run("task", "steer", task.ID, "look at b.go"); err != nil {
		t.Fatalf("steer: %v %s", err, stderr)
	}
	if out, _, err := run("task", "list", "--state", "pending"); err != nil || !strings.Contains(out, task.ID) {
		t.Fatalf("list --state pending: %v\n%s", err, out)
	}
	if _, stderr, err := run("task", "cancel", task.ID); err != nil {
		t.Fatalf("cancel: %v %s", err, stderr)
	}
	// The task was cancelled: watch prints its events and exits 2.
	out, stderr, err = run("task", "watch", task.ID, "-o", "json")
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 2 || !strings.Contains(stderr, "ended cancelled") {
		t.Fatalf("watch of a cancelled task: %v %s, want exit status 2", err, stderr)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	var kinds []string
	for i, l := range lines {
		var ev struct {
			Seq  uint64 `json:"seq"`
			Kind string `json:"kind"`
		}
		if err := json.Unmarshal([]byte(l), &ev); err != nil || ev.Seq != uint64(i+1) {
			t.Fatalf("watch line %d %q: seq %d, %v", i, l, ev.Seq, err)
		}
		kinds = append(kinds, ev.Kind)
	}
	if got := strings.Join(kinds, ","); got != "task_created,message,cancel_requested,state_changed" {
		t.Fatalf("watch kinds = %s", got)
	}
	out, _, _ = run("task", "watch", task.ID, "--after", "3", "-o", "json")
	if strings.Count(out, "\n") != 1 || !strings.Contains(out, `"seq":4`) {
		t.Fatalf("watch --after 3 = %q", out)
	}

	_, stderr, err = run("task", "create", "--repo", "ftp://x", "--base", "main", "--title", "t")
	if err == nil || !strings.Contains(stderr, "invalid_argument") || !strings.Contains(stderr, "spec.repo") {
		t.Fatalf("bad repo: err=%v stderr=%q", err, stderr)
	}
	_, stderr, err = run("task", "get", "not-an-id")
	if err == nil || !strings.Contains(stderr, "id:") {
		t.Fatalf("bad id: err=%v stderr=%q", err, stderr)
	}
	// Nodes: register one through the API (as a node daemon will), then
	// the operator verbs.
	cc := warrenv1connect.NewClusterServiceClient(http.DefaultClient, "http://"+net.JoinHostPort(host, port))
	if _, err := cc.RegisterNode(context.Background(), connect.NewRequest(&warrenv1.RegisterNodeRequest{Node: &warrenv1.Node{
		Id: "node-a", Drivers: []string{"sim"}, Capacity: &warrenv1.Resources{MilliCpu: 4000, MemoryBytes: 8 << 30},
	}})); err != nil {
		t.Fatal(err)
	}
	for _, step := range []struct{ args, want string }{
		{"nodes list", "node-a  ready   true"},
		{"nodes cordon node-a", "node node-a: ready, eligible=false"},
		{"nodes drain node-a --deadline 10m", "node node-a: draining, eligible=false"},
		{"nodes uncordon node-a", "node node-a: ready, eligible=true"},
	} {
		out, stderr, err := run(strings.Fields(step.args)...)
		if err != nil || !strings.Contains(out, step.want) {
			t.Fatalf("%s: %v %s\n%s", step.args, err, stderr, out)
		}
	}
	if _, stderr, err := run("nodes", "drain", "ghost"); err == nil || !strings.Contains(stderr, "not_found") {
		t.Fatalf("drain unknown node: %v %q", err, stderr)
	}

	out, _, err = run("cluster", "status", "-o", "json")
	if err != nil || !strings.Contains(out, `"raft_state":"leader"`) {
		t.Fatalf("cluster status -o json: %v %s", err, out)
	}
	// The text form names the peers, the leader, the term and indexes.
	if out, _, err = run("cluster", "status"); err != nil || !strings.Contains(out, "leader") || !strings.Contains(out, "term") || !strings.Contains(out, "index") {
		t.Fatalf("cluster status: %v\n%s", err, out)
	}
	// task get of a real task, by id.
	if out, _, err = run("task", "get", task.ID, "-o", "json"); err != nil || !strings.Contains(out, `"id":"`+task.ID+`"`) || !strings.Contains(strings.ToLower(out), "cancelled") {
		t.Fatalf("task get: %v\n%s", err, out)
	}
	// $WARREN_SERVER stands for --server.
	env := exec.Command(warrenBin, "task", "get", task.ID, "-o", "json")
	env.Env = append(os.Environ(), "WARREN_SERVER=http://"+net.JoinHostPort(host, port))
	if b, err := env.Output(); err != nil || !strings.Contains(string(b), `"id":"`+task.ID+`"`) {
		t.Fatalf("task get with WARREN_SERVER: %v\n%s", err, b)
	}
	// Without either, the default server, 127.0.0.1:7480: with nothing
	// listening there, the error names it.
	if c, err := net.DialTimeout("tcp", "127.0.0.1:7480", time.Second); err == nil {
		c.Close()
		t.Log("something listens on 127.0.0.1:7480: the default server is not checked")
	} else {
		def := exec.Command(warrenBin, "task", "get", task.ID, "--timeout", "2s")
		def.Env = append(os.Environ(), "WARREN_SERVER=")
		if b, err := def.CombinedOutput(); err == nil || !strings.Contains(string(b), "127.0.0.1:7480") {
			t.Fatalf("task get with no server given: %v\n%s; want an error naming 127.0.0.1:7480", err, b)
		}
	}
}
