package noded

import (
	"bytes"
	"context"
	"io"
	"runtime"
	"testing"

	"github.com/warrenhq/warren/guest"
	"github.com/warrenhq/warren/noded/driver"
)

// noisyBox is a sandbox whose commands print endless stderr and fail: the
// sandbox's code replaced mkdir or tar (they run as root), or the guest
// agent itself is hostile.
type noisyBox struct {
	driver.Interactive // nil: only Run is called
	stderrBytes        int
}

func (b noisyBox) Run(ctx context.Context, req guest.ExecRequest, stdout, stderr io.Writer) (guest.ExecResult, error) {
	if req.Stdin != nil {
		io.Copy(io.Discard, req.Stdin)
	}
	chunk := bytes.Repeat([]byte("y\n"), 512<<10) // 1 MiB
	for n := 0; n < b.stderrBytes; n += len(chunk) {
		if _, err := stderr.Write(chunk); err != nil {
			return guest.ExecResult{}, err
		}
	}
	return guest.ExecResult{ExitCode: 1}, nil
}

// What the node's own commands in a sandbox print is bounded: a write's
// mkdir and the checkout's unpack kept their whole stderr, so a sandbox
// that printed without end grew the node's memory until it was killed,
// and the whole of it went into the error (and the model's tool result).
func TestTheNodesOwnCommandsKeepLittleOfTheirOutput(t *testing.T) {
	const printed = 64 << 20
	box := noisyBox{stderrBytes: printed}
	for _, tc := range []struct {
		name string
		call func() error
	}{
		{"write_file's mkdir", func() error {
			return agentSandbox{box}.WriteFile(context.Background(), "/work/repo/a/b.txt", []byte("x"))
		}},
		{"the checkout's unpack", func() error {
			return unpackTar(context.Background(), box, []byte("not a tar"))
		}},
	} {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		err := tc.call()
		runtime.ReadMemStats(&after)
		if err == nil {
			t.Fatalf("%s: no error from a command that exited 1", tc.name)
		}
		if len(err.Error()) > 64<<10 {
			t.Errorf("%s: a %d-byte error for %d bytes of stderr", tc.name, len(err.Error()), printed)
		}
		if grew := after.TotalAlloc - before.TotalAlloc; grew > printed/2 {
			t.Errorf("%s: the node allocated %d MiB for %d MiB of stderr", tc.name, grew>>20, printed>>20)
		}
	}
}
