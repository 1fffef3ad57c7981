package api

import (
	"fmt"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// Limits of the sandbox API, the same on the servers (which check them
// before forwarding a call to the sandbox's node) and on the nodes.
const (
	MaxSandboxFileBytes  = 32 << 20 // ReadFile and WriteFile carry a whole file
	MaxSandboxStdinBytes = 8 << 20  // an Exec's stdin, sent whole
	// MaxSandboxRequestBytes is the largest sandbox request a node reads.
	MaxSandboxRequestBytes = 2 * MaxSandboxFileBytes
)

// CheckSandboxRequestSize reports a request over MaxSandboxRequestBytes,
// naming its largest field: a node refuses such a message whole, and the
// RPC library's error names no field.
func CheckSandboxRequestSize(m proto.Message) error {
	size := proto.Size(m)
	if size <= MaxSandboxRequestBytes {
		return nil
	}
	var name string
	var largest int
	r := m.ProtoReflect()
	r.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		one := r.New()
		one.Set(fd, v)
		if n := proto.Size(one.Interface()); n > largest {
			name, largest = string(fd.Name()), n
		}
		return true
	})
	return fmt.Errorf("%s: %d bytes, over the limit of %d for a whole sandbox request (%d bytes)", name, largest, MaxSandboxRequestBytes, size)
}
