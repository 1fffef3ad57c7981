package guest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/yamux"
)

// Client is the host's end of one guest connection. It is safe for
// concurrent use; each call opens its own stream.
type Client struct {
	sess    *yamux.Session
	guard   *guardConn
	ordered atomic.Bool // an answer to a ping or a claim said the agent orders claims
	wire    atomic.Bool // the agent reads the wire codec: calls use it
}

// NewClient starts a session on conn (a virtio-serial chardev socket, a
// pipe in tests). The Client owns conn. The session ends if the guest
// sends a yamux ping or opens a stream (guardConn).
//
// The host keeps YamuxConfig's accept backlog although it accepts no
// streams: yamux also sizes by it how many streams an end may have opened
// and not yet seen accepted, and the agent accepts no call behind a claim
// until the claim is done.
func NewClient(conn io.ReadWriteCloser) (*Client, error) {
	guard := &guardConn{ReadWriteCloser: conn}
	sess, err := yamux.Client(guard, YamuxConfig())
	if err != nil {
		return nil, err
	}
	return &Client{sess: sess, guard: guard}, nil
}

// Dial connects to a guest's unix socket.
func Dial(ctx context.Context, path string) (*Client, error) {
	var d net.Dialer
	// A socket path longer than sun_path (108 bytes: deep data
	// directories) is reached through a descriptor of its directory.
	if len(path) >= 100 {
		dir, err := os.Open(filepath.Dir(path))
		if err != nil {
			return nil, err
		}
		defer dir.Close()
		path = fmt.Sprintf("/proc/self/fd/%d/%s", dir.Fd(), filepath.Base(path))
	}
	conn, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, err
	}
	return NewClient(conn)
}

// Close ends the session.
func (c *Client) Close() error { return c.sess.Close() }

// Done is closed when the session ends.
func (c *Client) Done() <-chan struct{} { return c.sess.CloseChan() }

// call is one open stream; ctx closes it, which makes the guest abandon
// the call (and kill an exec's process group), and ends the wait for its
// answer at once: a guest that never answers (its port's writes stuck in
// QEMU) would otherwise hold a closed stream's reader for yamux's stream
// close timeout.
type call struct {
	st     *yamux.Stream
	stop   func() bool
	ctx    context.Context
	cancel context.CancelFunc // ends ctx if open bounded it (bound); may be nil
	drop   func()             // closes and resets the stream (guardConn.drop); may be nil
}

// callWait bounds a call other than an exec whose caller gave it no
// sooner deadline (a variable for tests). The guest is not trusted: one
// that never finishes its answer would otherwise hold the call, its
// stream and what it sent so far for as long as the caller waits, which
// for an API client without a deadline is for good. An exec is bounded by
// its own timeout (execGrace) or its caller. The slowest legitimate
// calls, a 32 MiB file read or written under TCG, take seconds.
var callWait = 5 * time.Minute

// bound gives a call other than an exec callWait, unless ctx ends sooner.
func bound(ctx context.Context, op Op) (context.Context, context.CancelFunc) {
	if op == OpExec {
		return ctx, func() {}
	}
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) <= callWait {
		return ctx, func() {}
	}
	return context.WithTimeoutCause(ctx, callWait,
		fmt.Errorf("guest: %s: the guest did not answer within %v: %w", op, callWait, context.DeadlineExceeded))
}

func (c *Client) open(ctx context.Context, req *Request) (*call, error) {
	ctx, cancel := bound(ctx, req.Op)
	// Opening a stream and writing the request wait for yamux's one send
	// loop, which waits up to ConnectionWriteTimeout (a minute) for a
	// guest that stopped taking what the host sends (its agent stopped,
	// its kernel hung: QEMU no longer drains the port). The call ends at
	// ctx; a stream opened after that is dropped when it is.
	type opened struct {
		cl  *call
		err error
	}
	ch := make(chan opened, 1)
	go func() {
		cl, err := c.openStream(ctx, cancel, req)
		ch <- opened{cl, err}
	}()
	select {
	case o := <-ch:
		return o.cl, o.err
	case <-ctx.Done():
		go func() {
			if o := <-ch; o.cl != nil {
				o.cl.close()
			}
		}()
		return nil, context.Cause(ctx)
	}
}

