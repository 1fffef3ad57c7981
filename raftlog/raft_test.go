package raftlog

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
)

// counterFSM sums the uint64 commands applied to it and closes reached once
// the sum of applied commands reaches target.
type counterFSM struct {
	mu      sync.Mutex
	applied uint64
	target  uint64
	reached chan struct{}
}

func newCounterFSM(target uint64) *counterFSM {
	return &counterFSM{target: target, reached: make(chan struct{})}
}

func (f *counterFSM) Apply(l *raft.Log) any {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(l.Data) != 8 {
		return fmt.Errorf("bad command %x", l.Data)
	}
	f.applied++
	if f.applied == f.target {
		close(f.reached)
	}
	return binary.BigEndian.Uint64(l.Data)
}

func (f *counterFSM) Snapshot() (raft.FSMSnapshot, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return counterSnapshot(f.applied), nil
}

func (f *counterFSM) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	var b [8]byte
	if _, err := io.ReadFull(rc, b[:]); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.applied = binary.BigEndian.Uint64(b[:])
	if f.applied >= f.target {
		select {
		case <-f.reached:
		default:
			close(f.reached)
		}
	}
	return nil
}

type counterSnapshot uint64

func (s counterSnapshot) Persist(sink raft.SnapshotSink) error {
	if _, err := sink.Write(binary.BigEndian.AppendUint64(nil, uint64(s))); err != nil {
		sink.Cancel()
		return err
	}
	return sink.Close()
}

func (counterSnapshot) Release() {}

type testNode struct {
	id    raft.ServerID
	dir   string
	db    *testDB
	store *Store
	snaps raft.SnapshotStore
	trans *raft.InmemTransport
	fsm   *counterFSM
	raft  *raft.Raft
}

func raftConfig(id raft.ServerID) *raft.Config {
	c := raft.DefaultConfig()
	c.LocalID = id
	// Generous enough that a leader keeps its lease under -race on two
	// cores, so Apply does not fail with ErrLeadershipLost.
	c.HeartbeatTimeout = 300 * time.Millisecond
	c.ElectionTimeout = 300 * time.Millisecond
	c.LeaderLeaseTimeout = 200 * time.Millisecond
	c.CommitTimeout = 5 * time.Millisecond
	c.SnapshotThreshold = 1 << 20 // only the explicit snapshot below
	c.TrailingLogs = 10
	c.Logger = hclog.New(&hclog.LoggerOptions{Name: string(id), Level: hclog.Error, Output: os.Stderr})
	return c
}

// startCluster starts (or restarts) a Raft node per store, connected by
// in-memory transports.
func startCluster(t *testing.T, nodes []*testNode, target uint64) {
	t.Helper()
	startClusterWith(t, nodes, target, raftConfig)
}

// startClusterWith is startCluster with each node's configuration from conf.
func startClusterWith(t *testing.T, nodes []*testNode, target uint64, conf func(raft.ServerID) *raft.Config) {
	t.Helper()
	for _, n := range nodes {
		_, n.trans = raft.NewInmemTransport(raft.ServerAddress(n.id))
		n.fsm = newCounterFSM(target)
	}
	for _, a := range nodes {
		for _, b := range nodes {
			if a != b {
				a.trans.Connect(b.trans.LocalAddr(), b.trans)
			}
		}
	}
	for _, n := range nodes {
		r, err := raft.NewRaft(conf(n.id), n.fsm, n.store, n.store, n.snaps, n.trans)
		if err != nil {
			t.Fatalf("NewRaft(%s): %v", n.id, err)
		}
		n.raft = r
	}
}

func stopCluster(t *testing.T, nodes []*testNode) {
	t.Helper()
	for _, n := range nodes {
		if n.raft == nil {
			continue
		}
		if err := n.raft.Shutdown().Error(); err != nil {
			t.Errorf("shutdown %s: %v", n.id, err)
		}
		n.raft = nil
	}
}

// waitLeader returns the first node that reports on its LeaderCh that it
// became leader.
func waitLeader(t *testing.T, nodes []*testNode) *testNode {
	t.Helper()
	timeout := time.After(20 * time.Second)
	for {
		select {
		case ok := <-nodes[0].raft.LeaderCh():
			if ok {
				return nodes[0]
			}
		case ok := <-nodes[1].raft.LeaderCh():
			if ok {
				return nodes[1]
			}
		case ok := <-nodes[2].raft.LeaderCh():
			if ok {
				return nodes[2]
			}
		case <-timeout:
			t.Fatal("no leader elected")
		}
	}
}

