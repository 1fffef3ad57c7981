package api

import (
	"net/http"
	"testing"
	"time"
)

// A Retry-After too large for a Duration is a long wait (the gateway caps
// it at 10 minutes), not a negative one (which the gateway reads as "none"
// and retries at once with its own short backoff).
func TestRetryAfterHugeIsLong(t *testing.T) {
	for _, v := range []string{"1e300", "Inf", "99999999999"} {
		h := http.Header{}
		h.Set("Retry-After", v)
		if d := RetryAfter(h, time.Now()); d < time.Hour {
			t.Errorf("Retry-After: %s gives %v", v, d)
		}
		h = http.Header{}
		h.Set("retry-after-ms", v)
		if d := RetryAfter(h, time.Now()); d < time.Hour {
			t.Errorf("retry-after-ms: %s gives %v", v, d)
		}
	}
}
