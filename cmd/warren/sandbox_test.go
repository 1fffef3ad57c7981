package main

import (
	"testing"
	"time"
)

// A command timeout under a millisecond is sent as 1 ms, not as 0 (no
// limit).
func TestCeilMS(t *testing.T) {
	for _, tc := range []struct {
		d    time.Duration
		want int64
	}{
		{0, 0}, {time.Nanosecond, 1}, {500 * time.Microsecond, 1}, {time.Millisecond, 1},
		{time.Millisecond + 1, 2}, {90 * time.Second, 90000},
	} {
		if got := ceilMS(tc.d); got != tc.want {
			t.Errorf("ceilMS(%v) = %d, want %d", tc.d, got, tc.want)
		}
	}
}