func waitApplied(t *testing.T, nodes []*testNode) {
	t.Helper()
	timeout := time.After(20 * time.Second)
	for _, n := range nodes {
		select {
		case <-n.fsm.reached:
		case <-timeout:
			t.Fatalf("%s applied %d of %d entries", n.id, n.fsm.applied, n.fsm.target)
		}
	}
}

// TestRaftCluster runs a three-node hashicorp/raft cluster with this store
// as every node's LogStore and StableStore: it elects a leader and applies
// 100 commands, compacts the log with a snapshot, and then restarts every
// node from its database and applies more.
func TestRaftCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Raft cluster on disk")
	}
	const entries = 100
	var nodes []*testNode
	var servers []raft.Server
	for i := range 3 {
		id := raft.ServerID(fmt.Sprintf("node%d", i))
		n := &testNode{id: id, dir: t.TempDir(), snaps: raft.NewInmemSnapshotStore()}
		n.db = openTestDB(t, vfs.Default, n.dir)
		var err error
		if n.store, err = New(n.db.db); err != nil {
			t.Fatal(err)
		}
		nodes = append(nodes, n)
		servers = append(servers, raft.Server{ID: id, Address: raft.ServerAddress(id)})
	}
	t.Cleanup(func() { stopCluster(t, nodes) })

	// Bootstrap node0 only; the others join through replication.
	n0 := nodes[0]
	if err := raft.BootstrapCluster(raftConfig(n0.id), n0.store, n0.store, n0.snaps,
		&raft.InmemTransport{}, raft.Configuration{Servers: servers}); err != nil {
		t.Fatalf("bootstrap: %v", err)
	}
	startCluster(t, nodes, entries)
	leader := waitLeader(t, nodes)
	for i := range uint64(entries) {
		f := leader.raft.Apply(binary.BigEndian.AppendUint64(nil, i), 5*time.Second)
		if err := f.Error(); err != nil {
			t.Fatalf("apply %d: %v", i, err)
		}
		if got := f.Response(); got != i {
			t.Fatalf("apply %d: response %v", i, got)
		}
	}
	waitApplied(t, nodes)

	// A snapshot makes Raft compact the leader's log with DeleteRange.
	if err := leader.raft.Snapshot().Error(); err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	first, _ := leader.store.FirstIndex()
	last, _ := leader.store.LastIndex()
	if first <= 1 || last < entries {
		t.Fatalf("leader log after snapshot = [%d, %d], want compacted head and last >= %d", first, last, entries)
	}
	for _, n := range nodes {
		term, err := n.store.GetUint64([]byte("CurrentTerm"))
		if err != nil || term == 0 {
			t.Fatalf("%s CurrentTerm = %d, %v", n.id, term, err)
		}
	}

	// Restart every node from its database.
	stopCluster(t, nodes)
	for _, n := range nodes {
		n.store = n.db.reopen()
		ok, err := raft.HasExistingState(n.store, n.store, n.snaps)
		if err != nil || !ok {
			t.Fatalf("%s HasExistingState = %v, %v", n.id, ok, err)
		}
	}
	startCluster(t, nodes, entries+1)
	leader = waitLeader(t, nodes)
	if err := leader.raft.Apply(binary.BigEndian.AppendUint64(nil, entries), 5*time.Second).Error(); err != nil {
		t.Fatalf("apply after restart: %v", err)
	}
	waitApplied(t, nodes)
}

