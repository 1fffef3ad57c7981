package gossip

import (
	"errors"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	"go.uber.org/goleak"

	"github.com/warrenhq/warren/internal/freeaddr"
)

// TestMain checks that Close and Kill stop every goroutine of a member.
// memberlist's Shutdown does not wait for a probe in flight (nor its TCP
// fallback ping): it ends when its ack timer fires, up to eight probe
// intervals later, after goleak has stopped retrying. A member never shut
// down still shows in its listeners and timers.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreAnyFunction("github.com/hashicorp/memberlist.(*Memberlist).probeNode"),
		goleak.IgnoreAnyFunction("github.com/hashicorp/memberlist.(*Memberlist).probeNode.func1"))
}

// waitFor polls cond until it holds or d has passed. memberlist runs on
// real time, so there is no clock to advance.
func waitFor(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
	return true
}

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

// cutTransport drops everything a member sends or receives while cut.
type cutTransport struct {
	memberlist.Transport
	cut     *atomic.Bool
	packets chan *memberlist.Packet
	streams chan net.Conn
	quit    chan struct{} // closed by Shutdown: the forwarders return
}

func newCut(tr memberlist.Transport, cut *atomic.Bool) cutTransport {
	c := cutTransport{Transport: tr, cut: cut, packets: make(chan *memberlist.Packet),
		streams: make(chan net.Conn), quit: make(chan struct{})}
	go func() {
		for {
			select {
			case p := <-tr.PacketCh():
				if cut.Load() {
					continue
				}
				select {
				case c.packets <- p:
				case <-c.quit:
					return
				}
			case <-c.quit:
				return
			}
		}
	}()
	go func() {
		for {
			select {
			case s := <-tr.StreamCh():
				if cut.Load() {
					s.Close()
					continue
				}
				select {
				case c.streams <- s:
				case <-c.quit:
					s.Close()
					return
				}
			case <-c.quit:
				return
			}
		}
	}()
	return c
}

func (c cutTransport) PacketCh() <-chan *memberlist.Packet { return c.packets }
func (c cutTransport) StreamCh() <-chan net.Conn           { return c.streams }

func (c cutTransport) WriteTo(b []byte, addr string) (time.Time, error) {
	if c.cut.Load() {
		return time.Now(), nil
	}
	return c.Transport.WriteTo(b, addr)
}

func (c cutTransport) DialTimeout(addr string, d time.Duration) (net.Conn, error) {
	if c.cut.Load() {
		return nil, errors.New("partitioned")
	}
	return c.Transport.DialTimeout(addr, d)
}

func (c cutTransport) Shutdown() error {
	err := c.Transport.Shutdown()
	close(c.quit)
	return err
}

// TestMembersMergeAfterPartitionHeals: a node is cut off long enough for
// both sides to declare each other dead and for memberlist to stop
// gossiping to the dead (a switch reboot, a firewall change). Once the
// network heals, the node's rejoin loop merges the two views again:
// memberlist alone never would, as it probes and push-pulls only members
// it believes alive.
func TestMembersMergeAfterPartitionHeals(t *testing.T) {
	defer func(d time.Duration) { rejoinEvery = d }(rejoinEvery)
	rejoinEvery = 200 * time.Millisecond
	first := freeaddr.Loopback(t)
	s, err := Start(Config{Role: RoleServer, ID: "s1", Addr: first})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var cut atomic.Bool
	n, err := Start(Config{Role: RoleNode, ID: "n1", Addr: freeaddr.Loopback(t), Join: []string{first},
		Wrap: func(tr memberlist.Transport) memberlist.Transport { return newCut(tr, &cut) }})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	sees := func(m *Member, name string, alive bool) func() bool {
		return func() bool { return slices.Contains(m.Members(), name) == alive }
	}
	if !waitFor(10*time.Second, sees(s, "node:n1", true)) {
		t.Fatalf("never joined: %v", s.Members())
	}
	cut.Store(true)
	if !waitFor(10*time.Second, sees(s, "node:n1", false)) || !waitFor(10*time.Second, sees(n, "server:s1", false)) {
		t.Fatalf("partition not noticed (server sees %v, node sees %v)", s.Members(), n.Members())
	}
	// Stay cut until memberlist has stopped gossiping to the dead: a timer
	// inside memberlist, not a condition this test can watch.
	time.Sleep(LANConfig().GossipToTheDeadTime + time.Second)
	cut.Store(false)
	if !waitFor(10*time.Second, func() bool { return sees(s, "node:n1", true)() && sees(n, "server:s1", true)() }) {
		t.Fatalf("10 s after the partition healed: server sees %v, node sees %v", s.Members(), n.Members())
	}
}

