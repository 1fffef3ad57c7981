package api

import (
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// RetryAfter is the wait a server's answer asks for: its Retry-After
// (seconds or an HTTP date, past dates none) or the model vendors'
// retry-after-ms; 0 when it asks for none. Model providers and forge
// adapters read it alike.
func RetryAfter(h http.Header, now time.Time) time.Duration {
	if ms := h.Get("retry-after-ms"); ms != "" {
		if v, err := strconv.ParseFloat(ms, 64); err == nil && v >= 0 {
			return waitOf(v, time.Millisecond)
		}
	}
	v := strings.TrimSpace(h.Get("Retry-After"))
	if v == "" {
		return 0
	}
	if s, err := strconv.ParseFloat(v, 64); err == nil && s >= 0 {
		return waitOf(s, time.Second)
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return t.Sub(now)
	}
	return 0
}

// waitOf is n units as a Duration; one too long for a Duration (1e300,
// +Inf) is the longest, not a negative one, which would read as none.
func waitOf(n float64, unit time.Duration) time.Duration {
	if d := n * float64(unit); d < float64(math.MaxInt64) {
		return time.Duration(d)
	}
	return math.MaxInt64
}
