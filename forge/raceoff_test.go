//go:build !race

package forge

// allocScale: see raceon_test.go.
const allocScale = 1
