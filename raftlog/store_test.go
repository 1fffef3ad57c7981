package raftlog

import (
	"bytes"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/hashicorp/raft"
)

// testDB is a database that a test can close and reopen, on the real disk or
// on an in-memory filesystem.
type testDB struct {
	t   testing.TB
	fs  vfs.FS
	dir string
	db  *pebble.DB
}

func openTestDB(t testing.TB, fs vfs.FS, dir string) *testDB {
	t.Helper()
	d := &testDB{t: t, fs: fs, dir: dir}
	d.open()
	t.Cleanup(func() {
		if d.db != nil {
			if err := d.db.Close(); err != nil {
				t.Errorf("close: %v", err)
			}
		}
	})
	return d
}

func (d *testDB) open() *Store {
	d.t.Helper()
	db, err := OpenWithFS(d.dir, d.fs)
	if err != nil {
		d.t.Fatalf("open: %v", err)
	}
	d.db = db
	s, err := New(db)
	if err != nil {
		d.t.Fatalf("new: %v", err)
	}
	return s
}

// reopen closes the database and returns a Store on the reopened one.
func (d *testDB) reopen() *Store {
	d.t.Helper()
	if err := d.db.Close(); err != nil {
		d.t.Fatalf("close: %v", err)
	}
	d.db = nil
	return d.open()
}

// backends runs f against a store in memory and one on disk.
func backends(t *testing.T, f func(t *testing.T, d *testDB, s *Store)) {
	t.Run("mem", func(t *testing.T) {
		d := openTestDB(t, vfs.NewMem(), "db")
		s, _ := New(d.db)
		f(t, d, s)
	})
	t.Run("disk", func(t *testing.T) {
		d := openTestDB(t, vfs.Default, t.TempDir())
		s, _ := New(d.db)
		f(t, d, s)
	})
}

func testLog(i uint64) *raft.Log {
	return &raft.Log{
		Index: i, Term: i/10 + 1, Type: raft.LogCommand,
		Data: []byte(fmt.Sprintf("entry-%d", i)),
	}
}

func storeRange(t testing.TB, s *Store, lo, hi uint64) {
	t.Helper()
	var logs []*raft.Log
	for i := lo; i <= hi; i++ {
		logs = append(logs, testLog(i))
	}
	if err := s.StoreLogs(logs); err != nil {
		t.Fatalf("StoreLogs(%d..%d): %v", lo, hi, err)
	}
}

func wantBounds(t testing.TB, s *Store, first, last uint64) {
	t.Helper()
	f, err := s.FirstIndex()
	if err != nil {
		t.Fatalf("FirstIndex: %v", err)
	}
	l, err := s.LastIndex()
	if err != nil {
		t.Fatalf("LastIndex: %v", err)
	}
	if f != first || l != last {
		t.Fatalf("bounds = [%d, %d], want [%d, %d]", f, l, first, last)
	}
}

// wantPresent checks which indexes in [lo, hi] hold their testLog.
func wantPresent(t testing.TB, s *Store, lo, hi uint64, present func(uint64) bool) {
	t.Helper()
	for i := lo; i <= hi; i++ {
		var l raft.Log
		err := s.GetLog(i, &l)
		switch {
		case present(i) && err != nil:
			t.Fatalf("GetLog(%d): %v", i, err)
		case present(i) && !logsEqual(&l, testLog(i)):
			t.Fatalf("GetLog(%d) = %+v, want %+v", i, l, testLog(i))
		case !present(i) && !errors.Is(err, raft.ErrLogNotFound):
			t.Fatalf("GetLog(%d) = %v, want ErrLogNotFound", i, err)
		}
	}
}

func between(lo, hi uint64) func(uint64) bool {
	return func(i uint64) bool { return lo <= i && i <= hi }
}

func TestEmpty(t *testing.T) {
	backends(t, func(t *testing.T, d *testDB, s *Store) {
		wantBounds(t, s, 0, 0)
		var l raft.Log
		if err := s.GetLog(1, &l); !errors.Is(err, raft.ErrLogNotFound) {
			t.Fatalf("GetLog on empty store = %v, want ErrLogNotFound", err)
		}
		if err := s.DeleteRange(1, 10); err != nil {
			t.Fatalf("DeleteRange on empty store: %v", err)
		}
		if err := s.StoreLogs(nil); err != nil {
			t.Fatalf("StoreLogs(nil): %v", err)
		}
		wantBounds(t, d.reopen(), 0, 0)
	})
}

