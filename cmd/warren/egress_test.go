package main

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
)

func TestParseNodeAddrs(t *testing.T) {
	got, err := parseNodeAddrs(" 198.51.100.7, 2001:db8::7,::ffff:203.0.113.9 ,")
	if err != nil {
		t.Fatal(err)
	}
	want := []netip.Addr{netip.MustParseAddr("198.51.100.7"), netip.MustParseAddr("2001:db8::7"), netip.MustParseAddr("203.0.113.9")}
	if !slices.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	if got, err := parseNodeAddrs(""); err != nil || got != nil {
		t.Fatalf("empty: %v, %v", got, err)
	}
	for _, bad := range []string{"198.51.100.0/24", "node.example", "fe80::1%eth0", "300.1.1.1"} {
		_, err := parseNodeAddrs("198.51.100.7," + bad)
		if err == nil || !strings.Contains(err.Error(), "egress-node-addrs") || !strings.Contains(err.Error(), bad) {
			t.Errorf("%q: %v; want an error naming the flag and the value", bad, err)
		}
	}
}
