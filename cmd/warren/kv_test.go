package main

import (
	"math"
	"reflect"
	"strings"
	"testing"
	"time"
)

// --labels and --node-selector (and warren node --labels) refuse a key
// given twice, which kept only the last value, and an empty key, naming
// the flag.
func TestParseKV(t *testing.T) {
	for _, c := range []struct {
		in   string
		want map[string]string
		err  string
	}{
		{"", nil, ""},
		{"team=a, zone=z1 ,", map[string]string{"team": "a", "zone": "z1"}, ""},
		{"team=a,team=b", nil, `labels: key "team" given twice (team=a and team=b)`},
		{"=x", nil, `labels: "=x" is not k=v`},
		{"team", nil, `labels: "team" is not k=v`},
		{"k=a=b", map[string]string{"k": "a=b"}, ""},
	} {
		for _, parse := range []func(string) (map[string]string, error){parseLabels, func(s string) (map[string]string, error) { return parseKV("labels", s) }} {
			got, err := parse(c.in)
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Errorf("%q: %v, want %q", c.in, err, c.err)
				}
				continue
			}
			if err != nil || !reflect.DeepEqual(got, c.want) {
				t.Errorf("%q: %v %v, want %v", c.in, got, err, c.want)
			}
		}
	}
}

// Durations go to the API in whole seconds, rounded up, and the largest
// one does not wrap negative (--deadline 2562047h47m16.854775807s was
// sent as -9223372035).
func TestCeilSeconds(t *testing.T) {
	for _, c := range []struct {
		d    time.Duration
		want int64
	}{{0, 0}, {time.Nanosecond, 1}, {time.Second, 1}, {1500 * time.Millisecond, 2}, {math.MaxInt64, math.MaxInt64/int64(time.Second) + 1}} {
		if got := ceilSeconds(c.d); got != c.want {
			t.Errorf("ceilSeconds(%v) = %d, want %d", c.d, got, c.want)
		}
	}
}