func TestGaps(t *testing.T) {
	backends(t, func(t *testing.T, d *testDB, s *Store) {
		storeRange(t, s, 1, 5)
		storeRange(t, s, 10, 12)
		wantBounds(t, s, 1, 12)
		var l raft.Log
		if err := s.GetLog(7, &l); !errors.Is(err, raft.ErrLogNotFound) {
			t.Fatalf("GetLog(7) = %v, want ErrLogNotFound", err)
		}
		present := func(i uint64) bool { return (i >= 1 && i <= 5) || (i >= 10 && i <= 12) }
		wantPresent(t, s, 0, 14, present)
		s = d.reopen()
		wantBounds(t, s, 1, 12)
		wantPresent(t, s, 0, 14, present)
	})
}

func TestStoreLogsOutOfOrder(t *testing.T) {
	backends(t, func(t *testing.T, d *testDB, s *Store) {
		storeRange(t, s, 10, 12)
		storeRange(t, s, 3, 4)
		wantBounds(t, s, 3, 12)
		if err := s.StoreLog(testLog(20)); err != nil {
			t.Fatal(err)
		}
		wantBounds(t, s, 3, 20)
		// Overwriting an entry replaces it.
		over := testLog(11)
		over.Data = []byte("overwritten")
		if err := s.StoreLog(over); err != nil {
			t.Fatal(err)
		}
		var l raft.Log
		if err := s.GetLog(11, &l); err != nil || !logsEqual(&l, over) {
			t.Fatalf("GetLog(11) = %+v, %v; want %+v", l, err, over)
		}
		wantBounds(t, d.reopen(), 3, 20)
	})
}

func TestStoreLogsZeroIndex(t *testing.T) {
	backends(t, func(t *testing.T, d *testDB, s *Store) {
		err := s.StoreLogs([]*raft.Log{testLog(1), {Index: 0}})
		if !errors.Is(err, ErrZeroIndex) {
			t.Fatalf("StoreLogs with index 0 = %v, want ErrZeroIndex", err)
		}
		wantBounds(t, s, 0, 0) // nothing of the batch was written
		wantPresent(t, s, 1, 1, func(uint64) bool { return false })
	})
}

func TestDeleteRange(t *testing.T) {
	cases := []struct {
		name          string
		deletes       [][2]uint64 // applied in order to a log 1..20
		first, last   uint64
		present       func(uint64) bool
		wantReadsMade bool
	}{
		{"head", [][2]uint64{{1, 5}}, 6, 20, between(6, 20), true},
		{"head from below first", [][2]uint64{{0, 5}}, 6, 20, between(6, 20), true},
		{"tail", [][2]uint64{{15, 20}}, 1, 14, between(1, 14), true},
		{"tail past last", [][2]uint64{{15, 1 << 63}}, 1, 14, between(1, 14), true},
		{"head and tail", [][2]uint64{{1, 5}, {15, 20}}, 6, 14, between(6, 14), true},
		{"middle", [][2]uint64{{8, 9}}, 1, 20, func(i uint64) bool { return between(1, 20)(i) && !between(8, 9)(i) }, false},
		{"all", [][2]uint64{{1, 20}}, 0, 0, func(uint64) bool { return false }, false},
		{"superset", [][2]uint64{{0, ^uint64(0)}}, 0, 0, func(uint64) bool { return false }, false},
		{"outside", [][2]uint64{{30, 40}}, 1, 20, between(1, 20), false},
		{"empty range", [][2]uint64{{9, 3}}, 1, 20, between(1, 20), false},
		{"head across a hole", [][2]uint64{{8, 12}, {1, 9}}, 13, 20, between(13, 20), true},
		{"tail across a hole", [][2]uint64{{8, 12}, {10, 20}}, 1, 7, between(1, 7), true},
		{"single entry left", [][2]uint64{{1, 9}, {11, 20}}, 10, 10, between(10, 10), true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			backends(t, func(t *testing.T, d *testDB, s *Store) {
				storeRange(t, s, 1, 20)
				for _, r := range tc.deletes {
					if err := s.DeleteRange(r[0], r[1]); err != nil {
						t.Fatalf("DeleteRange(%d, %d): %v", r[0], r[1], err)
					}
				}
				wantBounds(t, s, tc.first, tc.last)
				wantPresent(t, s, 0, 22, tc.present)
				s = d.reopen()
				wantBounds(t, s, tc.first, tc.last)
				wantPresent(t, s, 0, 22, tc.present)
				// Appending after a deletion extends the log as expected.
				storeRange(t, s, 21, 21)
				first := tc.first
				if first == 0 {
					first = 21
				}
				wantBounds(t, s, first, 21)
			})
		})
	}
}

