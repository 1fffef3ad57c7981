package guest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/yamux"
)

// System is what the agent changes in the guest beyond files and
// processes. The Linux implementation is in system_linux.go; tests use a
// fake.
type System interface {
	SetTime(unixNano int64) error
	AddEntropy(seed []byte) error
	SetHostname(name string) error
	// SetNetwork configures the sandbox's network (a checked NetConfig).
	SetNetwork(c NetConfig) error
	// SetPids sets the commands' process limit.
	SetPids(n int) error
	Stats() (Stats, error)
	// ExecAttr returns the process attributes of one exec'd command: its
	// own process group, and the cgroup that bounds what it may use.
	ExecAttr() *syscall.SysProcAttr
	// KillStrays kills every process the commands left behind. The
	// agent calls it only when no command runs, so each process it finds
	// escaped its command's process group (setsid, a daemon's double
	// fork) and outlived its call.
	KillStrays() error
}

// Server answers calls on one connection at a time.
type Server struct {
	Sys    System
	Logger *slog.Logger

	mu  sync.Mutex
	env map[string]string // set by claim; the base of every exec's env
	// claimErr is why the last claim failed; until a claim succeeds, calls
	// that would run in the sandbox are refused (the host may have sent
	// them behind the claim, expecting the claimed identity).
	claimErr error
	// net is the network settings the last claim set, nil before one
	// did. A claim with the same ones leaves the network as it is: a
	// snapshot's guest sets those of its node's sandboxes before it is
	// saved, and its clones, whose claims send the same, skip the work.
	net *NetConfig
	// pids is the process limit the last claim set, 0 before one did; a
	// claim with the same leaves it as it is, like net.
	pids int

	// running counts the commands started and not yet waited for, over
	// every session; when it falls to 0 the strays are due to be killed
	// (straysDue), which is done under execMu, so no command starts
	// meanwhile.
	execMu    sync.Mutex
	running   int
	straysDue bool
}

// execStarting counts a command about to start, first killing the strays
// if they are due (the last command's answer went, but not yet its kill).
func (s *Server) execStarting() {
	s.execMu.Lock()
	defer s.execMu.Unlock()
	s.killStraysLocked()
	s.running++
}

// execEnded counts a command out; if it started and was the last, what
// the commands left behind is due to be killed (killStrays, after the
// call's answer, or the next command's start, whichever comes first).
func (s *Server) execEnded(started bool) {
	s.execMu.Lock()
	defer s.execMu.Unlock()
	s.running--
	if started && s.running == 0 {
		s.straysDue = true
	}
}

// killStrays kills what the commands left behind, if that is due.
func (s *Server) killStrays() {
	s.execMu.Lock()
	defer s.execMu.Unlock()
	s.killStraysLocked()
}

func (s *Server) killStraysLocked() {
	if !s.straysDue || s.running > 0 || s.Sys == nil {
		return
	}
	s.straysDue = false
	if err := s.Sys.KillStrays(); err != nil {
		s.log().Warn("kill the processes left by commands", "err", err)
	}
}

// execTable is one session's running execs, by stream id, for OpCancel.
// Ids are a session's own: a host that reconnects starts again from 1,
// while an exec of its last session may still run.
type execTable struct {
	mu sync.Mutex
	m  map[uint32]context.CancelFunc
}

// add registers the exec on stream id and returns its context (ended by
// cancel) and its removal.
func (t *execTable) add(id uint32) (context.Context, func()) {
	ctx, cancel := context.WithCancel(context.Background())
	t.mu.Lock()
	t.m[id] = cancel
	t.mu.Unlock()
	return ctx, func() {
		t.mu.Lock()
		delete(t.m, id)
		t.mu.Unlock()
		cancel()
	}
}

func (t *execTable) cancel(id uint32) {
	t.mu.Lock()
	cancel := t.m[id]
	t.mu.Unlock()
	if cancel != nil {
		cancel()
	}
}

// BaseEnv is the environment every command starts from.
var BaseEnv = map[string]string{
	"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/usr/local/go/bin:/usr/lib/go/bin",
	"HOME": "/root",
	"LANG": "C.UTF-8",
	"TERM": "dumb",
}

// YamuxConfig is the session tuning both ends use. Keepalives are off: a
// paused VM cannot answer them, and the host notices a dead guest through
// its VMM instead.
func YamuxConfig() *yamux.Config {
	c := yamux.DefaultConfig()
	c.EnableKeepAlive = false
	c.AcceptBacklog = 1024
	c.ConnectionWriteTimeout = 60 * time.Second
	c.StreamCloseTimeout = time.Minute
	c.LogOutput = io.Discard
	c.Logger = nil
	return c
}

