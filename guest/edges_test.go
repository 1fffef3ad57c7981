package guest

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"testing/iotest"
	"time"

	"github.com/hashicorp/yamux"
)

// The host gives up on an exec while it still sends the command's stdin,
// and the agent kills the command:
//   - "closed": the command closes its stdin; the agent drops the rest
//     and still sees the host give up. (With stdin behind an io.Pipe the
//     agent's frame loop blocked on the write for good: the host's cancel
//     never reached it.)
//   - "unread": the command keeps its stdin open but never reads it, so
//     the agent's frame loop waits on the full pipe; the host's cancel
//     reaches it as a call of its own (OpCancel). (Before, the command ran
//     on until it ended or timed out.)
func TestExecStdinStillCancels(t *testing.T) {
	for _, tc := range []struct{ name, script string }{
		{"closed", "exec 0<&-; echo $$ > %s; sleep 30"},
		{"unread", "echo $$ > %s; exec sleep 30"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := pair(t, &fakeSys{})
			pidFile := filepath.Join(t.TempDir(), "pid")
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			go func() {
				waitForFile(pidFile)
				time.Sleep(200 * time.Millisecond) // the pipe is full by now
				cancel()
			}()
			_, err := c.Exec(ctx, ExecRequest{Argv: []string{"sh", "-c", fmt.Sprintf(tc.script, pidFile)},
				Stdin: bytes.NewReader(make([]byte, 4<<20))}, nil, nil)
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("err %v, want context.Canceled", err)
			}
			assertGone(t, pidFile)
		})
	}
}