func TestGetLogNotFound(t *testing.T) {
	backends(t, func(t *testing.T, d *testDB, s *Store) {
		storeRange(t, s, 5, 6)
		for _, i := range []uint64{0, 1, 4, 7, 1 << 62, ^uint64(0)} {
			var l raft.Log
			if err := s.GetLog(i, &l); !errors.Is(err, raft.ErrLogNotFound) {
				t.Errorf("GetLog(%d) = %v, want ErrLogNotFound", i, err)
			}
		}
	})
}

func TestGetLogCorrupt(t *testing.T) {
	backends(t, func(t *testing.T, d *testDB, s *Store) {
		var k [logKeyLen]byte
		// An entry whose bytes are garbage, and a valid entry under the
		// wrong key.
		if err := d.db.Set(logKey(&k, 3), []byte("garbage"), pebble.Sync); err != nil {
			t.Fatal(err)
		}
		if err := d.db.Set(logKey(&k, 4), encode(testLog(40)), pebble.Sync); err != nil {
			t.Fatal(err)
		}
		for _, i := range []uint64{3, 4} {
			var l raft.Log
			if err := s.GetLog(i, &l); !errors.Is(err, ErrCorrupt) {
				t.Errorf("GetLog(%d) = %v, want ErrCorrupt", i, err)
			}
		}
	})
}

func TestLogRoundTrip(t *testing.T) {
	backends(t, func(t *testing.T, d *testDB, s *Store) {
		var logs []*raft.Log
		for i, tc := range codecCases {
			l := tc.log
			l.Index = uint64(i + 1)
			logs = append(logs, &l)
		}
		if err := s.StoreLogs(logs); err != nil {
			t.Fatal(err)
		}
		check := func(s *Store) {
			for _, want := range logs {
				var got raft.Log
				if err := s.GetLog(want.Index, &got); err != nil {
					t.Fatalf("GetLog(%d): %v", want.Index, err)
				}
				if !logsEqual(&got, want) {
					t.Fatalf("GetLog(%d):\n got %+v\nwant %+v", want.Index, got, want)
				}
			}
		}
		check(s)
		check(d.reopen())
	})
}

func TestGetLogOwnsData(t *testing.T) {
	backends(t, func(t *testing.T, d *testDB, s *Store) {
		storeRange(t, s, 1, 1)
		var a raft.Log
		if err := s.GetLog(1, &a); err != nil {
			t.Fatal(err)
		}
		copy(a.Data, "XXXXX")
		var b raft.Log
		if err := s.GetLog(1, &b); err != nil {
			t.Fatal(err)
		}
		if !logsEqual(&b, testLog(1)) {
			t.Fatalf("mutating a returned entry changed the store: %+v", b)
		}
	})
}

