package noded

import (
	"math"
	"sync/atomic"
	"time"

	"github.com/warrenhq/warren/noded/driver"
)

// Histogram buckets for append latency: bucket i holds latencies up to
// bucketBase × bucketGrowth^i (50 µs growing by 15%, about 800 s at the top).
const (
	bucketBase   = 50 * time.Microsecond
	bucketGrowth = 1.15
	nBuckets     = 120
)

// Metrics counts what the task actors of one process did; daemons in one
// process may share it. All methods are safe for concurrent use.
type Metrics struct {
	appends, appendErrors atomic.Uint64
	events                atomic.Uint64 // events in the successful appends
	lastAppend            atomic.Int64  // unix nanoseconds of the last success
	recordedRunning       atomic.Uint64
	buckets               [nBuckets]atomic.Uint64
	// Sandbox claims by how they started: warm (from a pool), restore (a
	// cold claim from the snapshot), boot (from scratch).
	claimsWarm, claimsRestore, claimsBoot atomic.Uint64
}

// claimed counts one sandbox claim by how it started.
func (m *Metrics) claimed(sb driver.Sandbox) {
	if m == nil {
		return
	}
	start := driver.StartBoot
	if ia, ok := sb.(driver.Interactive); ok {
		start = ia.Info().Start
	} else if sb.Warm() {
		start = driver.StartWarm
	} else {
		start = driver.StartRestore
	}
	switch start {
	case driver.StartWarm:
		m.claimsWarm.Add(1)
	case driver.StartRestore:
		m.claimsRestore.Add(1)
	default:
		m.claimsBoot.Add(1)
	}
}

// MetricsSnapshot is a point-in-time copy, as served by `warren node
// --metrics` in JSON.
type MetricsSnapshot struct {
	Time     time.Time `json:"time"`
	Nodes    int       `json:"nodes"`
	Running  int       `json:"running"` // task actors now
	Started  int       `json:"started"`
	Finished int       `json:"finished"`
	Yielded  int       `json:"yielded"`
	// Drain requests to give a task back the node recorded, and those
	// withdrawn before the task's actor acted on them: by an uncordon, or
	// dropped when their session ended. (A request whose task ended
	// another way, cancelled for one, is in neither of the last two.)
	YieldAsked     int `json:"yield_asked"`
	YieldWithdrawn int `json:"yield_withdrawn"`
	StoppedStale   int `json:"stopped_stale"`
	Sessions       int `json:"sessions"`
	// Task actors that recorded state_changed to running (once per lease).
	RecordedRunning    uint64 `json:"recorded_running"`
	Appends            uint64 `json:"appends"` // successful append calls
	Events             uint64 `json:"events"`  // events those calls appended
	AppendErrors       uint64 `json:"append_errors"`
	LastAppendUnixNano int64  `json:"last_append_unix_nano"`
	// Latency histogram: Buckets[i] counts appends that took at most
	// BucketBaseMicros × BucketGrowth^i microseconds.
	// Sandbox claims by how they started ("warm" from a pool; "restore" and
	// "boot" are cold).
	ClaimsWarm       uint64   `json:"claims_warm"`
	ClaimsRestore    uint64   `json:"claims_restore"`
	ClaimsBoot       uint64   `json:"claims_boot"`
	Buckets          []uint64 `json:"buckets"`
	BucketBaseMicros float64  `json:"bucket_base_micros"`
	BucketGrowth     float64  `json:"bucket_growth"`
}

func (m *Metrics) observe(d time.Duration, events int, err error) {
	if err != nil {
		m.appendErrors.Add(1)
		return
	}
	m.appends.Add(1)
	m.events.Add(uint64(events))
	m.lastAppend.Store(time.Now().UnixNano())
	i := 0
	if d > bucketBase {
		i = int(math.Ceil(math.Log(float64(d)/float64(bucketBase)) / math.Log(bucketGrowth)))
	}
	m.buckets[min(i, nBuckets-1)].Add(1)
}

// Snapshot copies the counters and adds the daemons' actor counts.
func (m *Metrics) Snapshot(daemons []*Daemon) MetricsSnapshot {
	s := MetricsSnapshot{Time: time.Now(), Nodes: len(daemons), Appends: m.appends.Load(), Events: m.events.Load(), AppendErrors: m.appendErrors.Load(),
		LastAppendUnixNano: m.lastAppend.Load(), RecordedRunning: m.recordedRunning.Load(), Buckets: make([]uint64, nBuckets),
		ClaimsWarm: m.claimsWarm.Load(), ClaimsRestore: m.claimsRestore.Load(), ClaimsBoot: m.claimsBoot.Load(),
		BucketBaseMicros: float64(bucketBase) / float64(time.Microsecond), BucketGrowth: bucketGrowth}
	for i := range s.Buckets {
		s.Buckets[i] = m.buckets[i].Load()
	}
	for _, d := range daemons {
		st := d.Stats()
		s.Running += d.Running()
		s.Started += st.Started
		s.Finished += st.Finished
		s.Yielded += st.Yielded
		s.YieldAsked += st.YieldAsked
		s.YieldWithdrawn += st.YieldWithdrawn
		s.StoppedStale += st.StoppedStale
		s.Sessions += st.Sessions
	}
	return s
}

// BucketBound returns the upper bound of histogram bucket i.
func BucketBound(base time.Duration, growth float64, i int) time.Duration {
	return time.Duration(float64(base) * math.Pow(growth, float64(i)))
}
