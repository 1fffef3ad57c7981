package guest

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/hashicorp/yamux"
)

// A call ends at its deadline when the guest has stopped taking what the
// host sends (its agent stopped, its kernel hung: QEMU no longer drains
// the port), not when yamux's send gives up a minute later. Before, a
// Ping with a 100 ms deadline returned after 60 s or more.
func TestCallEndsAtDeadlineWhenGuestStopsReading(t *testing.T) {
	a, b := net.Pipe() // b is never read: every write of the host waits
	c, err := NewClient(a)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	defer c.Close()
	for _, call := range []struct {
		name string
		do   func(ctx context.Context) error
	}{
		{"ping", func(ctx context.Context) error { _, err := c.Ping(ctx); return err }},
		{"stat", func(ctx context.Context) error { _, err := c.Stat(ctx, "/x"); return err }},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		done := make(chan error, 1)
		start := time.Now()
		go func() { done <- call.do(ctx) }()
		select {
		case err := <-done:
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("%s: %v, want the deadline", call.name, err)
			}
			if d := time.Since(start); d > 2*time.Second {
				t.Errorf("%s: took %v", call.name, d)
			}
		case <-time.After(5 * time.Second):
			cancel()
			c.Close()
			b.Close()
			<-done
			t.Fatalf("%s: still waiting 5 s after a deadline of 100 ms", call.name)
		}
		cancel()
	}
}

// A write whose guest answers success before it has the data, while the
// caller's reader waits, ends at the call's deadline. Before, it waited
// for the reader, past the deadline.
func TestWriteFileEndsAtDeadlineWhenTheGuestAnswersEarly(t *testing.T) {
	c := hostileGuest(t, func(st *yamux.Stream) {
		defer st.Close()
		if _, _, err := readFrame(st); err != nil {
			return
		}
		_ = writeJSON(st, frameResult, &Result{File: &FileInfo{Name: "/f", Size: 1}})
	})
	r, w := io.Pipe() // nothing is written: the sender waits in a Read
	defer w.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := c.WriteFile(ctx, "/f", nil, r)
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("a write the guest never had succeeded")
		}
	case <-time.After(5 * time.Second):
		w.Close()
		<-done
		t.Fatal("still waiting 5 s after a deadline of 200 ms")
	}
}
