package actor

// Stats is a snapshot of one actor's counters.
type Stats struct {
	Mailbox    int    // messages queued now
	MaxMailbox int    // most messages ever queued at once
	MailboxCap int    // capacity given at Spawn
	Received   uint64 // messages handed to the behaviour
	Rejected   uint64 // Sends refused with ErrMailboxFull
	Panics     uint64 // panics recovered from the behaviour
	Restarts   uint64 // restarts under the RestartPolicy
	Stopped    bool   // Stop was called or the actor escalated
}

// Stats returns the actor's counters.
func (r *Ref) Stats() Stats {
	r.mu.Lock()
	defer r.mu.Unlock()
	return Stats{
		Mailbox:    int(r.box.n),
		MaxMailbox: int(r.stats.maxDepth),
		MailboxCap: int(r.cap),
		Received:   r.stats.received,
		Rejected:   uint64(r.stats.rejected),
		Panics:     uint64(r.stats.panics),
		Restarts:   uint64(r.stats.restarts),
		Stopped:    r.stopping,
	}
}

// Metrics is a snapshot of a System's gauges and counters. Counters only
// grow; gauges are read one at a time, so under load they may not add up
// exactly.
type Metrics struct {
	Actors       int64  // gauge: spawned and not yet terminated
	Active       int64  // gauge: actors running on a goroutine right now
	MailboxDepth int64  // gauge: messages queued over all actors
	Received     uint64 // messages handed to behaviours
	Rejected     uint64 // Sends refused with ErrMailboxFull
	Panics       uint64 // panics recovered
	Restarts     uint64 // restarts
	Escalations  uint64 // actors stopped for failing too often
}

// Metrics returns the system's gauges and counters.
func (s *System) Metrics() Metrics {
	m := &s.m
	return Metrics{
		Actors:       m.actors.Load(),
		Active:       m.active.Load(),
		MailboxDepth: m.depth.Load(),
		Received:     m.received.Load(),
		Rejected:     m.rejected.Load(),
		Panics:       m.panics.Load(),
		Restarts:     m.restarts.Load(),
		Escalations:  m.escalate.Load(),
	}
}
