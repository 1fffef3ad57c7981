// Package raftlog stores a warren server's Raft log and Raft stable state in
// Pebble. Store implements hashicorp/raft's LogStore and StableStore on top
// of a *pebble.DB that the caller opens with Open (or OpenWithFS in tests)
// and closes itself.
//
// raftlog owns two key prefixes of that database: PrefixLog (0x01), which
// maps a big-endian uint64 index to an encoded raft.Log, and PrefixStable
// (0x02), which holds the stable store's keys. Keys starting with a byte in
// [FSMPrefixStart, FSMPrefixEnd) belong to the FSM and raftlog never reads or
// writes them; every other prefix is unassigned.
//
// Every write that returns nil has been synced to the WAL. A failed WAL
// write or sync does not come back as an error: Pebble cannot know what
// reached the disk, so it logs "fatal commit error" and exits the process,
// and the restarted server recovers from what is on disk.
//
// Store is a raft.MonotonicLogStore: after a snapshot install Raft deletes
// the whole log rather than keep entries below the snapshot that may never
// have committed.
//
// raftlog imports no other warren package.
package raftlog