// firstFrameWait bounds how long Serve waits for a new stream's request
// (the host writes it right behind the stream's opening).
const firstFrameWait = 30 * time.Second

// Serve runs one yamux session on conn until it ends, answering each
// stream as one call. It returns when conn fails or closes.
//
// Calls run concurrently, except a claim: Serve reads each stream's request
// as it accepts it, and serves a claim before it accepts the next stream.
// Streams are accepted in the order the host opened them, so every call
// the host opens after a claim sees the claimed identity, and the host need
// not wait for the claim's answer before sending them.
func (s *Server) Serve(conn io.ReadWriteCloser) error {
	sess, err := yamux.Server(conn, YamuxConfig())
	if err != nil {
		return err
	}
	defer sess.Close()
	execs := &execTable{m: make(map[uint32]context.CancelFunc)}
	for {
		st, err := sess.AcceptStream()
		if err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, yamux.ErrSessionShutdown) || errors.Is(err, net.ErrClosed) {
				return nil
			}
			return err
		}
		req, wire, ok := s.request(st)
		if !ok {
			st.Close()
			continue
		}
		switch req.Op {
		case OpClaim:
			s.handle(context.Background(), st, req, wire)
			continue
		case OpExec:
			// Known from here on, so an OpCancel for it, which the host
			// opens after it, always finds it.
			ctx, remove := execs.add(st.StreamID())
			go func() {
				defer remove()
				s.handle(ctx, st, req, wire)
			}()
			continue
		case OpCancel:
			execs.cancel(req.Call)
		}
		go s.handle(context.Background(), st, req, wire)
	}
}

func (s *Server) log() *slog.Logger {
	if s.Logger != nil {
		return s.Logger
	}
	return slog.New(slog.DiscardHandler)
}

// request reads a stream's first frame, its request, and reports whether
// it came in the wire codec (to be answered in it). On failure it answers
// with an error frame where it can and reports false.
func (s *Server) request(st *yamux.Stream) (*Request, bool, bool) {
	_ = st.SetReadDeadline(time.Now().Add(firstFrameWait))
	kind, p, err := readFrame(st)
	_ = st.SetReadDeadline(time.Time{})
	if err != nil {
		if !errors.Is(err, io.EOF) {
			_ = writeFrame(st, frameError, []byte("request: "+err.Error()))
		}
		return nil, false, false
	}
	var req Request
	switch kind {
	case frameRequestWire:
		err = req.decodeWire(p)
	case frameRequest:
		err = json.Unmarshal(p, &req)
	default:
		_ = writeFrame(st, frameError, []byte(fmt.Sprintf("first frame is %q, want a request", kind)))
		return nil, false, false
	}
	if err != nil {
		_ = writeFrame(st, frameError, []byte("request: "+err.Error()))
		return nil, false, false
	}
	return &req, kind == frameRequestWire, true
}

// handle runs one call. Every path ends with a result or an error frame.
// ctx ends when the host abandons the call (only execs have one that does).
func (s *Server) handle(ctx context.Context, st *yamux.Stream, req *Request, wire bool) {
	defer st.Close()
	var ended func()
	res, err := s.call(ctx, st, req, &ended)
	if err == nil {
		err = answer(st, res, wire)
	}
	if err != nil {
		_ = writeFrame(st, frameError, []byte(err.Error()))
	}
	if ended != nil {
		// After the answer: killing what an exec left behind is off the
		// host's wait (the next call, if it is an exec, waits for it).
		ended()
	}
}

// answer writes a call's result in its request's codec. A list too large
// for one frame (thousands of long names) goes first in parts; any other
// result that large is an error naming its size, not a stream that ends
// with no answer.
func answer(w io.Writer, res *Result, wire bool) error {
	enc, kind, partKind := encodeJSON, frameResult, frameFiles
	if wire {
		enc, kind, partKind = encodeWire, frameResultWire, frameFilesWire
	}
	p, err := enc(res)
	if err != nil {
		return err
	}
	if len(p) > MaxFrame && len(res.Files) > 0 {
		if err := sendFiles(w, res.Files, enc, partKind); err != nil {
			return err
		}
		rest := *res
		rest.Files = nil
		if p, err = enc(&rest); err != nil {
			return err
		}
	}
	if len(p) > MaxFrame {
		return fmt.Errorf("result: %d bytes, over the frame limit of %d", len(p), MaxFrame)
	}
	return writeFrame(w, kind, p)
}

