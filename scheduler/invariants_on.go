//go:build invariants

package scheduler

// invariants turns on cheap state-transition assertions (make test builds
// with -tags invariants). Release builds compile them out.
const invariants = true
