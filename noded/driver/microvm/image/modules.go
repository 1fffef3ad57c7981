package image

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// GuestModules are the kernel modules the guest needs before its root is
// mounted, by name; their dependencies are added from modules.dep.
var GuestModules = []string{
	"virtio_mmio", "virtio_console", "virtio_blk", "virtio_net", "virtio_rng",
	"crc32c_generic", "ext4",
}

// moduleOrder returns the module files (relative to modDir) for names and
// their dependencies, each after everything it depends on.
func moduleOrder(modDir string, names []string) ([]string, error) {
	f, err := os.Open(filepath.Join(modDir, "modules.dep"))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	deps := map[string][]string{} // file -> files it needs
	byName := map[string]string{} // module name -> file
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		file, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		deps[file] = strings.Fields(rest)
		base := strings.TrimSuffix(filepath.Base(file), ".ko")
		byName[strings.ReplaceAll(base, "-", "_")] = file
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	var order []string
	seen := map[string]bool{}
	var visit func(file string)
	visit = func(file string) {
		if seen[file] {
			return
		}
		seen[file] = true
		for _, d := range deps[file] {
			visit(d)
		}
		order = append(order, file)
	}
	for _, n := range names {
		file, ok := byName[strings.ReplaceAll(n, "-", "_")]
		if !ok {
			// Built in, or absent from this kernel; the boot will tell.
			if builtinHas(modDir, n) {
				continue
			}
			return nil, fmt.Errorf("module %s: not in %s/modules.dep nor built in", n, modDir)
		}
		visit(file)
	}
	return order, nil
}

func builtinHas(modDir, name string) bool {
	b, err := os.ReadFile(filepath.Join(modDir, "modules.builtin"))
	if err != nil {
		return false
	}
	name = strings.ReplaceAll(name, "-", "_")
	for _, l := range strings.Split(string(b), "\n") {
		base := strings.TrimSuffix(filepath.Base(l), ".ko")
		if strings.ReplaceAll(base, "-", "_") == name {
			return true
		}
	}
	return false
}
