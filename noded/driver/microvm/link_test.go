package microvm

import "testing"

func TestLinkLocalReady(t *testing.T) {
	for _, c := range []struct {
		text string
		want bool
	}{
		{"", false},
		{"fdff0077000000000000000000000002 02 7e 00 82     eth0\n", false}, // not link-local
		{"00000000000000000000000000000001 01 80 10 80       lo\n", false},
		{"fe80000000000000505400fffe770002 02 40 20 c0     eth0\n", false}, // tentative
		{"fe80000000000000505400fffe770002 02 40 20 80     eth1\n", false}, // another interface
		{"fe80000000000000505400fffe770002 02 40 20 80     eth0\n", true},
		{"fdff0077000000000000000000000002 02 7e 00 82     eth0\nfe80000000000000505400fffe770002 02 40 20 80     eth0\n", true},
		{"fe80000000000000505400fffe770002 02 40 20 zz     eth0\n", false}, // garbled
	} {
		if got, why := linkLocalReady(c.text, "eth0"); got != c.want {
			t.Errorf("linkLocalReady(%q) = %v (%s), want %v", c.text, got, why, c.want)
		}
	}
}