// openStream opens a call's stream and writes its request; on an error
// it calls cancel.
func (c *Client) openStream(ctx context.Context, cancel context.CancelFunc, req *Request) (*call, error) {
	st, err := c.sess.OpenStream()
	if err != nil {
		cancel()
		return nil, fmt.Errorf("guest: open stream: %w", err)
	}
	var once sync.Once
	drop := func() { once.Do(func() { c.guard.drop(st) }) }
	stop := context.AfterFunc(ctx, func() {
		_ = st.SetReadDeadline(time.Now())
		drop()
		if req.Op == OpExec && req.Stdin {
			c.abandon(st.StreamID())
		}
	})
	if c.wire.Load() {
		err = writeFrame(st, frameRequestWire, req.appendWire(nil))
	} else {
		err = writeJSON(st, frameRequest, req)
	}
	cl := &call{st: st, stop: stop, ctx: ctx, cancel: cancel, drop: drop}
	if err != nil {
		err = c.err(ctx, err)
		cl.close()
		return nil, err
	}
	return cl, nil
}

// abandonWait bounds an OpCancel's wait for its answer.
const abandonWait = 10 * time.Second

// abandon tells the agent that the host gave up on the exec on stream id.
// Closing the stream says so too, but an agent writing the exec's stdin
// to a command that does not read it would not see that until the command
// ended. An agent from before OpCancel answers it with an error, which
// changes nothing.
func (c *Client) abandon(id uint32) {
	ctx, cancel := context.WithTimeout(context.Background(), abandonWait)
	defer cancel()
	_, _ = c.simple(ctx, &Request{Op: OpCancel, Call: id})
}

// err is a call's error: why ctx ended, if it did (callWait's cause
// names the call), or err.
func (c *Client) err(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	return fmt.Errorf("guest: %w", err)
}

// close ends the call: the stream is closed and reset at both ends, so
// the host's session holds nothing of it, nor of what the guest sends on
// it after (guardConn.drop).
//
// A call whose ctx ended is closed in the background: the guest may have
// stopped taking frames, and the close's FIN waits for yamux's send loop
// (up to ConnectionWriteTimeout).
func (cl *call) close() {
	cl.stop()
	if cl.ctx != nil && cl.ctx.Err() != nil {
		go cl.closeNow()
		return
	}
	cl.closeNow()
}

func (cl *call) closeNow() {
	if cl.drop != nil {
		cl.drop()
	} else {
		cl.st.Close()
	}
	if cl.cancel != nil {
		cl.cancel()
	}
}

// finish reads frames until the result, handing data frames to onData.
func (c *Client) finish(cl *call, onData func(kind byte, p []byte) error) (*Result, error) {
	return c.finishWith(cl, onData, decodeResult)
}

// decodeResult decodes a result frame of either codec for a call other
// than a list (List decodes its own, charging its entries). Entries in
// it are refused before they are decoded: uncharged and unchecked, a
// 1 MiB answer of empty entries made hundreds of thousands of FileInfos.
func decodeResult(kind byte, p []byte) (*Result, error) {
	var res Result
	var err error
	if kind == frameResultWire {
		var n int
		if n, err = countWireFiles(p); err == nil && n > 0 {
			err = errFilesOutsideList
		}
		if err == nil {
			err = res.decodeWire(p)
		}
	} else {
		// The outer Files hides Result's from encoding/json.
		var r struct {
			Result
			Files noFiles `json:"files"`
		}
		err = json.Unmarshal(p, &r)
		res = r.Result
	}
	if err == nil && (res.ExitCode < 0 || res.ExitCode > MaxExitCode) {
		// A process's exit status is a byte: anything else is made up,
		// and 256 (or 1<<32) reads as 0, a success, once narrowed.
		err = fmt.Errorf("exit_code: %d is outside 0..%d", res.ExitCode, MaxExitCode)
	}
	if err != nil {
		return nil, answerErr("guest: result", err)
	}
	return &res, nil
}

