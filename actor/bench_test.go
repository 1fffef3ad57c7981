package actor

import (
	"context"
	"runtime"
	"slices"
	"testing"
	"time"
)

// benchActors is the scale warren's node must host.
const benchActors = 40_000

// idle is a stateless behaviour, so measured bytes are the runtime's own.
var idle = func() Behavior { return BehaviorFunc(func(c *Context, msg any) { c.Reply(msg) }) }

func spawnMany(b *testing.B, s *System, n int) []*Ref {
	refs := make([]*Ref, n)
	for i := range refs {
		r, err := s.Spawn("", idle)
		if err != nil {
			b.Fatal(err)
		}
		refs[i] = r
	}
	return refs
}

func shutdown(b *testing.B, s *System) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := s.Shutdown(ctx); err != nil {
		b.Fatal(err)
	}
}

// liveBytes is the heap in use plus goroutine stacks, after a full GC.
func liveBytes() uint64 {
	var m runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&m)
	return m.HeapAlloc + m.StackInuse
}

// BenchmarkIdleActorMemory spawns 40,000 actors that never receive a
// message and reports the bytes each costs (heap and stacks).
func BenchmarkIdleActorMemory(b *testing.B) {
	benchIdleMemory(b, false)
}

// BenchmarkIdleActorMemoryAfterUse is the same after every actor handled
// one Request and went idle again.
func BenchmarkIdleActorMemoryAfterUse(b *testing.B) {
	benchIdleMemory(b, true)
}

func benchIdleMemory(b *testing.B, use bool) {
	var perActor, goroutines float64
	for range b.N {
		b.StopTimer()
		s := NewSystem(Config{})
		refs := make([]*Ref, 0, benchActors)
		g0 := runtime.NumGoroutine()
		before := liveBytes()
		b.StartTimer()
		for range benchActors {
			r, err := s.Spawn("", idle)
			if err != nil {
				b.Fatal(err)
			}
			refs = append(refs, r)
		}
		if use {
			for i, r := range refs {
				if _, err := r.Request(context.Background(), i); err != nil {
					b.Fatal(err)
				}
			}
		}
		b.StopTimer()
		after := liveBytes()
		perActor = float64(int64(after)-int64(before)) / benchActors
		goroutines = float64(runtime.NumGoroutine() - g0)
		runtime.KeepAlive(refs)
		shutdown(b, s)
		b.StartTimer()
	}
	b.ReportMetric(perActor, "B/actor")
	b.ReportMetric(goroutines, "goroutines")
}

// BenchmarkRoundTrip measures Request/reply to one of 40,000 actors, each
// idle (no goroutine) until the request arrives, and reports percentiles.
func BenchmarkRoundTrip(b *testing.B) {
	s := NewSystem(Config{})
	defer shutdown(b, s)
	refs := spawnMany(b, s, benchActors)
	ctx := context.Background()
	durs := make([]time.Duration, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		r := refs[i%len(refs)]
		t0 := time.Now()
		if _, err := r.Request(ctx, i); err != nil {
			b.Fatal(err)
		}
		durs[i] = time.Since(t0)
	}
	b.StopTimer()
	slices.Sort(durs)
	b.ReportMetric(float64(durs[len(durs)/2]), "p50-ns")
	b.ReportMetric(float64(durs[len(durs)*99/100]), "p99-ns")
}
