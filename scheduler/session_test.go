package scheduler

import (
	"testing"
	"time"
)

func TestLivenessVerdict(t *testing.T) {
	ttl := 3 * time.Second
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	h := newSessions()
	if _, down := h.verdict("n1", t0.Add(time.Hour), ttl); down {
		t.Fatal("a follower (never led) declared a node down")
	}
	h.lead(t0)
	// Fresh grace: a node never heard from by this leader is not down
	// before two TTLs of leadership have passed.
	if _, down := h.verdict("n1", t0.Add(2*ttl-time.Millisecond), ttl); down {
		t.Fatal("node declared down inside the grace period after a leader change")
	}
	if r, down := h.verdict("n1", t0.Add(2*ttl+time.Millisecond), ttl); !down {
		t.Fatal("silent node not declared down after two TTLs")
	} else {
		t.Logf("reason: %s", r)
	}
	// Within failoverWindow TTLs of leading, a heartbeat may lag two TTLs.
	h.seen("n1", t0.Add(5*time.Second))
	if _, down := h.verdict("n1", t0.Add(5*time.Second+2*ttl), ttl); down {
		t.Fatal("node declared down within two TTLs of its heartbeat, right after a failover")
	}
	if _, down := h.verdict("n1", t0.Add(5*time.Second+2*ttl+time.Millisecond), ttl); !down {
		t.Fatal("node not declared down two TTLs after its last heartbeat")
	}
	// After the window, one TTL.
	late := t0.Add(failoverWindow * ttl)
	h.seen("n1", late)
	if _, down := h.verdict("n1", late.Add(ttl), ttl); down {
		t.Fatal("node declared down exactly at ttl after its heartbeat")
	}
	if r, down := h.verdict("n1", late.Add(ttl+time.Millisecond), ttl); !down {
		t.Fatal("node not declared down after ttl without heartbeat")
	} else {
		t.Logf("reason: %s", r)
	}
	// memberlist's verdict counts past the grace, even with fresh heartbeats.
	h.seen("n1", t0.Add(10*time.Second))
	h.gossip("n1", true, t0.Add(10*time.Second))
	if r, down := h.verdict("n1", t0.Add(10*time.Second), ttl); !down || r != "memberlist declared it dead" {
		t.Fatalf("memberlist death ignored: %q %v", r, down)
	}
	h.gossip("n1", false, t0.Add(11*time.Second))
	if _, down := h.verdict("n1", t0.Add(11*time.Second), ttl); down {
		t.Fatal("node down after memberlist saw it alive again")
	}
	// A new leader forgets everything and grants grace again.
	h.gossip("n1", true, t0.Add(12*time.Second))
	h.lead(t0.Add(20 * time.Second))
	if _, down := h.verdict("n1", t0.Add(22*time.Second), ttl); down {
		t.Fatal("new leader declared a node down inside its grace")
	}
	// A hello clears memberlist's verdict: the node proves it is alive.
	h.gossip("n1", true, t0.Add(24*time.Second))
	h.attach(&session{node: "n1", closed: make(chan struct{})}, t0.Add(25*time.Second))
	if _, down := h.verdict("n1", t0.Add(25*time.Second), ttl); down {
		t.Fatal("node down right after its hello")
	}
	// A leader that becomes ready (its barrier applied) late restarts the
	// grace then: nodes could not reconnect before.
	h.lead(t0.Add(30 * time.Second))
	h.ready(t0.Add(35 * time.Second))
	if _, down := h.verdict("n1", t0.Add(35*time.Second+2*ttl-time.Millisecond), ttl); down {
		t.Fatal("node down within two TTLs after the leader became ready")
	}
	if _, down := h.verdict("n1", t0.Add(35*time.Second+2*ttl+time.Millisecond), ttl); !down {
		t.Fatal("node silent for two TTLs after the leader became ready is not down")
	}
	// ready does nothing on a server that is not leading.
	h.lead(time.Time{})
	h.ready(t0.Add(40 * time.Second))
	if _, down := h.verdict("n1", t0.Add(time.Hour), ttl); down {
		t.Fatal("a follower declared a node down")
	}
}