func encodeJSON(res *Result) ([]byte, error) { return json.Marshal(res) }
func encodeWire(res *Result) ([]byte, error) { return res.appendWire(nil), nil }

// sendFiles sends files as Results in frames of kind, halving a part until
// it fits.
func sendFiles(w io.Writer, files []FileInfo, enc func(*Result) ([]byte, error), kind byte) error {
	p, err := enc(&Result{Files: files})
	if err != nil {
		return err
	}
	if len(p) <= MaxFrame {
		return writeFrame(w, kind, p)
	}
	if len(files) == 1 {
		return fmt.Errorf("list: entry of %d bytes, over the frame limit of %d", len(p), MaxFrame)
	}
	h := len(files) / 2
	if err := sendFiles(w, files[:h], enc, kind); err != nil {
		return err
	}
	return sendFiles(w, files[h:], enc, kind)
}

// call runs one call; an exec that started sets *ended, which the caller
// runs once it has answered.
func (s *Server) call(ctx context.Context, st *yamux.Stream, req *Request, ended *func()) (*Result, error) {
	switch req.Op {
	case OpExec, OpRead, OpWrite, OpList, OpStat:
		s.mu.Lock()
		err := s.claimErr
		s.mu.Unlock()
		if err != nil {
			return nil, fmt.Errorf("the sandbox has no identity: its claim failed: %w", err)
		}
	}
	switch req.Op {
	case OpPing:
		return &Result{GuestUnixNano: time.Now().UnixNano(), Ordered: true, Wire: true}, nil
	case OpExec:
		return s.exec(ctx, st, req, ended)
	case OpCancel: // done by Serve, which knows the session's execs
		return &Result{}, nil
	case OpRead:
		return s.read(st, req)
	case OpWrite:
		return s.write(st, req)
	case OpList:
		return s.list(req)
	case OpStat:
		return s.stat(req)
	case OpClaim:
		res, err := s.claim(req)
		s.mu.Lock()
		s.claimErr = err
		s.mu.Unlock()
		return res, err
	case OpStats:
		if s.Sys == nil {
			return nil, errors.New("stats: not supported here")
		}
		st, err := s.Sys.Stats()
		if err != nil {
			return nil, err
		}
		return &Result{Stats: &st}, nil
	case OpSync:
		syscall.Sync()
		return &Result{}, nil
	default:
		return nil, fmt.Errorf("op %q: unknown", req.Op)
	}
}

// CheckPath reports whether p may name a file in a sandbox: absolute, no
// ".." element, no NUL byte, at most MaxPathBytes.
func CheckPath(p string) error {
	switch {
	case p == "":
		return errors.New("path: required")
	case len(p) > MaxPathBytes:
		return fmt.Errorf("path: %d bytes, over the limit of %d", len(p), MaxPathBytes)
	case strings.IndexByte(p, 0) >= 0:
		return errors.New("path: contains a NUL byte")
	case !strings.HasPrefix(p, "/"):
		return fmt.Errorf("path %q: must be absolute", p)
	}
	for _, el := range strings.Split(p, "/") {
		if el == ".." {
			return fmt.Errorf("path %q: must not contain \"..\" (it would leave the sandbox's tree)", p)
		}
		if len(el) > MaxNameBytes {
			return fmt.Errorf("path: an element of %d bytes, over the limit of %d (NAME_MAX)", len(el), MaxNameBytes)
		}
	}
	return nil
}

// MaxNameBytes bounds one element of a path, as Linux's file systems do
// (NAME_MAX). A longer one fails in the guest with ENAMETOOLONG; CheckPath
// refuses it first, naming the path.
const MaxNameBytes = 255

// CheckExec reports whether an exec request is within the limits.
func CheckExec(argv []string, env map[string]string) error {
	if len(argv) == 0 || argv[0] == "" {
		return errors.New("command: required")
	}
	n := 0
	for _, a := range argv {
		if strings.IndexByte(a, 0) >= 0 {
			return errors.New("command: contains a NUL byte")
		}
		n += len(a) + 1
	}
	en, err := envBytes(env)
	if err != nil {
		return err
	}
	if n += en; n > MaxCommandBytes {
		return fmt.Errorf("command: %d bytes with its environment, over the limit of %d", n, MaxCommandBytes)
	}
	return nil
}