// MaxExitCode is the largest exit code a guest may report: an exit
// status is a byte. A guest's answer with a code outside 0..MaxExitCode
// is refused.
const MaxExitCode = 255

var errFilesOutsideList = errors.New("files: entries in the answer to a call other than a list")

// noFiles is a JSON result's "files" outside a list: refused (but for
// null, as when it is left out) without decoding it.
type noFiles struct{}

func (noFiles) UnmarshalJSON(p []byte) error {
	if string(p) != "null" {
		return errFilesOutsideList
	}
	return nil
}

// answerErr is err, met decoding a guest's answer, after prefix; an
// error over MaxRemoteErrorBytes is cut to its head, as a guest's own
// message is (remoteError). encoding/json puts a whole literal into its
// error: {"exit_code":<1 MiB of digits>} gave an error of 1 MiB, which
// the host logs and sends to API clients.
func answerErr(prefix string, err error) error {
	msg := err.Error()
	if len(msg) <= MaxRemoteErrorBytes {
		return fmt.Errorf("%s: %w", prefix, err)
	}
	head := strings.ToValidUTF8(msg[:MaxRemoteErrorBytes], "")
	return fmt.Errorf("%s: %s [cut: the error was %d bytes]", prefix, head, len(msg))
}

// finishWith is finish with the result frame decoded by decode.
func (c *Client) finishWith(cl *call, onData func(kind byte, p []byte) error, decode func(kind byte, p []byte) (*Result, error)) (*Result, error) {
	defer cl.close()
	for {
		kind, p, err := readFrame(cl.st)
		if err != nil {
			return nil, c.err(cl.ctx, err)
		}
		switch kind {
		case frameResult, frameResultWire:
			if cl.ctx.Err() != nil {
				return nil, context.Cause(cl.ctx) // the call was abandoned, whatever it did
			}
			return decode(kind, p)
		case frameError:
			return nil, remoteError(p)
		default:
			if onData == nil {
				return nil, fmt.Errorf("guest: unexpected frame %q", kind)
			}
			if err := onData(kind, p); err != nil {
				return nil, err
			}
		}
	}
}

func (c *Client) simple(ctx context.Context, req *Request) (*Result, error) {
	cl, err := c.open(ctx, req)
	if err != nil {
		return nil, err
	}
	return c.finish(cl, nil)
}

// Ping returns the guest's clock. It also learns whether the agent orders
// claims (Ordered).
func (c *Client) Ping(ctx context.Context) (time.Time, error) {
	res, err := c.simple(ctx, &Request{Op: OpPing})
	if err != nil {
		return time.Time{}, err
	}
	return c.clock(res), nil
}

// clock is the guest's clock in a ping's or a claim's answer, which also
// says whether the agent orders claims.
func (c *Client) clock(res *Result) time.Time {
	c.ordered.Store(res.Ordered)
	if res.Wire {
		c.wire.Store(true)
	}
	if res.GuestUnixNano == 0 {
		return time.Time{} // an answer without the guest's clock
	}
	return time.Unix(0, res.GuestUnixNano)
}

// Ordered reports whether the agent said, in its answer to a ping or a
// claim on this session, that it serves a claim before any call opened
// after it (see StartClaim). False before such an answer, and for older
// agents.
func (c *Client) Ordered() bool { return c.ordered.Load() }

// UseWire makes the Client send its calls in the wire codec (wire.go)
// from now on, as it does on its own once an answer to a ping or a claim
// says the agent reads it. For a session whose agent is known to read it
// before any answer: a clone of a snapshot whose agent said so.
func (c *Client) UseWire() { c.wire.Store(true) }

// Wire reports whether the Client sends its calls in the wire codec.
func (c *Client) Wire() bool { return c.wire.Load() }

// ExecRequest is one command.
type ExecRequest struct {
	Argv []string
	Env  map[string]string
	Dir  string
	// Timeout kills the command's process group after this long; 0 is
	// none. It is sent in whole milliseconds, rounded up.
	Timeout time.Duration
	// Stdin is the command's stdin; nil: it is empty. If reading it fails,
	// the command is killed and Exec returns that error. Exec may still
	// be in a Read of it when it returns.
	Stdin io.Reader
}

