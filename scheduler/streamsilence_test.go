package scheduler

import (
	"context"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/hashicorp/raft"

	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
)

// A follower cut off from the leader ends its streams: it applies nothing
// more, so a stream there waited, silent, while the task went on
// elsewhere, and the client never moved to another server.
func TestAStreamOnACutOffFollowerEnds(t *testing.T) {
	old := streamLeaderSilence
	streamLeaderSilence = time.Second
	t.Cleanup(func() { streamLeaderSilence = old })
	nodes := startCluster(t, 0)
	f := followerOf(nodes)
	task := createVia(t, f, 1)
	waitFor(t, "the follower to have the task", 10*time.Second, func() bool { _, err := f.srv.FSM().Task(task.GetId()); return err == nil })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := f.tasks.StreamEvents(ctx, connect.NewRequest(&warrenv1.StreamEventsRequest{TaskId: task.GetId()}))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for _, n := range nodes {
		if n != f {
			n.stop()
		}
	}
	start := time.Now()
	for st.Receive() {
	}
	if connect.CodeOf(st.Err()) != connect.CodeUnavailable || !strings.Contains(st.Err().Error(), "has not heard from a leader") {
		t.Fatalf("the stream ended with %v after %v, want unavailable naming the silence", st.Err(), time.Since(start))
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("the stream ended %v after the others stopped", took)
	}
}

// A server that led counts its silence from when it stopped leading:
// raft's LastContact counts a leader's messages to a follower, and raft
// sets it when its leader steps down (runLeader's deferred setLastContact).
// Without that, it would be zero on a server that led since it started, and
// a step-down, even one the next election mends in a second, would end
// every stream there at once (a review thought it did; this pins it).
func TestAStreamOutlivesItsServersStepDownForTheSilence(t *testing.T) {
	old := streamLeaderSilence
	streamLeaderSilence = 3 * time.Second
	t.Cleanup(func() { streamLeaderSilence = old })
	nodes := startCluster(t, 0)
	l := leaderOf(nodes)
	task := createVia(t, l, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := l.tasks.StreamEvents(ctx, connect.NewRequest(&warrenv1.StreamEventsRequest{TaskId: task.GetId()}))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ended := make(chan time.Time, 1)
	go func() {
		for st.Receive() {
		}
		ended <- time.Now()
	}()
	// Longer than the silence allowed, so that a count from raft's
	// LastContact (zero: s1 has led since it started) would be over it.
	time.Sleep(streamLeaderSilence + time.Second)
	for _, n := range nodes {
		if n != l {
			n.stop()
		}
	}
	// Without its followers, the leader steps down when its lease ends.
	waitFor(t, "the leader to step down", 10*time.Second, func() bool { return l.srv.Raft().State() != raft.Leader })
	down := time.Now()
	select {
	case at := <-ended:
		t.Fatalf("the stream ended %v after the step-down (%v), before the %v of silence allowed", at.Sub(down), st.Err(), streamLeaderSilence)
	case <-time.After(streamLeaderSilence - time.Second):
	}
	select {
	case <-ended:
		if connect.CodeOf(st.Err()) != connect.CodeUnavailable || !strings.Contains(st.Err().Error(), "has not heard from a leader") {
			t.Fatalf("the stream ended with %v, want unavailable naming the silence", st.Err())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the stream on a server cut off from the others did not end")
	}
}
