package noded

import (
	"context"
	"io"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/api/apitest"
	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
	"github.com/warrenhq/warren/api/gen/warren/v1/warrenv1connect"
	"github.com/warrenhq/warren/guest"
	"github.com/warrenhq/warren/noded/driver"
)

// ReadFile, WriteFile, ListFiles and an Exec with stdin each take their
// bytes from the node's gate before they touch the sandbox: with the gate
// held, each is refused with resource_exhausted after the gate's wait, and
// each runs once the gate is free. Without it, 100 concurrent ReadFiles of
// a 32 MiB file (70-byte requests) held several GB on the node, and so did
// 50 ListFiles that a taken-over guest answered with the most entries the
// node takes.
func TestFileCallsWaitForTheBulkGate(t *testing.T) {
	id := api.NewSandboxID(testNode)
	box := newAgentBox(t, id)
	a := NewSandboxAPI(testNode, t.TempDir(), &listDriver{name: "microvm", live: map[string]driver.Sandbox{id: box}}, nil)
	a.bulk = api.NewBulkGate(api.MaxSandboxFileBytes, 300*time.Millisecond)
	hs := httptest.NewServer(sandboxHandler(a))
	t.Cleanup(hs.Close)
	c := warrenv1connect.NewSandboxServiceClient(hs.Client(), hs.URL)
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "f")
	calls := map[string]func() error{
		"write_file": func() error {
			_, err := c.WriteFile(ctx, connect.NewRequest(&warrenv1.WriteFileRequest{SandboxId: id, Path: path, Data: []byte("hello")}))
			return err
		},
		"read_file": func() error {
			_, err := c.ReadFile(ctx, connect.NewRequest(&warrenv1.ReadFileRequest{SandboxId: id, Path: path}))
			return err
		},
		"list_files": func() error {
			_, err := c.ListFiles(ctx, connect.NewRequest(&warrenv1.ListFilesRequest{SandboxId: id, Path: filepath.Dir(path)}))
			return err
		},
		"stdin": func() error {
			s, err := c.Exec(ctx, connect.NewRequest(&warrenv1.ExecRequest{SandboxId: id, Command: []string{"cat"}, Stdin: []byte("x")}))
			if err != nil {
				return err
			}
			defer s.Close()
			for s.Receive() {
			}
			return s.Err()
		},
	}
	order := []string{"write_file", "read_file", "list_files", "stdin"}
	release, err := a.bulk.Take(ctx, "test", api.MaxSandboxFileBytes)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range order {
		if err := calls[name](); connect.CodeOf(err) != connect.CodeResourceExhausted {
			t.Errorf("%s with the gate held: %v, want resource_exhausted", name, err)
		}
	}
	release()
	for _, name := range order {
		if err := calls[name](); err != nil {
			t.Errorf("%s with the gate free: %v", name, err)
		}
	}
}

// bigFileBox is a sandbox whose every file holds size zero bytes.
type bigFileBox struct {
	driver.Interactive // nil: only ID and ReadFile are called
	id                 string
	size               int
}

func (b *bigFileBox) ID() string { return b.id }

func (b *bigFileBox) ReadFile(ctx context.Context, path string, limit int64, w io.Writer) (guest.FileInfo, error) {
	if _, err := w.Write(make([]byte, b.size)); err != nil {
		return guest.FileInfo{}, err
	}
	return guest.FileInfo{Name: filepath.Base(path), Size: int64(b.size), Mode: 0o644}, nil
}

// A ReadFile holds its room in the gate until its answer is written, and
// a client that reads nothing holds it only until a write of the answer
// times out. The room was given back when the handler returned, before
// connect-go marshaled and wrote the answer, with no deadline on the
// write: each call whose client read nothing kept its 32 MiB, and the
// marshaled copy, for as long as the connection stayed open, while the
// gate let more in.
func TestAFileAnswerHoldsItsRoomUntilSent(t *testing.T) {
	old := sandboxWriteTimeout
	sandboxWriteTimeout = 2 * time.Second
	defer func() { sandboxWriteTimeout = old }()
	id := api.NewSandboxID(testNode)
	box := &bigFileBox{id: id, size: 16 << 20}
	a := NewSandboxAPI(testNode, t.TempDir(), &listDriver{name: "microvm", live: map[string]driver.Sandbox{id: box}}, nil)
	a.bulk = api.NewBulkGate(api.MaxSandboxFileBytes, 300*time.Millisecond)
	hs := httptest.NewServer(sandboxHandler(a))
	defer hs.Close()
	apitest.FileAnswerHoldsItsRoom(t, hs.Client(), hs.URL, id, box.size)
}