// CeilMS is d in whole milliseconds, rounded up: a timeout under 1 ms must
// not become 0, which is none.
func CeilMS(d time.Duration) int64 {
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

// timeoutMS is an exec's timeout as sent: CeilMS of d, checked.
func timeoutMS(d time.Duration) (int64, error) {
	if d < 0 {
		return 0, fmt.Errorf("timeout: %v: must not be negative", d)
	}
	ms := CeilMS(d)
	return ms, CheckTimeoutMS(ms)
}

// readErr records the first error of a reader other than io.EOF.
type readErr struct {
	r   io.Reader
	mu  sync.Mutex
	err error
}

func (r *readErr) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	if err != nil && err != io.EOF {
		r.mu.Lock()
		if r.err == nil {
			r.err = err
		}
		r.mu.Unlock()
	}
	return n, err
}

func (r *readErr) get() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err
}

// sendData sends a call's data (an exec's stdin, a write's file) as data
// frames and then the EOF frame. If reading src fails, it closes the
// stream instead of sending EOF: the agent then kills the command, or
// discards the partial file, rather than take the data as complete.
func sendData(st *yamux.Stream, src *readErr) error {
	_, err := writeChunks(st, frameData, src)
	if err == nil {
		return writeFrame(st, frameEOF, nil)
	}
	if src.get() != nil {
		st.Close()
	}
	return err
}

// ExecResult is how a command ended.
type ExecResult struct {
	ExitCode int // 0..MaxExitCode: the guest's answer is refused otherwise
	Signal   int
	TimedOut bool
	Duration time.Duration
}

// execGrace is how long the host waits past an exec's timeout for the
// guest's answer before it gives up on the call (a variable for tests).
var execGrace = 30 * time.Second

// Exec runs a command, writing its output to stdout and stderr (either may
// be nil) as it arrives.
func (c *Client) Exec(ctx context.Context, req ExecRequest, stdout, stderr io.Writer) (ExecResult, error) {
	if err := CheckExec(req.Argv, req.Env); err != nil {
		return ExecResult{}, err
	}
	ms, err := timeoutMS(req.Timeout)
	if err != nil {
		return ExecResult{}, err
	}
	if req.Timeout > 0 {
		// The agent kills the command at its timeout, but the guest is not
		// trusted: the host gives up too, a grace later (the agent's kill
		// and its answer take a moment).
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, req.Timeout+execGrace,
			fmt.Errorf("guest: exec: the guest did not answer within %v of the command's %v timeout: %w",
				execGrace, req.Timeout, context.DeadlineExceeded))
		defer cancel()
	}
	cl, err := c.open(ctx, &Request{Op: OpExec, Argv: req.Argv, Env: req.Env, Dir: req.Dir,
		TimeoutMS: ms, Stdin: req.Stdin != nil})
	if err != nil {
		return ExecResult{}, err
	}
	var stdin *readErr
	if req.Stdin != nil {
		stdin = &readErr{r: req.Stdin}
		go func() { _ = sendData(cl.st, stdin) }()
	}
	res, err := c.finish(cl, func(kind byte, p []byte) error {
		var w io.Writer
		switch kind {
		case frameStdout:
			w = stdout
		case frameStderr:
			w = stderr
		default:
			return fmt.Errorf("guest: unexpected frame %q in exec", kind)
		}
		if w != nil {
			if _, err := w.Write(p); err != nil {
				return fmt.Errorf("guest: output: %w", err)
			}
		}
		return nil
	})
	if stdin != nil {
		if serr := stdin.get(); serr != nil {
			return ExecResult{}, fmt.Errorf("guest: exec: stdin: %w", serr)
		}
	}
	if err != nil {
		if cause := context.Cause(ctx); cause != nil && errors.Is(err, context.DeadlineExceeded) {
			return ExecResult{}, cause // the caller's own deadline, or the timeout's grace
		}
		return ExecResult{}, err
	}
	return ExecResult{ExitCode: res.ExitCode, Signal: res.Signal, TimedOut: res.TimedOut,
		Duration: time.Duration(res.DurationUS) * time.Microsecond}, nil
}

