package microvm

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"sync"
	"syscall"
	"time"
)

// QMP is a synchronous client of QEMU's machine protocol: one command at a
// time, events skipped. The protocol is JSON lines; what warren needs of it
// (stop, cont, getfd, migrate, query-status, quit) fits in this file, so it takes
// no library.
type QMP struct {
	mu   sync.Mutex
	conn net.Conn
	r    *bufio.Reader
	seq  uint64 // the last command's id
}

// DialQMP connects to a QMP socket, retrying until ctx ends (QEMU creates
// the socket a few ms after it starts), and negotiates capabilities.
func DialQMP(ctx context.Context, path string) (*QMP, error) {
	var conn net.Conn
	var err error
	for {
		var d net.Dialer
		conn, err = d.DialContext(ctx, "unix", path)
		if err == nil {
			break
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("qmp %s: %w (last: %v)", path, ctx.Err(), err)
		case <-time.After(2 * time.Millisecond):
		}
	}
	q := &QMP{conn: conn, r: bufio.NewReaderSize(conn, 64<<10)}
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
	}
	if _, err := q.r.ReadBytes('\n'); err != nil { // the greeting
		conn.Close()
		return nil, fmt.Errorf("qmp greeting: %w", err)
	}
	conn.SetDeadline(time.Time{})
	if _, err := q.Run(ctx, "qmp_capabilities", nil); err != nil {
		conn.Close()
		return nil, err
	}
	return q, nil
}

// QMPError is an error QEMU returned for a command.
type QMPError struct {
	Command, Class, Desc string
}

func (e *QMPError) Error() string { return fmt.Sprintf("qmp %s: %s: %s", e.Command, e.Class, e.Desc) }

// Run executes one command and returns its "return" value.
func (q *QMP) Run(ctx context.Context, cmd string, args any) (json.RawMessage, error) {
	return q.run(ctx, cmd, args, nil)
}

// SendFD hands f to QEMU under name (QMP getfd), for a later command to use
// as "fd:name": QEMU, which may not open files or start processes itself
// (seccompArgs), writes to a file the node opened.
func (q *QMP) SendFD(ctx context.Context, name string, f *os.File) error {
	_, err := q.run(ctx, "getfd", map[string]any{"fdname": name}, f)
	return err
}

// run is Run, passing f (if set) along with the command (SCM_RIGHTS).
func (q *QMP) run(ctx context.Context, cmd string, args any, f *os.File) (json.RawMessage, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	// Each command carries an id, which QEMU puts in its reply: a
	// command whose reply did not come in time (its deadline passed
	// mid-read) has that reply come later, and without ids it was taken
	// as the next command's (a migration thought over, a status wrong).
	q.seq++
	id := q.seq
	msg := map[string]any{"execute": cmd, "id": id}
	if args != nil {
		msg["arguments"] = args
	}
	b, err := json.Marshal(msg)
	if err != nil {
		return nil, err
	}
	if dl, ok := ctx.Deadline(); ok {
		q.conn.SetDeadline(dl)
	} else {
		q.conn.SetDeadline(time.Now().Add(30 * time.Second))
	}
	defer q.conn.SetDeadline(time.Time{})
	if f != nil {
		uc, ok := q.conn.(*net.UnixConn)
		if !ok {
			return nil, fmt.Errorf("qmp %s: a file can only be passed over a unix socket", cmd)
		}
		raw, err := f.SyscallConn()
		if err != nil {
			return nil, fmt.Errorf("qmp %s: %w", cmd, err)
		}
		var werr error
		if err := raw.Control(func(fd uintptr) {
			_, _, werr = uc.WriteMsgUnix(append(b, '\n'), syscall.UnixRights(int(fd)), nil)
		}); err != nil {
			return nil, fmt.Errorf("qmp %s: %w", cmd, err)
		}
		if werr != nil {
			return nil, fmt.Errorf("qmp %s: %w", cmd, werr)
		}
	} else if _, err := q.conn.Write(append(b, '\n')); err != nil {
		return nil, fmt.Errorf("qmp %s: %w", cmd, err)
	}
	for {
		line, err := q.r.ReadBytes('\n')
		if err != nil {
			return nil, fmt.Errorf("qmp %s: %w", cmd, err)
		}
		var resp struct {
			Return json.RawMessage `json:"return"`
			Error  *struct {
				Class string `json:"class"`
				Desc  string `json:"desc"`
			} `json:"error"`
			Event string  `json:"event"`
			ID    *uint64 `json:"id"`
		}
		if err := json.Unmarshal(line, &resp); err != nil {
			// The rest of a line whose start an earlier command's
			// deadline cut off: that command's reply, not this one's.
			continue
		}
		switch {
		case resp.Event != "":
			continue
		case resp.ID == nil || *resp.ID != id:
			continue // an earlier command's late reply
		case resp.Error != nil:
			return nil, &QMPError{Command: cmd, Class: resp.Error.Class, Desc: resp.Error.Desc}
		default:
			return resp.Return, nil
		}
	}
}

// Status returns the VM's run state ("running", "paused", "inmigrate", …).
func (q *QMP) Status(ctx context.Context) (string, error) {
	raw, err := q.Run(ctx, "query-status", nil)
	if err != nil {
		return "", err
	}
	var st struct {
		Status string `json:"status"`
	}
	err = json.Unmarshal(raw, &st)
	return st.Status, err
}

// Migration returns the outgoing migration's status.
func (q *QMP) Migration(ctx context.Context) (string, string, error) {
	raw, err := q.Run(ctx, "query-migrate", nil)
	if err != nil {
		return "", "", err
	}
	var st struct {
		Status string `json:"status"`
		Error  string `json:"error-desc"`
	}
	err = json.Unmarshal(raw, &st)
	return st.Status, st.Error, err
}

// Close closes the connection (QEMU keeps running).
func (q *QMP) Close() error { return q.conn.Close() }
