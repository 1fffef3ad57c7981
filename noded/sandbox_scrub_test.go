package noded

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"connectrpc.com/connect"

	"github.com/warrenhq/warren/noded/driver"
)

// A QEMU that fails to start is a claim's error with qemu.log's tail
// (microvm vm.go: "qemu exited: %s"), and QEMU names the option it failed
// on: "-qmp unix:/…/qmp.sock,server=on,wait=off: Failed to bind socket".
// The path after "unix:" is the node's state directory and QMP socket,
// which a client never sees (docs/sandboxes.md, "The API").
func TestQEMUsOptionPathsLeaveOutTheNodesPaths(t *testing.T) {
	qemuLog := "qemu-system-x86_64: -qmp unix:/var/lib/warren/vms/vm-7/qmp.sock,server=on,wait=off: Failed to bind socket: Address already in use"
	err := driver.Errorf(driver.ErrUnavailable, "start qemu: qemu exited: %s", qemuLog)
	var ce *connect.Error
	if !errors.As(error(codeOf(err)), &ce) {
		t.Fatal("no connect error")
	}
	if msg := ce.Message(); strings.Contains(msg, "/var/lib/warren") {
		t.Errorf("the client's message names the node's state directory: %q", msg)
	}
}

// docs/sandboxes.md: "Paths in the sandbox are the client's and kept: the
// ones the call named", also when they hold a space, ':' or ',' (legal in
// a guest path: guest.CheckPath refuses only "", NUL, relative and ".."),
// where hostPath's match would end.
func TestClientNamedPathsWithASpaceAreKept(t *testing.T) {
	for _, p := range []string{"/work/my notes.txt", "/work/a:b.txt", "/work/x,y.txt"} {
		err := fmt.Errorf("guest: read %s: the guest sent more than the %d bytes asked for", p, MaxFileBytes)
		var ce *connect.Error
		if !errors.As(error(codeOf(err, p)), &ce) {
			t.Fatal("no connect error")
		}
		if msg := ce.Message(); !strings.Contains(msg, p) {
			t.Errorf("the path the call named, %q, is not in the client's message %q", p, msg)
		}
	}
}