// ReadFile copies a guest file to w. limit > 0 refuses larger files; w
// then gets at most limit bytes, whatever the guest sends.
func (c *Client) ReadFile(ctx context.Context, path string, limit int64, w io.Writer) (FileInfo, error) {
	if err := CheckPath(path); err != nil {
		return FileInfo{}, err
	}
	cl, err := c.open(ctx, &Request{Op: OpRead, Path: path, Limit: limit})
	if err != nil {
		return FileInfo{}, err
	}
	var got int64
	res, err := c.finish(cl, func(kind byte, p []byte) error {
		if kind != frameData {
			return fmt.Errorf("guest: unexpected frame %q in read", kind)
		}
		// The agent refuses a file over the limit, but the guest is not
		// trusted: the host counts too.
		if got += int64(len(p)); limit > 0 && got > limit {
			return fmt.Errorf("guest: read %s: the guest sent more than the %d bytes asked for", path, limit)
		}
		_, err := w.Write(p)
		return err
	})
	if err != nil {
		return FileInfo{}, err
	}
	if res.File == nil {
		return FileInfo{}, errors.New("guest: read: no file info")
	}
	return *res.File, nil
}

// WriteFile replaces (atomically) or creates a guest file with r's bytes,
// creating parent directories. A nil mode means DefaultFileMode; a mode
// of 0 makes the file 0000 (an agent from before Request.ModeSet makes it
// DefaultFileMode). If it returns an error it may still be in a Read of r.
func (c *Client) WriteFile(ctx context.Context, path string, mode *uint32, r io.Reader) (FileInfo, error) {
	if err := CheckPath(path); err != nil {
		return FileInfo{}, err
	}
	req := &Request{Op: OpWrite, Path: path}
	if mode != nil {
		req.Mode, req.ModeSet = *mode, true
	}
	cl, err := c.open(ctx, req)
	if err != nil {
		return FileInfo{}, err
	}
	// The data goes out while the answer is awaited: an agent that
	// refuses the write early (its claim failed, the directory cannot be
	// made) answers at once and reads no more, and a writer that waited
	// for the whole file to go first would stall on the full stream.
	src := &readErr{r: r}
	sent := make(chan error, 1)
	go func() { sent <- sendData(cl.st, src) }()
	res, err := c.finish(cl, nil)
	if serr := src.get(); serr != nil {
		return FileInfo{}, fmt.Errorf("guest: write %s: reading the data: %w", path, serr)
	}
	if err != nil {
		return FileInfo{}, err // the writer ends on the closed stream
	}
	// A guest that answered before it had all the data (only a hostile
	// one does) leaves the sender in a Read of r: the caller's ctx bounds
	// the wait for it (the call's own ended with the answer).
	select {
	case err := <-sent:
		if err != nil {
			return FileInfo{}, c.err(ctx, err)
		}
	case <-ctx.Done():
		return FileInfo{}, fmt.Errorf("guest: write %s: the guest answered before it had the data: %w", path, context.Cause(ctx))
	}
	if res.File == nil {
		return FileInfo{}, errors.New("guest: write: no file info")
	}
	return *res.File, nil
}

// List returns the entries of a guest directory.
func (c *Client) List(ctx context.Context, path string) ([]FileInfo, error) {
	if err := CheckPath(path); err != nil {
		return nil, err
	}
	cl, err := c.open(ctx, &Request{Op: OpList, Path: path})
	if err != nil {
		return nil, err
	}
	// A large listing comes in parts (see answer in server.go), then the
	// result's own entries; all are decoded by l, which charges each
	// entry before the host holds it.
	l := &listing{path: path}
	_, err = c.finishWith(cl, func(kind byte, p []byte) error {
		switch kind {
		case frameFiles, frameFilesWire:
			return l.part(kind, p)
		}
		return fmt.Errorf("guest: unexpected frame %q in list", kind)
	}, func(kind byte, p []byte) (*Result, error) {
		return &Result{}, l.part(kind, p)
	})
	if err != nil {
		return nil, err
	}
	return l.files, nil
}

// ErrListTooLarge is a listing over the host's limits (maxListBytes,
// maxListEntries): a directory too large to list in one call.
var ErrListTooLarge = errors.New("directory too large to list")

