package scheduler

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	fsmv1 "github.com/warrenhq/warren/api/gen/warren/fsm/v1"
	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
	"github.com/warrenhq/warren/api/gen/warren/v1/warrenv1connect"
)

// The cluster API is reachable by whoever reaches the API port: a
// forwarded command's time is checked, since an event stamped in the year
// 14645 could not be written as JSON, and its task's SSE stream would fail
// on it for good.
func TestForwardedCommandsNeedAValidTime(t *testing.T) {
	id := "01JZ0000000000000000000000"
	far := timestamppb.New(time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC))
	far.Seconds += 400 * 366 * 86400
	for _, c := range []struct {
		name string
		ts   *timestamppb.Timestamp
		want string
	}{
		{"no time", nil, "time: required"},
		{"past 9999", far, "after 9999-12-31"},
		{"bad nanos", &timestamppb.Timestamp{Seconds: t0.Unix(), Nanos: -1}, "time: "},
	} {
		for _, m := range []Command{
			{Type: CmdSendMessage, Body: &fsmv1.SendMessage{TaskId: id, Text: "x", RequestId: "r", Time: c.ts}},
			{Type: CmdCancelTask, Body: &fsmv1.CancelTask{TaskId: id, RequestId: "r", Time: c.ts}},
			{Type: CmdAppendEvents, Body: &fsmv1.AppendEvents{TaskId: id, RequestId: "r", Events: []*warrenv1.EventInput{logEvent("x")}, Time: c.ts}},
		} {
			if err := validateForwarded(m); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("%s, %T: %v, want %q", c.name, m.Body, err, c.want)
			}
		}
	}
	ok := Command{Type: CmdSendMessage, Body: &fsmv1.SendMessage{TaskId: id, Text: "x", RequestId: "r", Time: timestamppb.New(t0)}}
	if err := validateForwarded(ok); err != nil {
		t.Errorf("a valid time: %v", err)
	}
}

// A message's event holds the text as JSON, where <, > and & take six
// bytes each: a text within the 32 KiB limit whose event would pass 64
// KiB is refused, naming text, and never makes an event over the limit.
func TestMessageTextFitsItsEvent(t *testing.T) {
	id := "01JZ0000000000000000000000"
	for _, c := range []struct {
		text string
		ok   bool
	}{
		{strings.Repeat("a", maxMessage), true},
		{strings.Repeat("<", 10000), true},
		{strings.Repeat("<", 11000), false},
		{strings.Repeat("\x01", 20000), false},
	} {
		err := validateMessage(&warrenv1.SendMessageRequest{TaskId: id, Text: c.text})
		if (err == nil) != c.ok || (err != nil && !strings.Contains(err.Error(), "text: ") && !strings.Contains(err.Error(), "over the limit of 65536")) {
			t.Errorf("%d bytes of %q: %v, want ok %v", len(c.text), c.text[:1], err, c.ok)
		}
		if err == nil {
			if n := len(mustJSON(map[string]string{"from": "user", "text": c.text})); n > MaxPayloadBytes {
				t.Errorf("an accepted text makes an event of %d bytes", n)
			}
		}
	}
}

// A policy rule's command is compiled only within its limit, and the
// error, which quotes the pattern, is cut: 8 MiB of pattern made an error
// of 8 MiB after 0.75 s of compiling. Rules past the limit of 64 are not
// checked one by one.
func TestPolicyPatternsAreBoundedBeforeCompiling(t *testing.T) {
	spec := &warrenv1.TaskSpec{Repo: "https://example.com/r.git", Base: "main", IssueTitle: "x"}
	spec.Policy = []*warrenv1.PolicyRule{{Tool: "run_command", Tier: "deny", Command: "(" + strings.Repeat("a", 8<<20)}}
	for range 1000 {
		spec.Policy = append(spec.Policy, &warrenv1.PolicyRule{Tool: "run_command", Tier: "deny", Command: "(" + strings.Repeat("é", 500)})
	}
	err := validateCreate(&warrenv1.CreateTaskRequest{Spec: spec})
	if err == nil {
		t.Fatal("accepted")
	}
	msg := err.Error()
	if len(msg) > 64<<10 || !utf8.ValidString(msg) {
		t.Errorf("an error of %d bytes (valid UTF-8: %v)", len(msg), utf8.ValidString(msg))
	}
	for _, want := range []string{"spec.policy: 1001 rules is over the limit of 64", "spec.policy[0].command", "spec.policy[1].command: not an RE2 regular expression"} {
		if !strings.Contains(msg, want) {
			t.Errorf("the error lacks %q: %.300s", want, msg)
		}
	}
	if strings.Contains(msg, "spec.policy[64]") {
		t.Error("rules past the limit were checked one by one")
	}
}

