package microvm

// rdtsc reads the CPU's time-stamp counter.
func rdtsc() uint64