// The host holds a listing whole, and a caller makes more of each entry
// (noded: an API message and its timestamp), so a listing is bounded by
// what it costs the host, not by what the guest sent: an entry with a
// one-byte name is 5 bytes on the wire but a 48-byte FileInfo, its share
// of the slice's growth, and about as much again in the caller's copy.
//
// maxListEntries bounds the entries of one listing. maxListBytes bounds
// the bytes the guest sent for it plus listEntryCost for each entry; it
// is reached before maxListEntries only by long names (100,000 entries of
// 255-byte names charge 50 to 60 MiB). Each entry is charged before it is
// decoded (a wire frame's entries are counted first), so a refused
// listing never held more than its budget. The sandbox API's gate takes
// room for a listing of maxListEntries of MaxNameBytes names
// (api.BulkGateListBytes): a change here changes it.
const (
	maxListEntries = 100_000
	maxListBytes   = 64 << 20
	listEntryCost  = 256
)

// listing is a listing being received: its entries so far and what they
// were charged.
type listing struct {
	path    string
	files   []FileInfo
	charged int
	err     error // why jsonFiles stopped, if it was the limits or check
}

// charge counts n more entries and b more bytes the guest sent, or
// refuses them past the limits.
func (l *listing) charge(n, b int) error {
	if len(l.files)+n > maxListEntries {
		return fmt.Errorf("guest: list %s: %w: the guest sent over %d entries", l.path, ErrListTooLarge, maxListEntries)
	}
	if l.charged += b + n*listEntryCost; l.charged > maxListBytes {
		return fmt.Errorf("guest: list %s: %w: over %d MiB of entries", l.path, ErrListTooLarge, maxListBytes>>20)
	}
	return nil
}

// part decodes a frame of entries (a part, or the result) of either
// codec and appends its entries.
func (l *listing) part(kind byte, p []byte) error {
	if err := l.charge(0, len(p)); err != nil {
		return err
	}
	if kind == frameFilesWire || kind == frameResultWire {
		n, err := countWireFiles(p)
		if err != nil {
			return answerErr("guest: list", err)
		}
		if err := l.charge(n, 0); err != nil {
			return err
		}
		var part Result
		if err := part.decodeWire(p); err != nil {
			return answerErr("guest: list", err)
		}
		for _, f := range part.Files {
			if err := l.check(f); err != nil {
				return err
			}
		}
		l.files = append(l.files, part.Files...)
		return nil
	}
	// JSON: jsonFiles counts the entries and charges them, then decodes.
	var part struct {
		Files jsonFiles `json:"files"`
	}
	part.Files.l = l
	if err := json.Unmarshal(p, &part); err != nil {
		if l.err != nil {
			return l.err // the limits' or check's own error
		}
		return answerErr("guest: list", err)
	}
	return nil
}

// check refuses an entry without a name, or with a name no file system
// gives (over MaxNameBytes).
func (l *listing) check(f FileInfo) error {
	switch {
	case f.Name == "":
		return fmt.Errorf("guest: list %s: the guest sent an entry without a name", l.path)
	case len(f.Name) > MaxNameBytes:
		return fmt.Errorf("guest: list %s: the guest sent a name of %d bytes, over the limit of %d (NAME_MAX)", l.path, len(f.Name), MaxNameBytes)
	}
	return nil
}

// jsonFiles decodes a JSON result's "files" into its listing, charged
// for its entries before they are decoded.
type jsonFiles struct{ l *listing }

func (j *jsonFiles) UnmarshalJSON(p []byte) error {
	n := countJSONElems(p)
	if j.l.err = j.l.charge(n, 0); j.l.err != nil {
		return j.l.err
	}
	// Sized up front: grown as it is decoded, the slice would be
	// allocated several times over.
	files := make([]FileInfo, 0, n)
	if err := json.Unmarshal(p, &files); err != nil {
		return fmt.Errorf("files: %w", err)
	}
	for _, f := range files {
		if j.l.err = j.l.check(f); j.l.err != nil {
			return j.l.err
		}
	}
	j.l.files = append(j.l.files, files...)
	return nil
}

