package netpolicy

import "slices"

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
