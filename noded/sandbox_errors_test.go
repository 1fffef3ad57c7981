package noded

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"syscall"
	"testing"

	"connectrpc.com/connect"

	"github.com/warrenhq/warren/api"
	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
	"github.com/warrenhq/warren/api/gen/warren/v1/warrenv1connect"
	"github.com/warrenhq/warren/guest"
	"github.com/warrenhq/warren/noded/driver"
)

// failingBox is a sandbox whose calls fail with err (only the methods the
// test calls are here).
type failingBox struct {
	driver.Interactive
	id  string
	err error
}

func (b *failingBox) ID() string { return b.id }
func (b *failingBox) ReadFile(context.Context, string, int64, io.Writer) (guest.FileInfo, error) {
	return guest.FileInfo{}, b.err
}
func (b *failingBox) ListFiles(context.Context, string) ([]guest.FileInfo, error) { return nil, b.err }
func (b *failingBox) Pause(context.Context) error                                 { return b.err }

// failingClaims is a driver whose claims fail with err.
type failingClaims struct {
	listDriver
	err error
}

func (d *failingClaims) Claim(context.Context, driver.ClaimRequest) (driver.Sandbox, error) {
	return nil, d.err
}

// An error of the node's own (a driver's, the OS's) reaches the client
// without the node's file paths: how the host is laid out (its state and
// template directories, QEMU's and the agents' sockets) is no client's
// business. The node's log keeps the whole error. Paths in the sandbox are
// the client's: the one the call named, and whatever the guest agent said.
func TestSandboxErrorsLeaveOutTheNodesPaths(t *testing.T) {
	id := api.NewSandboxID(testNode)
	box := &failingBox{id: id}
	drv := &failingClaims{listDriver: listDriver{name: "microvm", live: map[string]driver.Sandbox{id: box}}}
	var logw syncBuffer
	a := NewSandboxAPI(testNode, t.TempDir(), drv, slog.New(slog.NewTextHandler(&logw, nil)))
	mux := http.NewServeMux()
	mux.Handle(warrenv1connect.NewSandboxServiceHandler(a))
	hs := httptest.NewServer(mux)
	defer hs.Close()
	c := warrenv1connect.NewSandboxServiceClient(hs.Client(), hs.URL)
	ctx := context.Background()
	read := func(p string) error {
		_, err := c.ReadFile(ctx, connect.NewRequest(&warrenv1.ReadFileRequest{SandboxId: id, Path: p}))
		return err
	}
	for _, tc := range []struct {
		name string
		err  error // the driver's
		call func() error
		code connect.Code
		want []string // in the client's message
	}{
		{"agent socket", fmt.Errorf("read /work/notes.txt: dial unix /var/lib/warren/vms/vm-7/agent.sock: %w", syscall.ECONNREFUSED),
			func() error { return read("/work/notes.txt") }, connect.CodeInternal,
			[]string{"read /work/notes.txt: dial unix …/agent.sock: connection refused"}},
		{"os error", fmt.Errorf("list: %w", &fsPathError{"/var/lib/warren/boxes/" + id + "/upper/x"}),
			func() error {
				_, err := c.ListFiles(ctx, connect.NewRequest(&warrenv1.ListFilesRequest{SandboxId: id, Path: "/x"}))
				return err
			}, connect.CodeInternal, []string{"list: open …/x: no such file or directory"}},
		{"qmp", driver.Errorf(driver.ErrUnavailable, "pause: qmp %q: %v", "/run/warren/vms/vm-7/qmp.sock", io.EOF),
			func() error {
				_, err := c.Pause(ctx, connect.NewRequest(&warrenv1.PauseRequest{SandboxId: id}))
				return err
			}, connect.CodeUnavailable, []string{`pause: qmp "…/qmp.sock": EOF`}},
		{"template dir", driver.Errorf(driver.ErrNotFound, "template %q: not in %s (have: [default])", "go", "/var/lib/warren/templates"),
			func() error {
				_, err := c.CreateSandbox(ctx, connect.NewRequest(&warrenv1.CreateSandboxRequest{Template: "go"}))
				return err
			}, connect.CodeNotFound, []string{`template "go": not in …/templates (have: [default])`}},
		{"the guest's own words", fmt.Errorf("read /work/link: %w", &guest.RemoteError{Msg: "open /opt/target/file: no such file or directory"}),
			func() error { return read("/work/link") }, connect.CodeNotFound,
			[]string{"read /work/link: guest: open /opt/target/file: no such file or directory"}},
	} {
		box.err, drv.err = tc.err, tc.err
		err := tc.call()
		if connect.CodeOf(err) != tc.code {
			t.Errorf("%s: code %v, want %v (%v)", tc.name, connect.CodeOf(err), tc.code, err)
		}
		var ce *connect.Error
		if !errors.As(err, &ce) {
			t.Fatalf("%s: %v is no connect error", tc.name, err)
		}
		msg := ce.Message()
		for _, host := range []string{"/var/lib", "/run/warren"} {
			if strings.Contains(msg, host) {
				t.Errorf("%s: the client's message names the node's path %s: %q", tc.name, host, msg)
			}
		}
		for _, w := range tc.want {
			if !strings.Contains(msg, w) {
				t.Errorf("%s: the client's message %q does not say %q", tc.name, msg, w)
			}
		}
	}
	if log := logw.String(); !strings.Contains(log, "/var/lib/warren/vms/vm-7/agent.sock") || !strings.Contains(log, "/var/lib/warren/templates") {
		t.Errorf("the node's log lost the whole errors:\n%s", log)
	}
}

// fsPathError is an *os.PathError's text without importing os for it.
type fsPathError struct{ path string }

func (e *fsPathError) Error() string { return "open " + e.path + ": no such file or directory" }

// syncBuffer is a log's destination that tests read while it is written.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (w *syncBuffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (w *syncBuffer) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}