// envBytes checks an environment's names and values and returns its size
// as a command's environment takes it (NAME=VALUE and a NUL each).
func envBytes(env map[string]string) (int, error) {
	n := 0
	for k, v := range env {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.IndexByte(v, 0) >= 0 {
			return 0, fmt.Errorf("env %q: name must be non-empty without '=' or NUL, value without NUL", k)
		}
		n += len(k) + len(v) + 2
	}
	return n, nil
}

// streamWriter sends each Write as one frame of kind; safe for concurrent use.
type streamWriter struct {
	mu   *sync.Mutex
	w    io.Writer
	kind byte
}

func (w streamWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for off := 0; off < len(p); off += MaxFrame {
		end := min(off+MaxFrame, len(p))
		if err := writeFrame(w.w, w.kind, p[off:end]); err != nil {
			return off, err
		}
	}
	return len(p), nil
}

// exec runs a command until it ends, times out, or the host abandons it:
// it closes the stream, or, as its stdin may hold the frame loop below,
// cancels ctx (OpCancel).
func (s *Server) exec(abandoned context.Context, st *yamux.Stream, req *Request, ended *func()) (*Result, error) {
	if err := CheckExec(req.Argv, req.Env); err != nil {
		return nil, err
	}
	if err := CheckTimeoutMS(req.TimeoutMS); err != nil {
		return nil, err
	}
	dir := req.Dir
	if dir == "" {
		dir = "/root"
		if _, err := os.Stat(dir); err != nil {
			dir = "/"
		}
	} else if err := CheckPath(dir); err != nil {
		return nil, fmt.Errorf("dir: %w", err)
	}
	env := maps.Clone(BaseEnv)
	s.mu.Lock()
	maps.Copy(env, s.env)
	s.mu.Unlock()
	maps.Copy(env, req.Env)
	keys := make([]string, 0, len(env))
	for k := range env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	envv := make([]string, 0, len(keys))
	for _, k := range keys {
		envv = append(envv, k+"="+env[k])
	}

	// The command is looked up in the command's PATH, not the agent's.
	path, ok := lookPath(req.Argv[0], env["PATH"])
	if !ok {
		return nil, fmt.Errorf("start %q: %w", req.Argv[0], &exec.Error{Name: req.Argv[0], Err: exec.ErrNotFound})
	}
	cmd := exec.Command(path, req.Argv[1:]...)
	cmd.Env = envv
	cmd.Dir = dir
	if s.Sys != nil {
		cmd.SysProcAttr = s.Sys.ExecAttr()
	} else {
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	}
	// The output goes through pipes of the agent's own, not os/exec's:
	// its copies stop at the command's exit after WaitDelay whatever the
	// host has read, and what was still in a pipe was lost while the
	// command's exit code said it succeeded (output drains below).
	var wmu sync.Mutex
	var out [2]*os.File
	for i := range out {
		r, w, err := os.Pipe()
		if err != nil {
			if i == 1 {
				out[0].Close()
				cmd.Stdout.(*os.File).Close()
			}
			return nil, fmt.Errorf("start %q: output: %w", req.Argv[0], err)
		}
		out[i] = r
		if i == 0 {
			cmd.Stdout = w
		} else {
			cmd.Stderr = w
		}
	}
	closeWriteEnds := func() {
		cmd.Stdout.(*os.File).Close()
		cmd.Stderr.(*os.File).Close()
	}
	// The command's stdin is a pipe whose writes fail once the command
	// closed its end or ended, so the frame loop below never blocks on a
	// command that stopped reading (it would no longer see the host give
	// up). Wait closes it.
	var stdin io.WriteCloser
	if req.Stdin {
		var err error
		if stdin, err = cmd.StdinPipe(); err != nil {
			closeWriteEnds()
			out[0].Close()
			out[1].Close()
			return nil, fmt.Errorf("start %q: stdin: %w", req.Argv[0], err)
		}
	}
	start := time.Now()
	s.execStarting()
	err := cmd.Start()
	closeWriteEnds() // the command has its own copies
	if err != nil {
		out[0].Close()
		out[1].Close()
		s.execEnded(false)
		if derr := checkDir(req.Dir); derr != nil {
			// fork/exec reports a bad working directory as if the
			// program were missing: name the directory instead.
			return nil, fmt.Errorf("start %q: %w", req.Argv[0], derr)
		}
		return nil, fmt.Errorf("start %q: %w", req.Argv[0], err)
	}
	pgid := cmd.Process.Pid
	d := drainOutput(out, [2]streamWriter{{&wmu, st, frameStdout}, {&wmu, st, frameStderr}})
	// kill signals the group until it is empty: a fork bomb adds members
	// while the signal is delivered.
	kill := func() {
		for i := 0; i < 200; i++ {
			if syscall.Kill(-pgid, syscall.SIGKILL) != nil {
				return
			}
			time.Sleep(time.Millisecond)
		}
	}

	// The host's frames: stdin data, then EOF; a closed stream means the
	// host gave up on the call, and the command's process group is killed.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// An OpCancel kills it too. Wait then closes the stdin pipe, which
	// frees the frame loop if a command that does not read its stdin held
	// it in a write.
	defer context.AfterFunc(abandoned, kill)()
	go func() {
		for {
			kind, p, err := readFrame(st)
			if err != nil {
				if ctx.Err() == nil {
					kill()
				}
				if stdin != nil {
					stdin.Close()
				}
				return
			}
			if stdin == nil {
				continue
			}
			switch kind {
			case frameData:
				if _, err := stdin.Write(p); err != nil {
					// The command closed its stdin; drop the rest.
					continue
				}
			case frameEOF:
				stdin.Close()
			}
		}
	}()
	// Killed at once, without wmu: the output's writers hold it while
	// the host's window is full, and the command would run on past its
	// timeout for as long as the host did not read. timedOut is set
	// before the kill, so Wait never returns from the kill before it.
	var timedOut atomic.Bool
	var timer *time.Timer
	if req.TimeoutMS > 0 {
		timer = time.AfterFunc(time.Duration(req.TimeoutMS)*time.Millisecond, func() {
			timedOut.Store(true)
			kill()
		})
	}
	err = cmd.Wait()
	if timer != nil {
		timer.Stop()
	}
	d.exited()
	// The whole group goes with its leader: nothing the command started
	// outlives the call. One that left the group goes too, right after
	// the answer, once no command runs.
	kill()
	d.wait()
	s.execEnded(true)
	*ended = s.killStrays
	cancel()
	res := &Result{DurationUS: time.Since(start).Microseconds(), TimedOut: timedOut.Load()}
	ps := cmd.ProcessState
	if ps == nil {
		return nil, fmt.Errorf("wait %q: %w", req.Argv[0], err)
	}
	res.ExitCode = ps.ExitCode()
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		res.Signal = int(ws.Signal())
		res.ExitCode = 128 + res.Signal
	}
	// The timer may fire as the command ends on its own: it timed out only
	// if the timer's kill is what ended it.
	res.TimedOut = res.TimedOut && res.Signal == int(syscall.SIGKILL)
	return res, nil
}

