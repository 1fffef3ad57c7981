package api

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"time"

	"connectrpc.com/connect"
)

// BulkGateBytes is how many bytes of files, listings and stdin a node's
// or a server's sandbox API holds for its calls at once by default: each
// ReadFile holds up to MaxSandboxFileBytes, a ListFiles up to
// BulkGateListBytes, a WriteFile its data, an Exec its stdin. Without a
// bound, 100 concurrent ReadFiles of a 32 MiB file (requests of 70 bytes
// each) held several GB on the node and again on the server that
// forwarded them.
const BulkGateBytes = 512 << 20

// BulkGateListBytes is the room a ListFiles takes in a BulkGate: what one
// listing may hold on a node or on a server, about 195 MiB. A node's
// guest client takes at most 100,000 entries (guest's maxListEntries) of
// names of at most 255 bytes (guest.MaxNameBytes), and a taken-over guest
// can answer every listing with that many. Each such entry is held, at
// the call's peak, as the client's FileInfo and name (about 300 bytes), an
// API message with its timestamp (about 170), its name in it (up to 511:
// the node makes each run of bytes that are not UTF-8 a U+FFFD of 3) and
// the marshaled answer (up to 550); a server holds the answer it read,
// the messages it decoded and the answer it sends on. Measured at the
// peak (live heap, 100,000 entries of 255-byte names every other byte of
// which is not UTF-8): 1,850 bytes an entry on the node, 1,910 on the
// server; 2 KiB an entry bounds both. 50 concurrent ListFiles of such
// answers (70-byte requests) held several GB on the node and again on the
// server.
const BulkGateListBytes = 100_000 << 11

// BulkGateWait is how long a call waits for room in a BulkGate before it
// is refused with resource_exhausted (which clients retry).
const BulkGateWait = 30 * time.Second

// BulkGate bounds the bytes of file data, listings and stdin the calls of
// a sandbox API hold at once. A call waits for room up to its deadline or
// the gate's wait. A call that fits goes through even while a larger one
// waits: the larger one waits at most the gate's wait, whereas queueing
// behind it left every 32 MiB ReadFile waiting 30 s, and refused, while a
// ListFiles waited for room there was no need of.
type BulkGate struct {
	total int64
	wait  time.Duration

	mu   sync.Mutex
	used int64
	// freed is closed, and replaced, at each release: a waiter reads it
	// under mu, with used, so no release between its look and its wait
	// is missed.
	freed chan struct{}
}

// NewBulkGate is a gate of total bytes whose calls wait at most wait.
func NewBulkGate(total int64, wait time.Duration) *BulkGate {
	return &BulkGate{total: total, wait: wait, freed: make(chan struct{})}
}

// Take reserves n bytes for a call (what names it, for the error) and
// returns the release, which may be called more than once. A call of more
// than the gate holds takes all of it.
func (g *BulkGate) Take(ctx context.Context, what string, n int64) (release func(), err error) {
	n = min(max(n, 1), g.total)
	var timeout <-chan time.Time
	for {
		g.mu.Lock()
		if g.used+n <= g.total {
			g.used += n
			g.mu.Unlock()
			var once sync.Once
			return func() { once.Do(func() { g.release(n) }) }, nil
		}
		freed := g.freed
		g.mu.Unlock()
		if timeout == nil {
			t := time.NewTimer(g.wait)
			defer t.Stop()
			timeout = t.C
		}
		select {
		case <-freed:
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-timeout:
			return nil, connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("%s: other calls hold all %d MiB of file, listing and stdin data this API holds at once, and none ended within %v; try again",
				what, g.total>>20, g.wait))
		}
	}
}

func (g *BulkGate) release(n int64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.used -= n
	close(g.freed)
	g.freed = make(chan struct{})
}

// TakeUntilSent is Take for a call whose answer is written after its
// handler returns (connect-go marshals and writes a unary answer then,
// after its interceptors too) and holds the data the room was taken for:
// a file, a listing. Served through HoldUntilServed, the room is held
// until the answer is written, and the release returned frees nothing;
// otherwise (a handler called directly) the release frees the room. A
// release deferred in the handler gave the room back before the answer
// was sent: a client that read nothing kept each answer's 32 MiB, and
// the marshaled copy, while the gate let more calls in.
func (g *BulkGate) TakeUntilSent(ctx context.Context, what string, n int64) (release func(), err error) {
	release, err = g.Take(ctx, what, n)
	if err != nil {
		return nil, err
	}
	held, ok := ctx.Value(heldKey{}).(*heldRoom)
	if !ok {
		return release, nil
	}
	held.hold(release)
	return func() {}, nil
}

// HoldUntilServed serves h with a holder, in each request's context, for
// the room its call takes with TakeUntilSent, and releases that room when
// h's ServeHTTP returns, its answer written (or its write failed). Give
// the answers' writes a deadline too (httpdeadline), or a client that
// reads nothing holds the room for as long as it keeps the connection.
func HoldUntilServed(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		held := &heldRoom{}
		defer held.releaseAll()
		h.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), heldKey{}, held)))
	})
}

type heldKey struct{}

// heldRoom is the room one request's call holds until its answer is
// written.
type heldRoom struct {
	mu       sync.Mutex
	releases []func()
	done     bool // the request is served: later room is released at once
}

func (h *heldRoom) hold(release func()) {
	h.mu.Lock()
	if !h.done {
		h.releases = append(h.releases, release)
		h.mu.Unlock()
		return
	}
	h.mu.Unlock()
	release()
}

func (h *heldRoom) releaseAll() {
	h.mu.Lock()
	rs := h.releases
	h.releases, h.done = nil, true
	h.mu.Unlock()
	for _, r := range rs {
		r()
	}
}
