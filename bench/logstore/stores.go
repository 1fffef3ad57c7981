package main

import (
	"path/filepath"

	"github.com/cockroachdb/pebble/v2"
	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	wal "github.com/hashicorp/raft-wal"

	"github.com/warrenhq/warren/raftlog"
)

// store is a LogStore under test, opened in its own directory.
type store interface {
	raft.LogStore
	// settle is called, untimed, between rounds of deletions; see
	// measureDeleteRange.
	settle() error
	Close() error
}

// kind names a LogStore implementation and opens one in dir.
type kind struct {
	name string
	open func(dir string) (store, error)
}

var kinds = []kind{
	{"ours", openOurs},
	{"boltdb", openBolt},
	{"raft-wal", openWAL},
}

type ours struct {
	*raftlog.Store
	db *pebble.DB
}

func openOurs(dir string) (store, error) {
	db, err := raftlog.Open(dir)
	if err != nil {
		return nil, err
	}
	s, err := raftlog.New(db)
	if err != nil {
		db.Close()
		return nil, err
	}
	return &ours{Store: s, db: db}, nil
}

// settle flushes the memtable. A range deletion leaves a tombstone in the
// memtable that Pebble re-fragments, with all the others there, the next
// time a reader is built; Raft deletes once per snapshot, so a real
// memtable holds few of them, not thousands.
func (o *ours) settle() error { return o.db.Flush() }
func (o *ours) Close() error  { return o.db.Close() }

type bolt struct{ *raftboltdb.BoltStore }

func openBolt(dir string) (store, error) {
	s, err := raftboltdb.New(raftboltdb.Options{Path: filepath.Join(dir, "raft.db")}) // NoSync false
	if err != nil {
		return nil, err
	}
	return bolt{s}, nil
}

func (bolt) settle() error { return nil }

type walStore struct{ *wal.WAL }

func openWAL(dir string) (store, error) {
	w, err := wal.Open(dir)
	if err != nil {
		return nil, err
	}
	return walStore{w}, nil
}

func (walStore) settle() error { return nil }
