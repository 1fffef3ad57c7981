//go:build !invariants

package scheduler

const invariants = false
