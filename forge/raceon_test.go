//go:build race

package forge

// allocScale is how much more runtime.MemStats.TotalAlloc counts for the
// same work under the race detector, whose instrumented code allocates
// more (bytes.Buffer's growth about three times as much).
const allocScale = 3
