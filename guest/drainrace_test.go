//go:build linux

package guest

import (
	"bytes"
	"os"
	"runtime"
	"sync"
	"syscall"
	"testing"
	"time"
)

// A copy whose read was waiting when the command's last output came and
// took it only after the exit was marked still stops at the exit: it
// counted those bytes, so it does not wait for more that will never come
// while a child that left the group holds the pipe. Before, the exit's
// count of what was left went unspent and the copy waited for the child.
func TestDrainStopsWhenALateReadTookTheLastOutput(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	for round := 0; round < 20; round++ {
		var pipes, writes [2]*os.File
		for i := range pipes {
			r, w, err := os.Pipe()
			if err != nil {
				t.Fatal(err)
			}
			pipes[i], writes[i] = r, w
		}
		// The stray: a copy of each write end that outlives the command.
		var strays [2]int
		for i, w := range writes {
			fd, err := syscall.Dup(int(w.Fd()))
			if err != nil {
				t.Fatal(err)
			}
			strays[i] = fd
		}
		var mu sync.Mutex
		var out bytes.Buffer
		d := drainOutput(pipes, [2]streamWriter{{&mu, &out, frameStdout}, {&mu, &out, frameStderr}})
		time.Sleep(20 * time.Millisecond) // both copies wait in a read
		// The last output and the exit, with nothing between them that
		// lets the waiting copy run.
		writes[0].Write([]byte("done\n"))
		d.exited()
		writes[0].Close()
		writes[1].Close()
		done := make(chan struct{})
		go func() { d.wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(2 * time.Second):
			syscall.Close(strays[0])
			syscall.Close(strays[1])
			<-done
			t.Fatalf("round %d: the copies waited for the stray's pipe to close", round)
		}
		syscall.Close(strays[0])
		syscall.Close(strays[1])
		if !bytes.Contains(out.Bytes(), []byte("done\n")) {
			t.Fatalf("round %d: output %q lost the last write", round, out.Bytes())
		}
	}
}
