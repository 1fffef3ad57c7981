package netpolicy

import (
	"net/netip"
	"slices"
	"time"
)

// Hooks for the package's external tests.

// Pooled is the pool's pre-created, unclaimed sandboxes.
func (m *Manager) Pooled() []*Sandbox {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.ready)
}

// Hold takes the sandbox's lock until release is called, to stretch a
// window the code leaves open for the length of a netlink round trip.
func (s *Sandbox) Hold() (release func()) {
	s.mu.Lock()
	return s.mu.Unlock
}

// AllowedUntil is when the resolver last let addr through until, as the
// sandbox records it.
func (s *Sandbox) AllowedUntil(a netip.Addr) (time.Time, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t, ok := s.allowed[a]
	return t, ok
}

// SetStateSaveEvery shortens how often the periodic audit may rewrite a
// sandbox's record in StateDir (stateSaveEvery).
func SetStateSaveEvery(c *Config, d time.Duration) { c.stateSaveEvery = d }