// countJSONElems counts the elements of p if it is a JSON array (0 for
// any other value), without decoding them. p is valid JSON, as
// json.Unmarshal hands an UnmarshalJSON.
func countJSONElems(p []byte) int {
	depth, n := 0, 0
	inStr, esc, some := false, false, false
	for _, b := range p {
		switch {
		case inStr:
			switch {
			case esc:
				esc = false
			case b == '\\':
				esc = true
			case b == '"':
				inStr = false
			}
			continue
		case b == ' ' || b == '\t' || b == '\n' || b == '\r':
			continue
		}
		if depth == 1 && b != ']' {
			some = true
		}
		switch b {
		case '"':
			inStr = true
		case '[', '{':
			if depth == 0 && b != '[' {
				return 0
			}
			depth++
		case ']', '}':
			depth--
		case ',':
			if depth == 1 {
				n++
			}
		}
	}
	if some {
		n++
	}
	return n
}

// Stat describes one guest path (without following a final symlink).
func (c *Client) Stat(ctx context.Context, path string) (FileInfo, error) {
	if err := CheckPath(path); err != nil {
		return FileInfo{}, err
	}
	res, err := c.simple(ctx, &Request{Op: OpStat, Path: path})
	if err != nil {
		return FileInfo{}, err
	}
	if res.File == nil {
		return FileInfo{}, errors.New("guest: stat: no file info")
	}
	return *res.File, nil
}

// ClaimRequest binds a restored guest's identity.
type ClaimRequest struct {
	Now      time.Time // the guest's clock; zero leaves it as it is
	Entropy  []byte
	Hostname string
	Env      map[string]string
	Pids     int // the commands' process limit; 0 keeps it
	Net      *NetConfig
}

// Claim sets the guest's clock, reseeds its entropy, and sets its hostname
// and base environment. It returns the guest's clock after the call.
func (c *Client) Claim(ctx context.Context, req ClaimRequest) (time.Time, error) {
	res, err := c.simple(ctx, claimRequest(req))
	if err != nil {
		return time.Time{}, err
	}
	return c.clock(res), nil
}

// StartClaim sends a claim and returns once it is on its way, with a
// function that waits for the answer (what Claim returns). With an agent
// whose claims are Ordered, every call made after StartClaim returns runs
// after the claim, with its identity, and is refused if the claim failed;
// so a host can send a sandbox's first command without waiting a round
// trip for the claim. ctx bounds the whole call, including the wait.
func (c *Client) StartClaim(ctx context.Context, req ClaimRequest) (wait func() (time.Time, error), err error) {
	cl, err := c.open(ctx, claimRequest(req))
	if err != nil {
		return nil, err
	}
	return func() (time.Time, error) {
		res, err := c.finish(cl, nil)
		if err != nil {
			return time.Time{}, err
		}
		return c.clock(res), nil
	}, nil
}

func claimRequest(req ClaimRequest) *Request {
	r := &Request{Op: OpClaim, Entropy: req.Entropy, Hostname: req.Hostname, Env: req.Env, Pids: req.Pids, Net: req.Net}
	if !req.Now.IsZero() {
		// The zero time's UnixNano is far out of range, not 0 (which the
		// agent reads as "keep the clock").
		r.UnixNano = req.Now.UnixNano()
	}
	return r
}

// Stats reports the guest's resources.
func (c *Client) Stats(ctx context.Context) (Stats, error) {
	res, err := c.simple(ctx, &Request{Op: OpStats})
	if err != nil {
		return Stats{}, err
	}
	if res.Stats == nil {
		return Stats{}, errors.New("guest: stats: empty")
	}
	return *res.Stats, nil
}

// Sync flushes the guest's file systems (before a snapshot).
func (c *Client) Sync(ctx context.Context) error {
	_, err := c.simple(ctx, &Request{Op: OpSync})
	return err
}

// Output runs argv and returns its combined output (a convenience).
func (c *Client) Output(ctx context.Context, argv ...string) ([]byte, ExecResult, error) {
	var b bytes.Buffer
	res, err := c.Exec(ctx, ExecRequest{Argv: argv}, &b, &b)
	return b.Bytes(), res, err
}
