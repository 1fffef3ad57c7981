package microvm

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A start re-adopts a paused sandbox only if paused.state has the size its
// pause recorded: one cut short (a power loss before pauses synced it)
// cannot be resumed, and is destroyed with the reason instead of staying
// paused, every resume failing, until its TTL. A record from before the
// size was kept is not checked.
func TestAdoptRefusesAPausedStateCutShort(t *testing.T) {
	d := &Driver{log: slog.New(slog.DiscardHandler)}
	for _, tc := range []struct {
		name         string
		recorded     int64
		onDisk       int
		adopted      bool
		whyHasSuffix string
	}{
		{"whole", 4096, 4096, true, ""},
		{"cut short", 4096, 1000, false, "its state file has 1000 bytes of the 4096 its pause wrote"},
		{"empty", 4096, 0, false, "its state file has 0 bytes of the 4096 its pause wrote"},
		{"no size recorded", 0, 1000, true, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "vm-1")
			if err := os.MkdirAll(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			m := vmMeta{ID: "vm-1", SandboxID: "sb-1", State: "paused", Expires: time.Now().Add(time.Hour),
				Spec: vmSpec{ID: "vm-1", Dir: dir}, PausedTo: filepath.Join(dir, "paused.state"), PausedSize: tc.recorded}
			b, _ := json.Marshal(m)
			if err := os.WriteFile(filepath.Join(dir, "meta.json"), b, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "paused.state"), bytes.Repeat([]byte{1}, tc.onDisk), 0o600); err != nil {
				t.Fatal(err)
			}
			vm, why := d.adopt(dir, "vm-1")
			if (vm != nil) != tc.adopted {
				t.Fatalf("adopted: %v (why %q), want %v", vm != nil, why, tc.adopted)
			}
			if !tc.adopted && !strings.HasSuffix(why, tc.whyHasSuffix) {
				t.Errorf("why: %q, want it to end %q", why, tc.whyHasSuffix)
			}
			if vm != nil && vm.pausedSize != tc.recorded {
				t.Errorf("re-adopted with paused size %d, want %d (kept for its next record)", vm.pausedSize, tc.recorded)
			}
		})
	}
}
