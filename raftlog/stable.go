package raftlog

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/cockroachdb/pebble/v2"
)

// ErrKeyNotFound is returned by Get and GetUint64 for a key that was never
// set. Its text is exactly "not found" because hashicorp/raft recognises a
// missing key by comparing err.Error() with that string (as raft-boltdb and
// raft.InmemStore return it), so it must not be wrapped.
var ErrKeyNotFound = errors.New("not found")

// Set stores val under key, synced.
func (s *Store) Set(key, val []byte) error {
	if err := s.db.Set(stableKey(key), val, pebble.Sync); err != nil {
		return fmt.Errorf("raftlog: set %q: %w", key, err)
	}
	return nil
}

// Get returns a copy of the value stored under key, or an empty slice and
// ErrKeyNotFound if there is none.
func (s *Store) Get(key []byte) ([]byte, error) {
	val, closer, err := s.db.Get(stableKey(key))
	if errors.Is(err, pebble.ErrNotFound) {
		return []byte{}, ErrKeyNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("raftlog: get %q: %w", key, err)
	}
	out := make([]byte, len(val))
	copy(out, val)
	if err := closer.Close(); err != nil {
		return nil, fmt.Errorf("raftlog: get %q: %w", key, err)
	}
	return out, nil
}

// SetUint64 stores val under key as 8 big-endian bytes, synced. It shares
// the key space of Set.
func (s *Store) SetUint64(key []byte, val uint64) error {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], val)
	return s.Set(key, b[:])
}

// GetUint64 returns the value stored by SetUint64 under key, or 0 and
// ErrKeyNotFound if there is none.
func (s *Store) GetUint64(key []byte) (uint64, error) {
	val, err := s.Get(key)
	if err != nil {
		return 0, err
	}
	if len(val) != 8 {
		return 0, fmt.Errorf("raftlog: get uint64 %q: %w: value is %d bytes", key, ErrCorrupt, len(val))
	}
	return binary.BigEndian.Uint64(val), nil
}

func stableKey(key []byte) []byte {
	k := make([]byte, 1+len(key))
	k[0] = PrefixStable
	copy(k[1:], key)
	return k
}
