//go:build !linux

package guest

import "os"

// pipeSize is 1 MiB where a pipe's capacity cannot be read.
func pipeSize(*os.File) int { return 1 << 20 }
