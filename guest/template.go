package guest

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// A template is a directory made by `warren image build`:
//
//	<root>/<name>/<version>/manifest.json
//	                        vmlinux        the PVH kernel, uncompressed
//	                        vmlinux-up     optional: its uniprocessor build
//	                        initramfs.cpio warren-guest as /init, modules
//	                        rootfs.ext4    the root file system
//	<root>/<name>/current -> <version>
//
// The version is derived from the artifacts' checksums, so a directory's
// name says what is in it.
const ManifestFile = "manifest.json"

// Manifest describes a template.
type Manifest struct {
	Name          string   `json:"name"`
	Version       string   `json:"version"`
	Created       string   `json:"created"`
	KernelRelease string   `json:"kernel_release"`
	Kernel        Artifact `json:"kernel"`
	// KernelUP, when set, is a uniprocessor build of the same kernel
	// (CONFIG_SMP off), with every driver built in. Guests with one vCPU
	// (the template's snapshot, its clones and one-vCPU cold boots) run
	// it; Kernel runs guests with more. Under TCG a one-vCPU guest runs
	// the uniprocessor build's code faster, and a fresh clone has less of
	// it to translate (docs/sandboxes.md, "The guest kernel").
	KernelUP        *Artifact `json:"kernel_up,omitempty"`
	KernelUPRelease string    `json:"kernel_up_release,omitempty"`
	Initramfs       Artifact  `json:"initramfs"`
	Rootfs          Artifact  `json:"rootfs"`
	Agent           Artifact  `json:"agent"`
	QEMUVersion     string    `json:"qemu_version"`
	// Accelerator is the one the build's smoke boot ran on.
	Accelerator string   `json:"accelerator"`
	Packages    []string `json:"packages"`
	Suite       string   `json:"suite"`
	// BootMS is how long the smoke boot took to the agent's first answer.
	BootMS int64 `json:"boot_ms"`
	// DiskBytes is the root file system's size: the sandbox's disk quota.
	DiskBytes int64 `json:"disk_bytes"`
}

// Artifact is one file of a template.
type Artifact struct {
	File   string `json:"file"`
	SHA256 string `json:"sha256"`
	Size   int64  `json:"size"`
}

// Template is a loaded template.
type Template struct {
	Dir string
	Manifest
}

// Path returns the absolute path of an artifact.
func (t *Template) Path(a Artifact) string { return filepath.Join(t.Dir, a.File) }

// KernelFor returns the kernel a guest with vcpus vCPUs boots and its
// release: KernelUP for one vCPU when the template has it, else Kernel.
func (t *Template) KernelFor(vcpus int) (Artifact, string) {
	if vcpus <= 1 && t.KernelUP != nil {
		return *t.KernelUP, t.KernelUPRelease
	}
	return t.Kernel, t.KernelRelease
}

// Artifacts returns every file of the template the manifest checksums.
func (m *Manifest) Artifacts() []Artifact {
	as := []Artifact{m.Kernel}
	if m.KernelUP != nil {
		as = append(as, *m.KernelUP)
	}
	return append(as, m.Initramfs, m.Rootfs)
}

// ErrNoTemplate is returned when a template is not in the store.
var ErrNoTemplate = errors.New("template not found")

// LoadTemplate reads root/name/current (or root/name/version when name is
// "name@version"). It checks that the artifacts exist with their sizes;
// Verify checks their contents.
func LoadTemplate(root, name string) (*Template, error) {
	name, version, hasVersion := strings.Cut(name, "@")
	if !plainName(name) {
		return nil, fmt.Errorf("template %q: invalid name", name)
	}
	if hasVersion && !plainName(version) {
		return nil, fmt.Errorf("template %q: invalid version %q", name, version)
	}
	if version == "" {
		version = "current"
	}
	dir, err := filepath.EvalSymlinks(filepath.Join(root, name, version))
	if err != nil {
		return nil, fmt.Errorf("template %q in %s: %w", name, root, ErrNoTemplate)
	}
	b, err := os.ReadFile(filepath.Join(dir, ManifestFile))
	if err != nil {
		return nil, fmt.Errorf("template %q: %w", name, err)
	}
	t := &Template{Dir: dir}
	if err := json.Unmarshal(b, &t.Manifest); err != nil {
		return nil, fmt.Errorf("template %q: manifest: %w", name, err)
	}
	for _, a := range t.Artifacts() {
		if !plainName(a.File) {
			return nil, fmt.Errorf("template %q: manifest: artifact %q is not a file name in the template's directory", name, a.File)
		}
		fi, err := os.Stat(t.Path(a))
		if err != nil {
			return nil, fmt.Errorf("template %q: %w", name, err)
		}
		if fi.Size() != a.Size {
			return nil, fmt.Errorf("template %q: %s is %d bytes, manifest says %d", name, a.File, fi.Size(), a.Size)
		}
	}
	return t, nil
}

// plainName reports whether s names an entry of one directory: not empty,
// no separator, and not "." or ".." (nor anything hidden).
func plainName(s string) bool {
	return s != "" && !strings.ContainsAny(s, "/\\") && !strings.HasPrefix(s, ".")
}

// ListTemplates returns the names of the templates under root that have a
// current version.
func ListTemplates(root string) []string {
	ms, _ := filepath.Glob(filepath.Join(root, "*", "current", ManifestFile))
	var names []string
	for _, m := range ms {
		names = append(names, filepath.Base(filepath.Dir(filepath.Dir(m))))
	}
	sort.Strings(names)
	return names
}

// Verify recomputes every artifact's checksum.
func (t *Template) Verify() error {
	for _, a := range t.Artifacts() {
		sum, _, err := FileSHA256(t.Path(a))
		if err != nil {
			return err
		}
		if sum != a.SHA256 {
			return fmt.Errorf("template %s: %s checksum %s, manifest says %q", t.Name, a.File, sum[:12], a.SHA256[:min(12, len(a.SHA256))])
		}
	}
	return nil
}

// FileSHA256 returns a file's checksum and size.
func FileSHA256(path string) (string, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return "", 0, err
	}
	return hex.EncodeToString(h.Sum(nil)), n, nil
}