// TestSlowOnChangeDoesNotStallMemberlist: OnChange runs off memberlist's
// locks, so a callback that blocks holds up later callbacks only, not
// joins or Members.
func TestSlowOnChangeDoesNotStallMemberlist(t *testing.T) {
	release := make(chan struct{})
	var mu sync.Mutex
	var seen []string
	onChange := func(role, id string, alive bool) {
		<-release
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, Name(role, id))
	}
	first := freeaddr.Loopback(t)
	joined := make(chan []*Member, 1)
	go func() {
		s, err := Start(Config{Role: RoleServer, ID: "s1", Addr: first, OnChange: onChange})
		if err != nil {
			t.Error(err)
			joined <- nil
			return
		}
		n, err := Start(Config{Role: RoleNode, ID: "n1", Addr: freeaddr.Loopback(t), Join: []string{first}, OnChange: onChange})
		if err != nil {
			t.Error(err)
			joined <- []*Member{s}
			return
		}
		waitFor(10*time.Second, func() bool { return len(s.Members()) == 2 && len(n.Members()) == 2 })
		joined <- []*Member{s, n}
	}()
	var members []*Member
	select {
	case members = <-joined:
	case <-time.After(15 * time.Second):
		t.Fatal("memberlist stalled behind a blocked OnChange")
	}
	close(release)
	for _, m := range members {
		defer m.Close()
	}
	if len(members) != 2 || len(members[0].Members()) != 2 {
		t.Fatal("members did not join while OnChange was blocked")
	}
	if !waitFor(5*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return slices.Contains(seen, "node:n1") && slices.Contains(seen, "server:s1")
	}) {
		mu.Lock()
		defer mu.Unlock()
		t.Fatalf("OnChange saw %v after release, want node:n1 and server:s1", seen)
	}
}

// TestQueueKeepsLatestStatePerMember: changes wait in arrival order, a
// member already waiting has its state replaced rather than queued twice,
// and put never blocks however many wake-ups nobody has taken.
func TestQueueKeepsLatestStatePerMember(t *testing.T) {
	q := newQueue()
	q.put(change{name: "node:a", alive: false})
	q.put(change{name: "node:b", alive: true})
	q.put(change{name: "node:a", alive: true})
	got := q.take()
	want := []change{{name: "node:a", alive: true}, {name: "node:b", alive: true}}
	if !slices.Equal(got, want) {
		t.Fatalf("take = %v, want %v", got, want)
	}
	if got := q.take(); len(got) != 0 {
		t.Fatalf("second take = %v, want nothing", got)
	}
	q.put(change{name: "node:a", alive: false})
	if got := q.take(); !slices.Equal(got, []change{{name: "node:a", alive: false}}) {
		t.Fatalf("take after emptying = %v", got)
	}
}

// TestCloseAndKillAreIdempotent: a second Close, or Close after Kill,
// does nothing and returns nil (it used to close a closed channel).
func TestCloseAndKillAreIdempotent(t *testing.T) {
	for _, tc := range []struct {
		name          string
		first, second func(*Member) error
	}{
		{"close twice", (*Member).Close, (*Member).Close},
		{"kill then close", (*Member).Kill, (*Member).Close},
		{"close then kill", (*Member).Close, (*Member).Kill},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := Start(Config{Role: RoleNode, ID: "n1", Addr: freeaddr.Loopback(t),
				Join: []string{freeaddr.Loopback(t)}, OnChange: func(string, string, bool) {}})
			if err != nil {
				t.Fatal(err)
			}
			if err := tc.first(m); err != nil {
				t.Fatal(err)
			}
			if err := tc.second(m); err != nil {
				t.Fatalf("second call: %v", err)
			}
		})
	}
}
