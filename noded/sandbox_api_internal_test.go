package noded

import (
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/warrenhq/warren/guest"
)

// A file whose name is not UTF-8 (any byte string is a Linux name) is
// listed with U+FFFD for its bad bytes: a proto3 string must be UTF-8,
// and such a name made the whole listing fail to marshal.
func TestFileNamesThatAreNotUTF8AreListed(t *testing.T) {
	p := fileProto(guest.FileInfo{Name: "caf\xe9.txt", Size: 3})
	if p.GetName() != "caf\uFFFD.txt" {
		t.Errorf("name %q", p.GetName())
	}
	if _, err := proto.Marshal(p); err != nil {
		t.Errorf("marshal: %v", err)
	}
}
