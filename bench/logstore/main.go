// Command logstore compares raftlog (Pebble) with raft-boltdb/v2 and
// raft-wal as hashicorp/raft LogStores on this machine's disk: synced
// appends of 1, 16 and 256 entries of 1 KiB, random GetLog, and deletion of
// the oldest entries. Each figure is the median over -runs runs of the mean
// time of one call; every store starts empty in its own directory under
// -dir, and all three run interleaved so drift hits them alike.
//
//	go run . [-runs 3] [-time 1s] [-out results.md] [-dir /tmp]
package main

import (
	"flag"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"
)

var (
	runs   = flag.Int("runs", 3, "runs of each measurement; the table shows the median")
	budget = flag.Duration("time", 800*time.Millisecond, "timed duration of each measurement")
	out    = flag.String("out", "", "also write the table to this file")
	tmpDir = flag.String("dir", os.TempDir(), "directory for the stores (all on the same disk)")
)

func main() {
	flag.Parse()
	if *runs < 1 {
		fmt.Fprintln(os.Stderr, "logstore: -runs must be at least 1")
		os.Exit(2)
	}
	// results[op][kind] holds one duration per run.
	results := make([][][]time.Duration, len(operations))
	for i := range results {
		results[i] = make([][]time.Duration, len(kinds))
	}
	start := time.Now()
	for run := range *runs {
		for i, op := range operations {
			for j, k := range kinds {
				d, err := op.measure(k, *budget)
				if err != nil {
					fmt.Fprintf(os.Stderr, "logstore: %s on %s: %v\n", op.name, k.name, err)
					os.Exit(1)
				}
				results[i][j] = append(results[i][j], d)
				fmt.Fprintf(os.Stderr, "run %d/%d  %-30s %-8s %v\n", run+1, *runs, op.name, k.name, d)
			}
		}
	}
	table := render(results)
	fmt.Fprintf(os.Stderr, "total %v\n", time.Since(start).Round(time.Second))
	fmt.Print(table)
	if *out != "" {
		if err := os.WriteFile(*out, []byte(table), 0o644); err != nil {
			fmt.Fprintf(os.Stderr, "logstore: %v\n", err)
			os.Exit(1)
		}
	}
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func render(results [][][]time.Duration) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Time per call, median of %d runs of %v each (%s/%s, %d CPUs, %s, stores in %s; every write synced).\n",
		*runs, *budget, runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.Version(), *tmpDir)
	fmt.Fprintf(&b, "Ratios are speed ratios, other time / our time: >1 means ours is faster.\n\n")
	b.WriteString("| operation | ours | boltdb | raft-wal | ours/boltdb (>1 = ours faster) | ours/wal (>1 = ours faster) |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|\n")
	for i, op := range operations {
		m := make([]time.Duration, len(kinds))
		for j := range kinds {
			m[j] = median(results[i][j])
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %.2f× | %.2f× |\n", op.name,
			format(m[0]), format(m[1]), format(m[2]),
			float64(m[1])/float64(m[0]), float64(m[2])/float64(m[0]))
	}
	return b.String()
}

func format(d time.Duration) string {
	switch {
	case d >= time.Millisecond:
		return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond))
	case d >= time.Microsecond:
		return fmt.Sprintf("%.1f µs", float64(d)/float64(time.Microsecond))
	default:
		return fmt.Sprintf("%d ns", d.Nanoseconds())
	}
}
