package driver

import (
	"strings"
	"testing"
)

// A sandbox's memory over the host's is refused, naming the field: a
// guest told it has more than the host would push the host into its OOM
// killer. (The drivers allowed up to 64 GiB on any host.)
func TestMemoryOverTheHostsIsRefused(t *testing.T) {
	host := HostMemoryBytes() >> 20
	if host == 0 {
		t.Skip("no MemTotal in /proc/meminfo")
	}
	if err := CheckMemoryMB(int(host) + 1); err == nil || !strings.Contains(err.Error(), "limits.memory_mb") {
		t.Fatalf("memory of %d MiB on a host of %d MiB: %v, want refused", host+1, host, err)
	}
	if err := CheckMemoryMB(256); err != nil {
		t.Fatalf("256 MiB: %v", err)
	}
}