// drain copies a command's stdout and stderr pipes to the host.
type drain struct {
	pipes [2]*os.File
	done  sync.WaitGroup
	// after is set at the command's exit. Each copy then counts what its
	// pipe holds, all that is left of the command's output (its group is
	// killed right after), reads that much more, however slowly the host
	// takes it, and stops: a child that left the group and holds the pipe
	// open, silent or writing, does not hold the call.
	after atomic.Bool
}

// drainOutput starts copying each pipe to its writer, frame by frame.
func drainOutput(pipes [2]*os.File, to [2]streamWriter) *drain {
	d := &drain{pipes: pipes}
	d.done.Add(2)
	for i := range pipes {
		go d.copy(i, to[i])
	}
	return d
}

func (d *drain) copy(i int, w streamWriter) {
	defer d.done.Done()
	r := d.pipes[i]
	defer r.Close() // a command still writing gets EPIPE, not a full pipe
	buf := make([]byte, 32<<10)
	// counted says left is what the pipe held once this copy saw the
	// exit. The copy counts it itself: a read that was waiting when the
	// last output came may take it only after the exit was marked, and a
	// count made by exited would then be waited for in vain.
	counted, left := false, int64(0)
	for {
		if !counted && d.after.Load() {
			counted, left = true, pipeBuffered(r)
			_ = r.SetReadDeadline(time.Time{})
		}
		p := buf
		if counted {
			if left <= 0 {
				return
			}
			p = buf[:min(int64(len(buf)), left)]
		}
		n, err := r.Read(p)
		if n > 0 {
			if _, werr := w.Write(p[:n]); werr != nil {
				return // the host gave up on the call
			}
			if counted {
				left -= int64(n)
			}
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			// Woken at the exit, to count what is left. A copy that
			// counted already was woken by a deadline set after it
			// cleared it: the pipe holds what it counted.
			if counted {
				_ = r.SetReadDeadline(time.Time{})
			}
			continue
		}
		if err != nil {
			return // EOF: every writer closed the pipe
		}
	}
}