// A cancel names an exec of its own session: a host that reconnected
// (stream ids start again from 1) cannot kill an exec its last session
// left running.
func TestExecCancelIsPerSession(t *testing.T) {
	srv := &Server{Sys: &fakeSys{}}
	connect := func() *Client {
		a, b := net.Pipe()
		done := make(chan struct{})
		go func() { defer close(done); _ = srv.Serve(b) }()
		c, err := NewClient(a)
		if err != nil {
			t.Fatal(err)
		}
		c.UseWire()
		t.Cleanup(func() { c.Close(); <-done })
		return c
	}
	first, second := connect(), connect()
	pidFile := filepath.Join(t.TempDir(), "pid")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ran := make(chan error, 1)
	go func() {
		_, err := first.Exec(ctx, ExecRequest{Argv: []string{"sh", "-c", "echo $$ > " + pidFile + "; exec sleep 30"}}, nil, nil)
		ran <- err
	}()
	waitForFile(pidFile)
	for id := uint32(1); id < 20; id++ {
		if _, err := second.simple(context.Background(), &Request{Op: OpCancel, Call: id}); err != nil {
			t.Fatalf("cancel %d: %v", id, err)
		}
	}
	select {
	case err := <-ran:
		t.Fatalf("the first session's exec ended: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	cancel()
	if err := <-ran; !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v, want context.Canceled", err)
	}
	assertGone(t, pidFile)
}

// waitForFile waits up to 5 s for a file with something in it.
func waitForFile(path string) {
	for range 500 {
		if b, _ := os.ReadFile(path); len(b) > 0 {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A failing stdin reader kills the command, and Exec says why.
func TestExecStdinReadErrorKillsTheCommand(t *testing.T) {
	c := pair(t, &fakeSys{})
	pidFile := filepath.Join(t.TempDir(), "pid")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// The reader fails once the command runs (its pid is written).
	in := io.MultiReader(strings.NewReader("some input\n"), readerFunc(func([]byte) (int, error) {
		waitForFile(pidFile)
		return 0, errors.New("disk gone")
	}))
	_, err := c.Exec(ctx, ExecRequest{Argv: []string{"sh", "-c", "echo $$ > " + pidFile + "; cat > /dev/null; sleep 30"}, Stdin: in}, nil, nil)
	if err == nil || !strings.Contains(err.Error(), "stdin: disk gone") {
		t.Fatalf("err %v, want the stdin reader's error", err)
	}
	assertGone(t, pidFile)
}

type readerFunc func([]byte) (int, error)

func (f readerFunc) Read(p []byte) (int, error) { return f(p) }

// An agent refusing a write before reading its data (here: its claim
// failed) answers at once with the reason, however large the file.
func TestWriteFileRefusedEarlyGivesTheReason(t *testing.T) {
	c := pair(t, &fakeSys{hostnameErr: errors.New("no hostname for you")})
	if _, err := c.Claim(context.Background(), ClaimRequest{Hostname: "sb"}); err == nil {
		t.Fatal("claim: want an error")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	t0 := time.Now()
	_, err := c.WriteFile(ctx, filepath.Join(t.TempDir(), "f"), nil, bytes.NewReader(make([]byte, 8<<20)))
	if err == nil || !strings.Contains(err.Error(), "no hostname for you") {
		t.Fatalf("err %v, want the failed claim's reason", err)
	}
	if d := time.Since(t0); d > 10*time.Second {
		t.Errorf("took %v", d)
	}
}

// A failing data reader ends a write without a file, and says why.
func TestWriteFileReadErrorLeavesNoFile(t *testing.T) {
	c := pair(t, &fakeSys{})
	dir := t.TempDir()
	path := filepath.Join(dir, "f")
	_, err := c.WriteFile(context.Background(), path, nil, io.MultiReader(strings.NewReader("part"), iotest.ErrReader(errors.New("source gone"))))
	if err == nil || !strings.Contains(err.Error(), "source gone") {
		t.Fatalf("err %v", err)
	}
	for range 100 {
		ents, _ := os.ReadDir(dir)
		if len(ents) == 0 {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	ents, _ := os.ReadDir(dir)
	t.Fatalf("left behind: %v", ents)
}

// Timeouts: under 1 ms is rounded up, not sent as none; negative or huge
// ones are refused, by the client and by the agent.
func TestExecTimeoutLimits(t *testing.T) {
	c := pair(t, &fakeSys{})
	ctx := context.Background()
	res, err := c.Exec(ctx, ExecRequest{Argv: []string{"sleep", "5"}, Timeout: 500 * time.Microsecond}, nil, nil)
	if err != nil || !res.TimedOut {
		t.Fatalf("500µs timeout: %+v %v", res, err)
	}
	if _, err := c.Exec(ctx, ExecRequest{Argv: []string{"true"}, Timeout: -time.Second}, nil, nil); err == nil || !strings.Contains(err.Error(), "timeout") {
		t.Errorf("negative timeout: %v", err)
	}
	for _, ms := range []int64{-5, MaxTimeoutMS + 1, 1 << 62} {
		_, err := c.simple(ctx, &Request{Op: OpExec, Argv: []string{"true"}, TimeoutMS: ms})
		if err == nil || !strings.Contains(err.Error(), "timeout") {
			t.Errorf("timeout_ms %d: %v", ms, err)
		}
	}
}

// A command not in its own PATH is not found, even when the agent's PATH
// has it.
func TestExecLooksOnlyInTheCommandsPath(t *testing.T) {
	c := pair(t, &fakeSys{})
	_, err := c.Exec(context.Background(), ExecRequest{Argv: []string{"true"}, Env: map[string]string{"PATH": "/nonexistent"}}, nil, nil)
	if err == nil || !strings.Contains(err.Error(), "executable file not found") {
		t.Fatalf("err %v", err)
	}
}

// Reads never block on a FIFO, and a file larger than the limit is
// refused even when its size said otherwise.
func TestReadRefusesFIFOsAndOversizedFiles(t *testing.T) {
	c := pair(t, &fakeSys{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	fifo := filepath.Join(t.TempDir(), "fifo")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ReadFile(ctx, fifo, 0, io.Discard); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("fifo: %v", err)
	}
	// Devices are refused before they are opened: a read of /dev/ptmx
	// (a new pty's master) waited forever, and /dev/zero never ends.
	link := filepath.Join(t.TempDir(), "link")
	if err := os.Symlink("/dev/ptmx", link); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"/dev/ptmx", "/dev/zero", link} {
		if _, err := c.ReadFile(ctx, p, 0, io.Discard); err == nil || !strings.Contains(err.Error(), "not a regular file") {
			t.Errorf("%s: %v, want not a regular file", p, err)
		}
	}
	// /proc files say size 0.
	if _, err := c.ReadFile(ctx, "/proc/self/maps", 16, io.Discard); err == nil || !strings.Contains(err.Error(), "over the limit of 16 bytes") {
		t.Errorf("/proc/self/maps with a limit of 16: %v", err)
	}
	var b bytes.Buffer
	if _, err := c.ReadFile(ctx, "/proc/self/maps", 1<<20, &b); err != nil || b.Len() == 0 {
		t.Errorf("/proc/self/maps within the limit: %d bytes, %v", b.Len(), err)
	}
}

// Setuid, setgid and sticky bits survive a write, as Unix bits or as Go's
// (what a stat returns).
func TestWriteFileKeepsSpecialModeBits(t *testing.T) {
	c := pair(t, &fakeSys{})
	dir := t.TempDir()
	for _, tc := range []struct {
		mode uint32
		want os.FileMode
	}{
		{0o4755, os.ModeSetuid | 0o755},
		{0o1777, os.ModeSticky | 0o777},
		{uint32(os.ModeSetgid | 0o750), os.ModeSetgid | 0o750},
	} {
		p := filepath.Join(dir, "f")
		if _, err := c.WriteFile(context.Background(), p, new(tc.mode), strings.NewReader("x")); err != nil {
			t.Fatal(err)
		}
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if got := fi.Mode() & (os.ModePerm | os.ModeSetuid | os.ModeSetgid | os.ModeSticky); got != tc.want {
			t.Errorf("mode %o: file has %v, want %v", tc.mode, got, tc.want)
		}
	}
}

// A write with its mode set to 0 makes a 0000 file, in either codec; one
// without a mode still makes 0644. (Mode 0 alone reads as the default, so
// a 0000 file was made 0644.)
func TestWriteFileModeZeroIsKept(t *testing.T) {
	for _, codec := range []struct {
		name string
		pair func(*testing.T, System) *Client
	}{{"wire", pair}, {"json", pairJSON}} {
		c := codec.pair(t, &fakeSys{})
		dir := t.TempDir()
		for _, tc := range []struct {
			name string
			mode *uint32
			want os.FileMode
		}{
			{"unset", nil, 0o644},
			{"zero", new(uint32(0)), 0},
			{"0600", new(uint32(0o600)), 0o600},
		} {
			p := filepath.Join(dir, tc.name)
			got, err := c.WriteFile(context.Background(), p, tc.mode, strings.NewReader("x"))
			if err != nil {
				t.Fatalf("%s: mode %s: %v", codec.name, tc.name, err)
			}
			fi, err := os.Stat(p)
			if err != nil {
				t.Fatal(err)
			}
			if fi.Mode().Perm() != tc.want || os.FileMode(got.Mode).Perm() != tc.want {
				t.Errorf("%s: mode %s: file has %v (answer says %v), want %v", codec.name, tc.name, fi.Mode().Perm(), os.FileMode(got.Mode).Perm(), tc.want)
			}
		}
	}
}

// A claim whose environment is over the limit, or whose process limit is
// out of range, is refused naming the field.
func TestClaimRefusesBadLimits(t *testing.T) {
	c := pair(t, &fakeSys{})
	ctx := context.Background()
	if _, err := c.Claim(ctx, ClaimRequest{Env: map[string]string{"BIG": strings.Repeat("x", MaxCommandBytes)}}); err == nil || !strings.Contains(err.Error(), "env:") {
		t.Errorf("big env: %v", err)
	}
	for _, n := range []int{-1, MaxPids + 1} {
		if _, err := c.Claim(ctx, ClaimRequest{Pids: n}); err == nil || !strings.Contains(err.Error(), "pids") {
			t.Errorf("pids %d: %v", n, err)
		}
	}
}

// An agent's answer without file info is an error on the host, not a
// crash.
func TestStatWithoutFileInfoIsAnError(t *testing.T) {
	a, b := net.Pipe()
	done := make(chan struct{})
	go func() {
		defer close(done)
		sess, err := yamux.Server(b, YamuxConfig())
		if err != nil {
			return
		}
		defer sess.Close()
		st, err := sess.AcceptStream()
		if err != nil {
			return
		}
		_, _, _ = readFrame(st)
		_ = writeFrame(st, frameResultWire, nil)
		st.Close()
		<-sess.CloseChan()
	}()
	c, err := NewClient(a)
	if err != nil {
		t.Fatal(err)
	}
	c.UseWire()
	_, err = c.Stat(context.Background(), "/x")
	c.Close()
	<-done
	if err == nil || !strings.Contains(err.Error(), "no file info") {
		t.Fatalf("err %v", err)
	}
}

// A command timeout under a millisecond is sent as 1 ms, not as 0 (no
// limit).
func TestCeilMS(t *testing.T) {
	for _, tc := range []struct {
		d    time.Duration
		want int64
	}{
		{0, 0}, {time.Nanosecond, 1}, {500 * time.Microsecond, 1}, {time.Millisecond, 1},
		{time.Millisecond + 1, 2}, {90 * time.Second, 90000},
	} {
		if got := CeilMS(tc.d); got != tc.want {
			t.Errorf("CeilMS(%v) = %d, want %d", tc.d, got, tc.want)
		}
	}
}

// hostileGuest runs a yamux server on the guest's end of a pipe and calls
// serve for each stream the host opens. It returns the host's Client.
func hostileGuest(t *testing.T, serve func(st *yamux.Stream)) *Client {
	t.Helper()
	a, b := net.Pipe()
	c, err := NewClient(a)
	if err != nil {
		t.Fatal(err)
	}
	sess, err := yamux.Server(b, YamuxConfig())
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			st, err := sess.AcceptStream()
			if err != nil {
				return
			}
			go serve(st)
		}
	}()
	t.Cleanup(func() { c.Close(); sess.Close(); <-done })
	return c
}

// yamuxFrame is one yamux frame header (guard.go) and its payload.
func yamuxFrame(typ byte, flags uint16, id, length uint32, payload []byte) []byte {
	h := make([]byte, yamuxHeaderSize, yamuxHeaderSize+len(payload))
	h[0], h[1] = yamuxVersion, typ
	binary.BigEndian.PutUint16(h[2:], flags)
	binary.BigEndian.PutUint32(h[4:], id)
	binary.BigEndian.PutUint32(h[8:], length)
	return append(h, payload...)
}

// The guard passes what an agent sends (data, window updates, a go-away),
// however the reads split it, a data payload that looks like a ping
// included; it fails at a ping or a stream the guest opens, before the
// frame's header is whole.
func TestGuardRefusesPingsAndStreamsFromTheGuest(t *testing.T) {
	ping := yamuxFrame(yamuxTypePing, yamuxFlagSYN, 0, 7, nil)
	agent := slices.Concat(
		yamuxFrame(1, 2, 1, 0, nil), // ACK of the host's stream 1
		yamuxFrame(yamuxTypeData, 0, 1, uint32(len(ping)), ping),
		yamuxFrame(1, 4, 1, 0, nil), // FIN
		yamuxFrame(yamuxTypeGoAway, 0, 0, 0, nil),
	)
	for _, tc := range []struct {
		name string
		bad  []byte // a frame to refuse after the agent's, or none
		want string
	}{
		{"agent", nil, ""},
		{"ping", ping, "yamux ping"},
		{"pong", yamuxFrame(yamuxTypePing, 2, 0, 7, nil), "yamux ping"},
		{"open", yamuxFrame(1, yamuxFlagSYN, 2, 0, nil), "opened stream 2"},
		{"open with data", yamuxFrame(yamuxTypeData, yamuxFlagSYN, 4, 3, []byte("abc")), "opened stream 4"},
		{"version", []byte{1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, "version 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := slices.Concat(agent, tc.bad)
			for _, r := range []io.Reader{bytes.NewReader(in), iotest.OneByteReader(bytes.NewReader(in))} {
				g := &guardConn{ReadWriteCloser: struct {
					io.Reader
					io.WriteCloser
				}{Reader: r}}
				got, err := io.ReadAll(g)
				switch {
				case tc.want == "" && (err != nil || !bytes.Equal(got, in)):
					t.Fatalf("read %d of %d bytes: %v", len(got), len(in), err)
				case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
					t.Fatalf("err %v, want %q", err, tc.want)
				case tc.want != "" && len(got) >= len(agent)+yamuxHeaderSize:
					t.Fatalf("passed %d bytes: the refused frame's header went through", len(got))
				}
			}
		})
	}
}

// yamux answers each ping from a goroutine of its own, which waits up to
// ConnectionWriteTimeout to write: a guest that sends pings and reads
// nothing would grow the host's goroutines without bound. The host ends
// the session at the first ping instead.
func TestGuestPingFloodEndsTheSession(t *testing.T) {
	a, b := net.Pipe()
	c, err := NewClient(a)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	defer b.Close()
	before := runtime.NumGoroutine()
	const pings = 20000
	var flood []byte
	for i := range pings {
		flood = append(flood, yamuxFrame(yamuxTypePing, yamuxFlagSYN, 0, uint32(i), nil)...)
	}
	wrote := make(chan error, 1)
	go func() { _, err := b.Write(flood); wrote <- err }() // and never read
	select {
	case <-c.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the session still runs 10s into a ping flood")
	}
	grown := runtime.NumGoroutine() - before
	if err := <-wrote; err == nil {
		t.Error("the host read the whole flood")
	}
	if grown > 10 {
		t.Errorf("%d more goroutines on the host", grown)
	}
}

// The host never accepts a stream, and one the guest opens would sit in
// yamux's accept backlog with a receive window of data: the host ends the
// session instead, holding none.
func TestGuestOpeningAStreamEndsTheSession(t *testing.T) {
	a, b := net.Pipe()
	c, err := NewClient(a)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	guest, err := yamux.Server(b, YamuxConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer guest.Close()
	if st, err := guest.OpenStream(); err == nil {
		go func() { _, _ = st.Write(make([]byte, 256<<10)) }() // the whole initial window
	}
	select {
	case <-c.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the session still runs 10s after the guest opened a stream")
	}
	if n := c.sess.NumStreams(); n > 0 {
		t.Fatalf("the host's session holds %d streams the guest opened", n)
	}
}

// The agent refuses a file over a read's limit, but a guest that sends
// more anyway gets no more than the limit into the host's writer.
func TestReadFileStopsAtTheLimitWhateverTheGuestSends(t *testing.T) {
	const limit = 1024
	c := hostileGuest(t, func(st *yamux.Stream) {
		defer st.Close()
		if _, _, err := readFrame(st); err != nil {
			return
		}
		for range 16 {
			if writeFrame(st, frameData, bytes.Repeat([]byte("x"), limit)) != nil {
				return
			}
		}
		_ = writeJSON(st, frameResult, &Result{File: &FileInfo{Name: "/f", Size: 1}})
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var buf bytes.Buffer
	_, err := c.ReadFile(ctx, "/f", limit, &buf)
	if err == nil || !strings.Contains(err.Error(), "sent more than the 1024 bytes asked for") || buf.Len() > limit {
		t.Fatalf("a guest that sent %d bytes: err %v, %d bytes written; want an error and at most %d", 16*limit, err, buf.Len(), limit)
	}
}

// The agent kills a command at its timeout, but a guest that never
// answers does not hold the host's call past the timeout and its grace.
func TestExecGivesUpOnASilentGuestAfterItsTimeout(t *testing.T) {
	defer func(g time.Duration) { execGrace = g }(execGrace)
	execGrace = 100 * time.Millisecond
	c := hostileGuest(t, func(st *yamux.Stream) {
		_, _, _ = readFrame(st) // and say nothing
	})
	ret := make(chan error, 1)
	go func() {
		_, err := c.Exec(context.Background(), ExecRequest{Argv: []string{"true"}, Timeout: 100 * time.Millisecond}, nil, nil)
		ret <- err
	}()
	select {
	case err := <-ret:
		if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "did not answer") {
			t.Fatalf("err %v, want the guest did not answer in time", err)
		}
	case <-time.After(10 * time.Second):
		c.Close()
		<-ret
		t.Fatal("exec with a 100ms timeout still waited for a silent guest after 10s")
	}
}

// A listing larger than a frame (5,000 long names) comes whole, in either
// codec, in order.
func TestListOfADirectoryLargerThanAFrame(t *testing.T) {
	dir := t.TempDir()
	const n = 5000
	name := func(i int) string { return fmt.Sprintf("%05d-%s", i, strings.Repeat("n", 190)) }
	for i := range n {
		if err := os.WriteFile(filepath.Join(dir, name(i)), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for codec, c := range map[string]*Client{"wire": pair(t, &fakeSys{}), "json": pairJSON(t, &fakeSys{})} {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		fs, err := c.List(ctx, dir)
		cancel()
		if err != nil || len(fs) != n {
			t.Fatalf("%s: %d entries, %v; want %d", codec, len(fs), err, n)
		}
		for i, f := range fs {
			if f.Name != name(i) {
				t.Fatalf("%s: entry %d is %q, want %q", codec, i, f.Name, name(i))
			}
		}
	}
}

// A write onto a directory (`cp FILE ID:/work/`) says the path is a
// directory, and leaves nothing behind (the rename failed, naming the
// agent's temporary file).
func TestWriteFileOntoADirectory(t *testing.T) {
	c := pair(t, &fakeSys{})
	dir := t.TempDir()
	for _, p := range []string{dir, dir + "/", dir + "/.", dir + "/new/."} {
		_, err := c.WriteFile(context.Background(), p, nil, strings.NewReader("notes"))
		if err == nil || !strings.Contains(err.Error(), "is a directory") || strings.Contains(err.Error(), ".warren-write") {
			t.Errorf("write onto %q: %v", p, err)
		}
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("left behind: %v", ents)
	}
}

// A write that fails on the agent's temporary file or its rename names
// the path asked for and the system's reason, never the temporary file.
func TestWriteFileErrorsNameThePathAsked(t *testing.T) {
	c := pair(t, &fakeSys{})
	// /proc takes no new files: the temporary file's create fails.
	_, err := c.WriteFile(context.Background(), "/proc/zz", nil, strings.NewReader("x"))
	if err == nil || strings.Contains(err.Error(), ".warren-write") || !strings.Contains(err.Error(), "write /proc/zz: ") {
		t.Errorf("write /proc/zz: %v; want the path asked for and no temporary file", err)
	}
}

// A command is killed at its timeout even while its output waits for the
// host to read (the host's window full): the agent's timer does not wait
// for the output's writers. (Before, it took their lock first, and the
// command ran on, here to touch its file, until the host read again.)
func TestExecTimeoutKillsWhileOutputIsBackedUp(t *testing.T) {
	c := pair(t, &fakeSys{})
	mark := filepath.Join(t.TempDir(), "ran-on")
	script := "(head -c 4000000 /dev/zero &); sleep 1; touch " + mark
	first := true
	slow := writerFunc(func(p []byte) (int, error) {
		if first {
			first = false
			time.Sleep(2 * time.Second) // the host stops reading; the agent's writes back up
		}
		return len(p), nil
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := c.Exec(ctx, ExecRequest{Argv: []string{"sh", "-c", script}, Timeout: 300 * time.Millisecond}, slow, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(mark); err == nil {
		t.Fatalf("the command ran on past its 300ms timeout while its output was backed up (result %+v)", res)
	}
	if !res.TimedOut {
		t.Errorf("result %+v, want timed out", res)
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
