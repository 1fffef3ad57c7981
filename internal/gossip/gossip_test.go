package gossip

import (
	"sync"
	"testing"
	"time"

	"github.com/warrenhq/warren/internal/freeaddr"
)

// TestDeadMemberDetected starts four members, kills one without leaving
// (a crash), and reports how long the others took to declare it dead.
func TestDeadMemberDetected(t *testing.T) {
	var mu sync.Mutex
	deadAt := map[string]time.Time{}
	watch := func(role, id string, alive bool) {
		if !alive {
			mu.Lock()
			if _, ok := deadAt[id]; !ok {
				deadAt[id] = time.Now()
			}
			mu.Unlock()
		}
	}
	first := freeaddr.Loopback(t)
	var members []*Member
	for i, id := range []string{"s1", "s2", "n1", "n2"} {
		role := RoleServer
		if id[0] == 'n' {
			role = RoleNode
		}
		addr := first
		if i > 0 {
			addr = freeaddr.Loopback(t)
		}
		m, err := Start(Config{Role: role, ID: id, Addr: addr, Join: []string{first}, OnChange: watch})
		if err != nil {
			t.Fatal(err)
		}
		members = append(members, m)
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(members[0].Members()) != 4 {
		if time.Now().After(deadline) {
			t.Fatalf("members: %v", members[0].Members())
		}
		time.Sleep(20 * time.Millisecond)
	}
	killed := time.Now()
	if err := members[3].Kill(); err != nil {
		t.Fatal(err)
	}
	for {
		mu.Lock()
		at, ok := deadAt["n2"]
		mu.Unlock()
		if ok {
			t.Logf("crashed member declared dead after %v", at.Sub(killed).Round(time.Millisecond))
			break
		}
		if time.Since(killed) > 15*time.Second {
			t.Fatal("crashed member never declared dead")
		}
		time.Sleep(10 * time.Millisecond)
	}
	for _, m := range members[:3] {
		if err := m.Close(); err != nil {
			t.Error(err)
		}
	}
}

// TestFleetMemberStandsForItsNodes: a fleet member's death is reported
// as the death of each node it hosts.
func TestFleetMemberStandsForItsNodes(t *testing.T) {
	var mu sync.Mutex
	dead := map[string]bool{}
	first := freeaddr.Loopback(t)
	s, err := Start(Config{Role: RoleServer, ID: "s1", Addr: first, OnChange: func(role, id string, alive bool) {
		mu.Lock()
		defer mu.Unlock()
		if role == RoleNode && !alive {
			dead[id] = true
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	f, err := Start(Config{Role: RoleFleet, ID: "h1", Count: 3, Addr: freeaddr.Loopback(t), Join: []string{first}, Fleet: true})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(s.Members()) != 2 {
		if time.Now().After(deadline) {
			t.Fatalf("members: %v", s.Members())
		}
		time.Sleep(20 * time.Millisecond)
	}
	f.Kill()
	for {
		mu.Lock()
		n := len(dead)
		mu.Unlock()
		if n == 3 {
			break
		}
		if time.Now().After(deadline.Add(20 * time.Second)) {
			t.Fatalf("dead nodes: %v, want h1-0001..h1-0003", dead)
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, id := range []string{"h1-0001", "h1-0002", "h1-0003"} {
		if !dead[id] {
			t.Fatalf("dead nodes: %v, missing %s", dead, id)
		}
	}
}