// exited marks the command's end and wakes each copy's waiting read, so
// that it counts what its pipe holds and reads no more.
func (d *drain) exited() {
	d.after.Store(true)
	for _, p := range d.pipes {
		_ = p.SetReadDeadline(time.Now())
	}
}

// wait waits until both copies are done.
func (d *drain) wait() { d.done.Wait() }

// lookPath finds name in path (a PATH value) unless it has a slash, and
// reports whether it did. A name it cannot find is not found: the agent's
// own PATH is never searched.
func lookPath(name, path string) (string, bool) {
	if strings.Contains(name, "/") {
		return name, true
	}
	for _, dir := range filepath.SplitList(path) {
		p := filepath.Join(dir, name)
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			return p, true
		}
	}
	return "", false
}

// CheckTimeoutMS reports whether an exec's timeout is within the limits
// (0 is none).
func CheckTimeoutMS(ms int64) error {
	switch {
	case ms < 0:
		return fmt.Errorf("timeout: %d ms: must not be negative", ms)
	case ms > MaxTimeoutMS:
		return fmt.Errorf("timeout: %d ms, over the limit of %d (a year)", ms, int64(MaxTimeoutMS))
	}
	return nil
}

// fileMode is a write's mode: permission bits plus setuid, setgid and
// sticky, given as Unix bits (0o4755) or as Go's (what FileInfo.Mode
// holds, so a stat's mode can be written back).
func fileMode(m uint32) os.FileMode {
	mode := os.FileMode(m & 0o777)
	if m&0o4000 != 0 || os.FileMode(m)&os.ModeSetuid != 0 {
		mode |= os.ModeSetuid
	}
	if m&0o2000 != 0 || os.FileMode(m)&os.ModeSetgid != 0 {
		mode |= os.ModeSetgid
	}
	if m&0o1000 != 0 || os.FileMode(m)&os.ModeSticky != 0 {
		mode |= os.ModeSticky
	}
	return mode
}

func fileInfo(name string, fi os.FileInfo) FileInfo {
	return FileInfo{Name: name, Size: fi.Size(), Mode: uint32(fi.Mode()), ModNano: fi.ModTime().UnixNano(), Dir: fi.IsDir()}
}