// A second server on a data directory in use is refused, saying so, not
// with Pebble's "resource temporarily unavailable"; a data directory that
// is a file is named as --data.
func TestServerDataDirectoryErrors(t *testing.T) {
	dir := t.TempDir()
	startNode(t, dir, "s1", true, "", 0)
	_, err := Open(Config{ID: "s1", DataDir: filepath.Join(dir, "s1"), RaftAddr: "127.0.0.1:1", APIURL: "http://127.0.0.1:2", Bootstrap: true, RaftLevel: "error"})
	if err == nil || !strings.Contains(err.Error(), "is in use by another warren server") {
		t.Errorf("a second server on the directory: %v", err)
	}
	file := filepath.Join(dir, "f")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = Open(Config{ID: "s3", DataDir: filepath.Join(file, "x"), RaftAddr: "127.0.0.1:1", APIURL: "http://127.0.0.1:2", Bootstrap: true, RaftLevel: "error"})
	if err == nil || !strings.HasPrefix(err.Error(), "data: ") {
		t.Errorf("a data directory under a file: %v", err)
	}
}

// A server whose join the cluster refuses for good (a live voter has its
// id) says so on Failed, which warren server exits on: serving on as no
// member, it looked healthy to its supervisor.
func TestARefusedJoinFailsTheServer(t *testing.T) {
	nodes := startCluster(t, 0)
	dup := startNode(t, t.TempDir(), nodes[2].srv.ID(), false, nodes[0].url, 0)
	select {
	case err := <-dup.srv.Failed():
		if !strings.Contains(err.Error(), "give this server another --id") {
			t.Errorf("Failed: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the refused server did not fail")
	}
}

// A server started on another server's data directory under a new --id is
// refused, naming the id the directory has: it served before as no voter,
// with no leader, its writes never committing.
func TestServerRefusesAnotherServersDataDirectory(t *testing.T) {
	dir := t.TempDir()
	n := startNode(t, dir, "s9", true, "", 0)
	n.stop()
	_, err := Open(Config{ID: "s10", DataDir: filepath.Join(dir, "s9"), RaftAddr: "127.0.0.1:1", APIURL: "http://127.0.0.1:2", Bootstrap: true, RaftLevel: "error"})
	if err == nil || !strings.Contains(err.Error(), "is server s9's") || !strings.Contains(err.Error(), "--id s9") {
		t.Fatalf("a server s10 on s9's directory: %v", err)
	}
}

// A second process given a node's --id is refused while the node's own
// session is live: the two took the session from each other about once a
// second, each registering the node as itself. Once the first has gone,
// the id is free.
func TestASecondNodeWithALiveNodesIDIsRefused(t *testing.T) {
	_, url, hc := leadingServer(t, 2*time.Second)
	first := openFakeNode(t, url, hc, "n1")
	// Attached: the welcome comes before the attach, so a hello right
	// after it could find no session yet (seen once on a loaded machine).
	first.report(t, nil)
	hello := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		st := warrenv1connect.NewNodeServiceClient(hc, url).Session(ctx)
		defer st.CloseRequest()
		if err := st.Send(&warrenv1.SessionRequest{Msg: &warrenv1.SessionRequest_Hello{Hello: &warrenv1.Hello{
			Node:        &warrenv1.Node{Id: "n1", Drivers: []string{"sim"}, Capacity: &warrenv1.Resources{MilliCpu: 1000, MemoryBytes: 1 << 30}},
			Incarnation: "another-process"}}}); err != nil {
			return err
		}
		_, err := st.Receive()
		return err
	}
	err := hello()
	if connect.CodeOf(err) != connect.CodeAlreadyExists || !strings.Contains(err.Error(), "two nodes were given --id n1") {
		t.Fatalf("a second n1: %v, want already_exists", err)
	}
	first.end()
	waitFor(t, "the id to be free", 10*time.Second, func() bool { return hello() == nil })
}

// An empty server-id (a crash before its first write reached the disk) is
// unclaimed, not a server named "" that refuses every --id.
func TestClaimDataDirTakesAnEmptyServerID(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, serverIDFile), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := claimDataDir(dir, "s1"); err != nil {
		t.Fatalf("an empty server-id: %v", err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, serverIDFile)); string(b) != "s1\n" {
		t.Fatalf("server-id holds %q", b)
	}
	if err := claimDataDir(dir, "s2"); err == nil || !strings.Contains(err.Error(), "is server s1's") {
		t.Fatalf("s2 on s1's directory: %v", err)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, serverIDFile+".*")); len(left) != 0 {
		t.Fatalf("temporary files left: %v", left)
	}
}