// TestSnapshotInstallDropsStaleEntries partitions a leader, which appends
// entries that never commit, lets the two others elect a leader, commit
// more and compact their logs, and reconnects the old leader, which then
// installs a snapshot. None of its uncommitted entries may survive the
// install at or below the snapshot's index: were it to lead later, it
// would send them to a lagging follower as if they had committed
// (hashicorp/raft#697). Raft deletes them only from a store that reports
// itself monotonic; otherwise it keeps up to TrailingLogs entries below
// its last one.
func TestSnapshotInstallDropsStaleEntries(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a Raft cluster through a partition")
	}
	const (
		before = 5  // committed by the first leader
		stale  = 3  // appended by it while partitioned
		after  = 20 // committed by the next leader
		total  = before + after + 1
	)
	conf := func(id raft.ServerID) *raft.Config {
		c := raftConfig(id)
		c.TrailingLogs = 2
		return c
	}
	var nodes []*testNode
	var servers []raft.Server
	for i := range 3 {
		id := raft.ServerID(fmt.Sprintf("node%d", i))
		n := &testNode{id: id, snaps: raft.NewInmemSnapshotStore()}
		n.db = openTestDB(t, vfs.NewMem(), "db")
		var err error
		if n.store, err = New(n.db.db); err != nil {
			t.Fatal(err)
		}
		nodes = append(nodes, n)
		servers = append(servers, raft.Server{ID: id, Address: raft.ServerAddress(id)})
	}
	t.Cleanup(func() { stopCluster(t, nodes) })
	if err := raft.BootstrapCluster(conf(nodes[0].id), nodes[0].store, nodes[0].store, nodes[0].snaps,
		&raft.InmemTransport{}, raft.Configuration{Servers: servers}); err != nil {
		t.Fatalf("bootstrap: %v", err)
	}
	startClusterWith(t, nodes, total, conf)
	old := waitLeader(t, nodes)
	apply := func(n *testNode, i uint64) error {
		return n.raft.Apply(binary.BigEndian.AppendUint64(nil, i), 5*time.Second).Error()
	}
	for i := range uint64(before) {
		if err := apply(old, i); err != nil {
			t.Fatalf("apply %d: %v", i, err)
		}
	}
	if err := old.raft.Barrier(5 * time.Second).Error(); err != nil {
		t.Fatal(err)
	}

	// Cut the leader off. What it appends now cannot commit.
	var others []*testNode
	for _, n := range nodes {
		if n != old {
			others = append(others, n)
			n.trans.Disconnect(old.trans.LocalAddr())
		}
	}
	old.trans.DisconnectAll()
	committedLast, _ := old.store.LastIndex()
	futures := make([]raft.ApplyFuture, stale)
	for i := range futures {
		futures[i] = old.raft.Apply(binary.BigEndian.AppendUint64(nil, 1000+uint64(i)), 5*time.Second)
	}
	for i, f := range futures {
		if err := f.Error(); err == nil {
			t.Fatalf("stale apply %d committed without a quorum", i)
		}
	}
	staleLast, _ := old.store.LastIndex()
	if staleLast != committedLast+stale {
		t.Fatalf("old leader's log ends at %d after %d stale applies from %d", staleLast, stale, committedLast)
	}
	var l raft.Log
	if err := old.store.GetLog(staleLast, &l); err != nil {
		t.Fatal(err)
	}
	staleTerm := l.Term

	// The two others elect a leader, commit more and compact their logs
	// past the stale entries, so the old leader can only catch up by
	// installing a snapshot.
	var leader *testNode
	select {
	case <-others[0].raft.LeaderCh():
		leader = others[0]
	case <-others[1].raft.LeaderCh():
		leader = others[1]
	case <-time.After(20 * time.Second):
		t.Fatal("no new leader elected")
	}
	for i := range uint64(after) {
		if err := apply(leader, before+i); err != nil {
			t.Fatalf("apply %d on the new leader: %v", before+i, err)
		}
	}
	for _, n := range others {
		if err := n.raft.Snapshot().Error(); err != nil {
			t.Fatalf("snapshot on %s: %v", n.id, err)
		}
		if first, _ := n.store.FirstIndex(); first <= staleLast+1 {
			t.Fatalf("%s log starts at %d after its snapshot, want past %d", n.id, first, staleLast+1)
		}
	}

	// Reconnect the old leader. It catches up, with the entry applied
	// next stored in its emptied log, right after the snapshot.
	for _, n := range others {
		n.trans.Connect(old.trans.LocalAddr(), old.trans)
		old.trans.Connect(n.trans.LocalAddr(), n.trans)
	}
	if err := apply(leader, before+after); err != nil {
		t.Fatalf("apply after reconnect: %v", err)
	}
	waitApplied(t, nodes)
	snap, err := strconv.ParseUint(old.raft.Stats()["last_snapshot_index"], 10, 64)
	if err != nil || snap <= staleLast {
		t.Fatalf("old leader's last snapshot index = %d, %v; want an installed snapshot past %d", snap, err, staleLast)
	}
	for i := uint64(1); i <= snap; i++ {
		err := old.store.GetLog(i, &l)
		if errors.Is(err, raft.ErrLogNotFound) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if l.Term <= staleTerm {
			first, _ := old.store.FirstIndex()
			t.Errorf("old leader still holds entry %d of term %d (log starts at %d, snapshot at %d)", i, l.Term, first, snap)
		}
	}
	// The install emptied its log, which then took the entries after the
	// snapshot, starting right after it.
	if first, _ := old.store.FirstIndex(); first != snap+1 {
		t.Errorf("old leader's log starts at %d after installing a snapshot at %d, want %d", first, snap, snap+1)
	}
}
