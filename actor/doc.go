// Package actor is warren's actor runtime: it spawns actors (a behaviour
// plus a bounded mailbox) under a supervisor, delivers messages with Send,
// SendContext and Request, stops them, restarts them after a panic under a
// RestartPolicy (at most MaxRestarts within Window, with exponential
// Backoff) and escalates to the parent when the policy gives up. Timers come
// from an injected Clock (RealClock in production, FakeClock in tests);
// panics are logged through an injected *slog.Logger under the key "actor";
// Ref.Stats and System.Metrics expose mailbox depth, restart and panic
// counters.
//
// Actors are run on demand: an idle actor owns no goroutine. A goroutine is
// started when a message arrives in an empty mailbox and exits when the
// mailbox drains, so tens of thousands of idle actors cost a few hundred
// bytes each. Messages from one sender are delivered in the order sent.
//
// actor knows nothing about tasks and imports no other warren package.
package actor
