package guest

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A socket whose path is longer than sun_path still dials.
func TestDialLongSocketPath(t *testing.T) {
	dir := filepath.Join(t.TempDir(), strings.Repeat("d", 60), strings.Repeat("e", 60))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "agent.sock")
	old, _ := os.Getwd()
	os.Chdir(dir) // listen through a short relative path
	l, err := net.Listen("unix", "agent.sock")
	os.Chdir(old)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		c, err := l.Accept()
		if err == nil {
			c.Close()
		}
	}()
	if len(sock) < 108 {
		t.Fatalf("the path is only %d bytes", len(sock))
	}
	c, err := Dial(context.Background(), sock)
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
}
