//go:build !amd64

package microvm

// rdtsc is 0 where there is no x86 time-stamp counter.
func rdtsc() uint64 { return 0 }
