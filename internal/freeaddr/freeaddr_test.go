package freeaddr

import "testing"

func TestLoopbackNeverRepeats(t *testing.T) {
	seen := map[string]bool{}
	for range 2000 {
		a := Loopback(t)
		if seen[a] {
			t.Fatalf("%s handed out twice", a)
		}
		seen[a] = true
	}
}