func (s *Server) read(st *yamux.Stream, req *Request) (*Result, error) {
	if err := CheckPath(req.Path); err != nil {
		return nil, err
	}
	// Only regular files (and /proc's, which are regular files that say
	// size 0) are read. A device is refused before it is opened: opening
	// one can do something (/dev/ptmx makes a pty), and a read of a
	// terminal or of /dev/kmsg would wait forever in the agent, holding
	// its goroutine and descriptor after the host gave up.
	if fi, err := os.Stat(req.Path); err == nil {
		if err := readable(req.Path, fi); err != nil {
			return nil, err
		}
	}
	// Opened without blocking: a FIFO with no writer would hold the call
	// (and its goroutine) forever. What was opened is checked again: the
	// path may have been replaced since the stat.
	f, err := os.OpenFile(req.Path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if err := readable(req.Path, fi); err != nil {
		return nil, err
	}
	if req.Limit > 0 && fi.Size() > req.Limit {
		return nil, fmt.Errorf("read %s: %d bytes, over the limit of %d", req.Path, fi.Size(), req.Limit)
	}
	// A file that waits for data (/proc/kmsg, tracefs's trace_pipe: regular
	// files, but pollable, so Go's poller parks the read on EAGAIN) is read
	// until the host gives up on the call, which closes the stream; then
	// the read ends here too, and with it this goroutine and descriptor.
	// The host sends nothing more on a read's stream.
	done := make(chan struct{})
	defer func() {
		close(done)
		_ = st.SetReadDeadline(time.Now()) // ends the watch
	}()
	go func() {
		_, _, _ = readFrame(st)
		select {
		case <-done:
		default:
			_ = f.SetReadDeadline(time.Now())
		}
	}()
	var r io.Reader = f
	if req.Limit > 0 {
		// A file whose size says nothing (/proc) or that grew since the
		// stat is refused when it turns out larger, not cut short.
		r = &overLimit{r: f, n: req.Limit, path: req.Path, limit: req.Limit}
	}
	if _, err := writeChunks(st, frameData, r); err != nil {
		return nil, err
	}
	info := fileInfo(req.Path, fi)
	return &Result{File: &info}, nil
}

// checkDir reports why dir ("" for none) cannot be a command's working
// directory, or nil. It runs only after a failed start, so a command that
// starts pays nothing for it.
func checkDir(dir string) error {
	if dir == "" {
		return nil
	}
	fi, err := os.Stat(dir)
	switch {
	case err != nil:
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		return fmt.Errorf("dir %s: %w", dir, err)
	case !fi.IsDir():
		return fmt.Errorf("dir %s: not a directory", dir)
	}
	return nil
}

// readable refuses to read anything but a regular file.
func readable(path string, fi os.FileInfo) error {
	switch {
	case fi.IsDir():
		return fmt.Errorf("read %s: is a directory", path)
	case !fi.Mode().IsRegular():
		return fmt.Errorf("read %s: not a regular file (%v)", path, fi.Mode().Type())
	}
	return nil
}

// overLimit reads at most n bytes from r and fails if r has more.
type overLimit struct {
	r     io.Reader
	n     int64
	path  string
	limit int64
}

func (l *overLimit) Read(p []byte) (int, error) {
	if l.n <= 0 {
		var b [1]byte
		if n, err := l.r.Read(b[:]); n > 0 {
			return 0, fmt.Errorf("read %s: over the limit of %d bytes", l.path, l.limit)
		} else {
			return 0, err
		}
	}
	if int64(len(p)) > l.n {
		p = p[:l.n]
	}
	n, err := l.r.Read(p)
	l.n -= int64(n)
	return n, err
}

func (s *Server) write(st *yamux.Stream, req *Request) (*Result, error) {
	if err := CheckPath(req.Path); err != nil {
		return nil, err
	}
	mode := fileMode(req.Mode)
	if mode == 0 && !req.ModeSet {
		mode = DefaultFileMode
	}
	// A directory is not replaced by a file (the rename would fail with a
	// message naming the temporary file): `cp FILE ID:/work/` is a
	// mistake the caller should hear of plainly.
	if fi, err := os.Stat(req.Path); strings.HasSuffix(req.Path, "/") || strings.HasSuffix(req.Path, "/.") || (err == nil && fi.IsDir()) {
		return nil, fmt.Errorf("write %s: is a directory: give the file's own path", req.Path)
	}
	dir := filepath.Dir(req.Path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("write %s: %w", req.Path, err)
	}
	// The temporary file is the agent's own: its errors name the path
	// asked for, with the system's reason.
	tmp, err := os.CreateTemp(dir, ".warren-write-*")
	if err != nil {
		return nil, fmt.Errorf("write %s: %w", req.Path, sysReason(err))
	}
	ok := false
	defer func() {
		if !ok {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	for {
		kind, p, err := readFrame(st)
		if err != nil {
			return nil, fmt.Errorf("write %s: data: %w", req.Path, err)
		}
		if kind == frameEOF {
			break
		}
		if kind != frameData {
			return nil, fmt.Errorf("write %s: unexpected frame %q", req.Path, kind)
		}
		if _, err := tmp.Write(p); err != nil {
			return nil, fmt.Errorf("write %s: %w", req.Path, err)
		}
	}
	if err := tmp.Chmod(mode); err != nil {
		return nil, fmt.Errorf("write %s: %w", req.Path, sysReason(err))
	}
	if err := tmp.Close(); err != nil {
		return nil, fmt.Errorf("write %s: %w", req.Path, sysReason(err))
	}
	if err := os.Rename(tmp.Name(), req.Path); err != nil {
		return nil, fmt.Errorf("write %s: %w", req.Path, sysReason(err))
	}
	ok = true
	fi, err := os.Stat(req.Path)
	if err != nil {
		return nil, err
	}
	info := fileInfo(req.Path, fi)
	return &Result{File: &info}, nil
}

// sysReason is the system's reason in a file operation's error, without
// the file it names (the agent's temporary file, not the caller's).
func sysReason(err error) error {
	var pe *fs.PathError
	var le *os.LinkError
	switch {
	case errors.As(err, &pe):
		return pe.Err
	case errors.As(err, &le):
		return le.Err
	}
	return err
}

func (s *Server) list(req *Request) (*Result, error) {
	if err := CheckPath(req.Path); err != nil {
		return nil, err
	}
	ents, err := os.ReadDir(req.Path)
	if err != nil {
		return nil, err
	}
	files := make([]FileInfo, 0, len(ents))
	for _, e := range ents {
		fi, err := e.Info()
		if err != nil {
			continue // removed meanwhile
		}
		files = append(files, fileInfo(e.Name(), fi))
	}
	return &Result{Files: files}, nil
}

func (s *Server) stat(req *Request) (*Result, error) {
	if err := CheckPath(req.Path); err != nil {
		return nil, err
	}
	fi, err := os.Lstat(req.Path)
	if err != nil {
		return nil, err
	}
	info := fileInfo(req.Path, fi)
	return &Result{File: &info}, nil
}

// claim binds a restored sandbox's identity: clock, entropy, hostname and
// the environment of later commands.
func (s *Server) claim(req *Request) (*Result, error) {
	n, err := envBytes(req.Env)
	if err != nil {
		return nil, err
	}
	// The claim's environment is the base of every command's: one over
	// the limit would make every later exec fail.
	if n > MaxCommandBytes {
		return nil, fmt.Errorf("env: %d bytes, over the limit of %d", n, MaxCommandBytes)
	}
	if req.Pids < 0 || req.Pids > MaxPids {
		return nil, fmt.Errorf("pids: %d: must be between 0 (keep the limit) and %d", req.Pids, MaxPids)
	}
	if s.Sys != nil {
		if req.UnixNano != 0 {
			if err := s.Sys.SetTime(req.UnixNano); err != nil {
				return nil, fmt.Errorf("set time: %w", err)
			}
		}
		if len(req.Entropy) > 0 {
			if err := s.Sys.AddEntropy(req.Entropy); err != nil {
				return nil, fmt.Errorf("reseed: %w", err)
			}
		}
		s.mu.Lock()
		samePids := s.pids == req.Pids
		s.mu.Unlock()
		if req.Pids > 0 && !samePids {
			if err := s.Sys.SetPids(req.Pids); err != nil {
				s.mu.Lock()
				s.pids = 0 // unknown: set it again next time
				s.mu.Unlock()
				return nil, fmt.Errorf("pids: %w", err)
			}
			s.mu.Lock()
			s.pids = req.Pids
			s.mu.Unlock()
		}
		if req.Hostname != "" {
			if err := s.Sys.SetHostname(req.Hostname); err != nil {
				return nil, fmt.Errorf("hostname: %w", err)
			}
		}
	}
	if req.Net != nil {
		// Settings equal to those in place were checked when they were set
		// (a clone's claim, whose snapshot set them): parsing the addresses
		// again would be code a fresh clone translates for nothing.
		s.mu.Lock()
		same := s.net != nil && s.net.Equal(*req.Net)
		s.mu.Unlock()
		if !same {
			if err := req.Net.Check(); err != nil {
				return nil, err
			}
			if s.Sys == nil {
				return nil, errors.New("net: not supported here")
			}
			if err := s.Sys.SetNetwork(*req.Net); err != nil {
				s.mu.Lock()
				s.net = nil // partly set: set it all again next time
				s.mu.Unlock()
				return nil, fmt.Errorf("net: %w", err)
			}
			n := req.Net.clone()
			s.mu.Lock()
			s.net = &n
			s.mu.Unlock()
		}
	}
	s.mu.Lock()
	s.env = maps.Clone(req.Env)
	s.mu.Unlock()
	// Debug, not Info: the agent logs to the serial console, and under TCG
	// every byte goes through the emulated UART; a line like this one took
	// about 0.4 ms of the guest's one vCPU, in the middle of a warm claim.
	s.log().Debug("claimed", "hostname", req.Hostname)
	return &Result{GuestUnixNano: time.Now().UnixNano(), Ordered: true, Wire: true}, nil
}

// StartFailureStatus is the shell's exit status for an exec the agent
// could not start, from the error's message (what a client of the node's
// API sees, prefixes included): 127 for a command not found (in its PATH,
// or a path that does not exist), 126 for one found that could not run
// (not executable, a bad working directory, no resources to fork), 0 for
// a message that is not a start failure. The messages are the agent's own
// ("start %q: ..." above).
func StartFailureStatus(msg string) int {
	i := strings.Index(msg, `start "`)
	if i < 0 {
		return 0
	}
	rest := msg[i:]
	switch {
	case strings.Contains(rest, "executable file not found"),
		strings.Contains(rest, ": fork/exec ") && strings.HasSuffix(rest, ": no such file or directory"):
		return 127
	}
	return 126
}
