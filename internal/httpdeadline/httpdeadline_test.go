package httpdeadline

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// A large write goes to a client that reads slowly but steadily, though
// the whole takes longer than the deadline: each piece has a deadline of
// its own. One deadline for the whole write cut off a 32 MiB file's
// answer to any client slower than about 1 MB/s.
func TestALargeWriteToASlowReader(t *testing.T) {
	const size = 16 << 20
	wrote := make(chan error, 1)
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, err := NewWriter(w, time.Second).Write(make([]byte, size))
		wrote <- err
	}))
	defer hs.Close()
	conn, err := net.Dial("tcp", strings.TrimPrefix(hs.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.(*net.TCPConn).SetReadBuffer(64 << 10)
	if _, err := fmt.Fprintf(conn, "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	// About 6 MB/s at most: 16 MiB take 2.6 s or more, a piece 160 ms.
	start := time.Now()
	buf := make([]byte, 64<<10)
	total := 0
	for {
		n, err := conn.Read(buf)
		total += n
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := <-wrote; err != nil {
		t.Fatalf("the write to a client reading %d bytes in %v: %v", total, time.Since(start), err)
	}
	if total < size {
		t.Fatalf("the client read %d bytes, want over %d", total, size)
	}
}