// memberlist declares a node dead (its probes timed out while the node
// was paused ~1 s: a long GC, CPU starvation on a loaded box), then the
// node resumes and its heartbeats reach the leader again. A heartbeat
// after memberlist's verdict proves the node alive, as a hello does: it
// is not declared down (nor its tasks requeued) while its TTL holds, and
// is once the TTL passes without another.
func TestHeartbeatAfterGossipDeathKeepsNode(t *testing.T) {
	ttl := 3 * time.Second
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	h := newSessions()
	h.lead(t0)
	h.attach(&session{node: "n1", closed: make(chan struct{})}, t0)
	now := t0.Add(failoverWindow * ttl) // a steady leader
	h.seen("n1", now)
	// Paused from now to now+1s; memberlist's 750 ms suspicion ends.
	dead := now.Add(900 * time.Millisecond)
	h.gossip("n1", true, dead)
	if r, down := h.verdict("n1", dead, ttl); !down {
		t.Fatal("memberlist's verdict ignored before the node heartbeated again")
	} else {
		t.Logf("reason: %s", r)
	}
	// The node resumes: a heartbeat at +1.05 s, another at +1.5 s.
	h.seen("n1", now.Add(1050*time.Millisecond))
	h.seen("n1", now.Add(1500*time.Millisecond))
	if r, down := h.verdict("n1", now.Add(1600*time.Millisecond), ttl); down {
		t.Fatalf("node declared down (%q) although it heartbeated 100 ms ago, after memberlist's verdict; its TTL is %s", r, ttl)
	}
	if _, down := h.verdict("n1", now.Add(1500*time.Millisecond+ttl+time.Millisecond), ttl); !down {
		t.Fatal("node not declared down a TTL after its last heartbeat")
	}
}

// A removed node's in-memory state goes with it (FSM.nodeRemoved): a
// session still attached (a down node's, which liveness, no longer
// seeing the node, would not cut) is cut and keeps no report when it
// detaches; memberlist's verdict goes; its last sign of life goes unless
// it is recent, which a hello on its way to register the id anew needs.
func TestSessionsForgetRemovedNode(t *testing.T) {
	ttl := 3 * time.Second
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	h := newSessions()
	h.lead(t0)
	c := &session{node: "n1", closed: make(chan struct{}), verifying: []string{"t1"}}
	h.attach(c, t0)
	h.gossip("n1", true, t0.Add(time.Second))
	h.seen("n2", t0.Add(10*time.Second))
	h.kept["n2"] = []string{"t2"}

	now := t0.Add(10 * time.Second)
	h.forget("n1", now, ttl)
	h.forget("n2", now, ttl)
	select {
	case <-c.closed:
	default:
		t.Fatal("the removed node's session was not cut")
	}
	h.detach(c)
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.byNode) != 0 || len(h.gossipDead) != 0 || len(h.kept) != 0 {
		t.Fatalf("after forget: sessions %v, memberlist verdicts %v, kept reports %v; want none", h.byNode, h.gossipDead, h.kept)
	}
	if _, ok := h.lastSeen["n1"]; ok {
		t.Fatal("n1's last heartbeat, 10 s old, kept")
	}
	if _, ok := h.lastSeen["n2"]; !ok {
		t.Fatal("n2's sign of life from now (a hello on its way) dropped")
	}
}

// A session whose hello registered just before the server stepped down
// is not attached on the follower: lead cut every session already, and
// one attached after it stayed open with its heartbeats acknowledged for
// good, while the real leader, never hearing from the node, declared it
// down (found by helper-124's review).
func TestSessionsRefuseAnAttachAfterSteppingDown(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	h := newSessions()
	h.lead(t0)
	h.ready(t0)
	h.lead(time.Time{}) // stepped down while the hello registered
	c := &session{node: "n1", closed: make(chan struct{})}
	h.attach(c, t0.Add(time.Second))
	select {
	case <-c.closed:
	default:
		t.Fatal("a session attached on a server that no longer leads stays open")
	}
	if got := h.get("n1"); got != nil {
		t.Fatalf("the follower keeps the node's session: %v", got)
	}
	// Leading again, it attaches sessions again.
	h.lead(t0.Add(2 * time.Second))
	d := &session{node: "n1", closed: make(chan struct{})}
	if !h.attach(d, t0.Add(3*time.Second)) || h.get("n1") != d {
		t.Fatal("a leader refused a session")
	}
}
