package noded

import (
	"errors"
	"testing"
	"time"
)

// A finish round's tries wait 2 s doubling to a minute: eight tries span
// about three minutes, where five spanned 20 s and a forge's minute-long
// rate limit failed the task.
func TestPublishBackoff(t *testing.T) {
	var total time.Duration
	for tries, want := range map[int]time.Duration{1: 2 * time.Second, 2: 4 * time.Second, 3: 8 * time.Second, 5: 32 * time.Second, 6: time.Minute, 40: time.Minute} {
		if got := publishBackoff(tries, errors.New("connection refused")); got != want {
			t.Errorf("publishBackoff(%d) = %v, want %v", tries, got, want)
		}
	}
	for tries := 1; tries < maxPublishTries; tries++ {
		total += publishBackoff(tries, errors.New("x"))
	}
	if total < 2*time.Minute {
		t.Errorf("a round's tries span %v; want over two minutes, a forge's rate limit outlasting none", total)
	}
}