func TestStable(t *testing.T) {
	backends(t, func(t *testing.T, d *testDB, s *Store) {
		sets := []struct {
			key, val []byte
		}{
			{[]byte("CurrentTerm-bytes"), []byte("v1")},
			{[]byte("empty value"), []byte{}},
			{[]byte{}, []byte("empty key")},
			{[]byte{0x00, 0xff}, bytes.Repeat([]byte{7}, 4096)},
		}
		for _, kv := range sets {
			if err := s.Set(kv.key, kv.val); err != nil {
				t.Fatalf("Set(%q): %v", kv.key, err)
			}
		}
		if err := s.SetUint64([]byte("CurrentTerm"), 42); err != nil {
			t.Fatal(err)
		}
		if err := s.SetUint64([]byte("max"), ^uint64(0)); err != nil {
			t.Fatal(err)
		}
		// Overwrite.
		if err := s.Set([]byte("CurrentTerm-bytes"), []byte("v2")); err != nil {
			t.Fatal(err)
		}
		sets[0].val = []byte("v2")

		check := func(s *Store) {
			for _, kv := range sets {
				got, err := s.Get(kv.key)
				if err != nil || !bytes.Equal(got, kv.val) {
					t.Errorf("Get(%q) = %q, %v; want %q", kv.key, got, err, kv.val)
				}
			}
			for key, want := range map[string]uint64{"CurrentTerm": 42, "max": ^uint64(0)} {
				got, err := s.GetUint64([]byte(key))
				if err != nil || got != want {
					t.Errorf("GetUint64(%q) = %d, %v; want %d", key, got, err, want)
				}
			}
			// Missing keys: raft compares the error text with "not found".
			v, err := s.Get([]byte("missing"))
			if err == nil || err.Error() != "not found" || !errors.Is(err, ErrKeyNotFound) || len(v) != 0 {
				t.Errorf("Get(missing) = %q, %v; want empty, \"not found\"", v, err)
			}
			u, err := s.GetUint64([]byte("missing"))
			if err == nil || err.Error() != "not found" || u != 0 {
				t.Errorf("GetUint64(missing) = %d, %v; want 0, \"not found\"", u, err)
			}
			// A value that is not 8 bytes is not a uint64.
			if _, err := s.GetUint64([]byte("CurrentTerm-bytes")); !errors.Is(err, ErrCorrupt) {
				t.Errorf("GetUint64 of a 2-byte value = %v, want ErrCorrupt", err)
			}
			// Stable keys and log entries do not collide.
			wantBounds(t, s, 0, 0)
		}
		check(s)
		check(d.reopen())
	})
}

func TestReopenPersistence(t *testing.T) {
	backends(t, func(t *testing.T, d *testDB, s *Store) {
		for round := range uint64(3) {
			lo := round*100 + 1
			storeRange(t, s, lo, lo+99)
			if err := s.SetUint64([]byte("round"), round); err != nil {
				t.Fatal(err)
			}
			s = d.reopen()
			wantBounds(t, s, 1, lo+99)
			wantPresent(t, s, 1, lo+99, func(uint64) bool { return true })
			if r, err := s.GetUint64([]byte("round")); err != nil || r != round {
				t.Fatalf("GetUint64(round) = %d, %v; want %d", r, err, round)
			}
		}
	})
}

func TestFSMKeysUntouched(t *testing.T) {
	backends(t, func(t *testing.T, d *testDB, s *Store) {
		// Keys on either side of the log prefix and in the FSM range.
		others := [][]byte{{0x00}, {PrefixLog - 1, 0xff}, {FSMPrefixStart}, {FSMPrefixEnd - 1, 1, 2}, {0xff}}
		for _, k := range others {
			if err := d.db.Set(k, []byte("fsm"), pebble.Sync); err != nil {
				t.Fatal(err)
			}
		}
		storeRange(t, s, 1, 10)
		if err := s.DeleteRange(0, ^uint64(0)); err != nil {
			t.Fatal(err)
		}
		s = d.reopen()
		wantBounds(t, s, 0, 0)
		for _, k := range others {
			v, closer, err := d.db.Get(k)
			if err != nil {
				t.Fatalf("Get(%x): %v", k, err)
			}
			if string(v) != "fsm" {
				t.Fatalf("Get(%x) = %q", k, v)
			}
			closer.Close()
		}
	})
}

func TestConcurrentReadsDuringWrites(t *testing.T) {
	d := openTestDB(t, vfs.NewMem(), "db")
	s, err := New(d.db)
	if err != nil {
		t.Fatal(err)
	}
	storeRange(t, s, 1, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := uint64(2); i <= 300; i++ {
			storeRange(t, s, i, i)
			if i%50 == 0 {
				if err := s.DeleteRange(1, i-40); err != nil {
					t.Error(err)
					return
				}
			}
		}
	}()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case <-done:
			wantBounds(t, s, 261, 300)
			return
		case <-deadline:
			t.Fatal("writer did not finish")
		default:
		}
		first, _ := s.FirstIndex()
		last, _ := s.LastIndex()
		if first > last {
			t.Fatalf("FirstIndex %d > LastIndex %d", first, last)
		}
		var l raft.Log
		if err := s.GetLog(last, &l); err != nil && !errors.Is(err, raft.ErrLogNotFound) {
			t.Fatalf("GetLog(%d): %v", last, err)
		}
	}
}
