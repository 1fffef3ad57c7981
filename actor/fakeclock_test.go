package actor

import (
	"context"
	"slices"
	"testing"
	"time"
)

func TestFakeClockFiresInOrder(t *testing.T) {
	fc := NewFakeClock(fakeStart)
	var fired []string
	var at []time.Duration
	add := func(name string, d time.Duration) Timer {
		return fc.AfterFunc(d, func() {
			fired = append(fired, name)
			at = append(at, fc.Now().Sub(fakeStart))
		})
	}
	add("c", 3*time.Second)
	add("a", time.Second)
	add("b1", 2*time.Second)
	add("b2", 2*time.Second) // same deadline: set order
	add("now", 0)
	stopped := add("stopped", time.Second)
	// A callback may arm a timer that falls due within the same Advance.
	fc.AfterFunc(time.Second, func() { add("chained", time.Second) })
	if !stopped.Stop() || stopped.Stop() {
		t.Fatal("Stop should succeed once")
	}
	if n := fc.Pending(); n != 6 {
		t.Fatalf("Pending = %d, want 6", n)
	}
	fc.Advance(0)
	if !slices.Equal(fired, []string{"now"}) {
		t.Fatalf("Advance(0) fired %v", fired)
	}
	fc.Advance(3 * time.Second)
	want := []string{"now", "a", "b1", "b2", "chained", "c"}
	if !slices.Equal(fired, want) {
		t.Fatalf("fired %v, want %v", fired, want)
	}
	wantAt := []time.Duration{0, time.Second, 2 * time.Second, 2 * time.Second, 2 * time.Second, 3 * time.Second}
	if !slices.Equal(at, wantAt) {
		t.Fatalf("fired at %v, want %v", at, wantAt)
	}
	if got := fc.Now().Sub(fakeStart); got != 3*time.Second {
		t.Fatalf("Now = start+%v, want start+3s", got)
	}
	if fc.Pending() != 0 {
		t.Fatalf("Pending = %d after all fired", fc.Pending())
	}
}

func TestFakeClockWaitForTimers(t *testing.T) {
	fc := NewFakeClock(fakeStart)
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	armed := make(chan struct{})
	go func() {
		fc.AfterFunc(time.Second, func() {})
		fc.AfterFunc(time.Second, func() { close(armed) })
	}()
	if err := fc.WaitForTimers(ctx, 2); err != nil {
		t.Fatal(err)
	}
	fc.Advance(time.Second)
	<-armed
	short, cancelShort := context.WithCancel(ctx)
	cancelShort()
	if err := fc.WaitForTimers(short, 1); err == nil {
		t.Fatal("WaitForTimers returned nil with no timers and a cancelled ctx")
	}
}

func TestBackoffDelay(t *testing.T) {
	for _, tc := range []struct {
		b       Backoff
		attempt int
		want    time.Duration
	}{
		{Backoff{}, 1, 0},
		{Backoff{Min: time.Second}, 1, time.Second},
		{Backoff{Min: time.Second}, 4, 8 * time.Second},
		{Backoff{Min: time.Second, Max: 5 * time.Second}, 3, 4 * time.Second},
		{Backoff{Min: time.Second, Max: 5 * time.Second}, 4, 5 * time.Second},
		{Backoff{Min: time.Second, Max: 5 * time.Second}, 1000, 5 * time.Second},
	} {
		if got := tc.b.Delay(tc.attempt); got != tc.want {
			t.Errorf("%+v attempt %d: %v, want %v", tc.b, tc.attempt, got, tc.want)
		}
	}
	if got := (Backoff{Min: time.Second}).Delay(1000); got < time.Second {
		t.Errorf("uncapped backoff overflowed to %v", got)
	}
}

// A context derived from a fake-clock WithTimeout before its deadline
// reports DeadlineExceeded once the clock passes it, as with the real
// clock. (It reported Canceled: the derived context saw the one inside
// the wrapper WithTimeout returned.) A cancel or a parent's end comes
// through as Canceled.
func TestWithTimeoutOnAFakeClockEndsItsChildren(t *testing.T) {
	fc := NewFakeClock(fakeStart)
	ctx, cancel := WithTimeout(context.Background(), fc, time.Second)
	defer cancel()
	child, cancelChild := context.WithCancel(ctx)
	defer cancelChild()
	fc.Advance(time.Second)
	<-child.Done()
	if ctx.Err() != context.DeadlineExceeded || child.Err() != context.DeadlineExceeded {
		t.Fatalf("after the deadline: Err %v, child's %v; want DeadlineExceeded for both", ctx.Err(), child.Err())
	}
	parent, endParent := context.WithCancel(context.Background())
	ctx2, cancel2 := WithTimeout(parent, fc, time.Hour)
	defer cancel2()
	endParent()
	<-ctx2.Done()
	if ctx2.Err() != context.Canceled {
		t.Fatalf("after the parent's end: %v, want Canceled", ctx2.Err())
	}
	ctx3, cancel3 := WithTimeout(context.Background(), fc, time.Hour)
	cancel3()
	if ctx3.Err() != context.Canceled {
		t.Fatalf("after cancel: %v, want Canceled", ctx3.Err())
	}
}
