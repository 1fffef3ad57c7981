package netpolicy

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// The policy profiles.
const (
	// ProfileNone allows no egress at all, not even DNS answers.
	ProfileNone = "none"
	// ProfileRegistries allows the package registries (DefaultRegistries,
	// or the node's configured list). It is the default.
	ProfileRegistries = "registries"
	// ProfileCustom allows exactly the policy's names and prefixes.
	ProfileCustom = "custom"
)

// DefaultRegistries are the names the registries profile allows: the Go
// module proxy and checksum database, PyPI, npm, crates.io, Maven Central and
// the Debian mirrors. A node can configure another list.
var DefaultRegistries = []string{
	"proxy.golang.org", "sum.golang.org", "storage.googleapis.com",
	"pypi.org", "files.pythonhosted.org",
	"registry.npmjs.org",
	"crates.io", "index.crates.io", "static.crates.io",
	"repo.maven.apache.org", "repo1.maven.org",
	"deb.debian.org", "security.debian.org",
}

// Policy is what one sandbox may reach.
type Policy struct {
	// Profile is ProfileNone, ProfileRegistries or ProfileCustom; "" means
	// ProfileRegistries.
	Profile string `json:"profile,omitempty"`
	// Allow lists host names, exact ("pypi.org") or as "*.suffix"
	// ("*.pythonhosted.org", which matches names under the suffix but not
	// the suffix itself). With ProfileRegistries they add to the
	// registries; with ProfileCustom they are the whole list.
	Allow []string `json:"allow,omitempty"`
	// AllowPrefixes are destinations allowed by address, on every port. They
	// are the only way past the always-denied ranges (private, link-local,
	// metadata, the node's own addresses, the cluster's ports).
	AllowPrefixes []netip.Prefix `json:"allow_prefixes,omitempty"`
}

// Normalize checks p and returns it with the profile filled in, names
// lower-cased and deduplicated. Errors start with the field at fault
// ("allow[2]: ..."), for the caller to prefix with where the policy came
// from.
func (p Policy) Normalize() (Policy, error) {
	out := Policy{Profile: p.Profile}
	if out.Profile == "" {
		out.Profile = ProfileRegistries
	}
	switch out.Profile {
	case ProfileNone:
		if len(p.Allow) > 0 || len(p.AllowPrefixes) > 0 {
			return Policy{}, fmt.Errorf("profile: %q allows nothing, but allow or allow_prefixes is set", ProfileNone)
		}
		return out, nil
	case ProfileRegistries, ProfileCustom:
	default:
		return Policy{}, fmt.Errorf("profile: %q is not one of none, registries, custom", p.Profile)
	}
	if len(p.Allow) > MaxNames {
		return Policy{}, fmt.Errorf("allow: %d names is over the limit of %d", len(p.Allow), MaxNames)
	}
	allow, err := normalizeNames("allow", p.Allow)
	if err != nil {
		return Policy{}, err
	}
	out.Allow = allow
	if len(p.AllowPrefixes) > MaxPrefixes {
		return Policy{}, fmt.Errorf("allow_prefixes: %d prefixes is over the limit of %d", len(p.AllowPrefixes), MaxPrefixes)
	}
	for i, pfx := range p.AllowPrefixes {
		if !pfx.IsValid() {
			return Policy{}, fmt.Errorf("allow_prefixes[%d]: not a valid prefix", i)
		}
		pfx = pfx.Masked()
		if pfx.Addr().Is4In6() {
			pfx = netip.PrefixFrom(pfx.Addr().Unmap(), pfx.Bits()-96)
		}
		if !slices.Contains(out.AllowPrefixes, pfx) {
			out.AllowPrefixes = append(out.AllowPrefixes, pfx)
		}
	}
	return out, nil
}

// normalizeNames lower-cases names, drops a final dot, checks each and
// removes repeats; an error names the entry as field[i].
func normalizeNames(field string, names []string) ([]string, error) {
	var out []string
	for i, n := range names {
		n = strings.TrimSuffix(strings.ToLower(n), ".")
		if err := checkPattern(n); err != nil {
			return nil, fmt.Errorf("%s[%d]: %w", field, i, err)
		}
		if !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return out, nil
}

// Limits on one policy, so a task cannot make the rules unbounded.
const (
	MaxNames    = 256
	MaxPrefixes = 64
)

// checkPattern accepts a lower-case DNS name or "*." followed by one.
func checkPattern(n string) error {
	name := strings.TrimPrefix(n, "*.")
	if name == "" {
		return fmt.Errorf("%q is empty", n)
	}
	if strings.Contains(name, "*") {
		return fmt.Errorf("%q: a wildcard is allowed only as a leading \"*.\"", n)
	}
	if len(name) > 253 {
		return fmt.Errorf("%q is longer than 253 characters", n)
	}
	for _, label := range strings.Split(name, ".") {
		if label == "" || len(label) > 63 {
			return fmt.Errorf("%q has an empty label or one over 63 characters", n)
		}
		for _, c := range label {
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return fmt.Errorf("%q: %q is not allowed in a host name", n, c)
			}
		}
		if label[0] == '-' || label[len(label)-1] == '-' {
			return fmt.Errorf("%q: a label starts or ends with '-'", n)
		}
	}
	return nil
}

// Matcher answers whether a name is allowed. Build one with Policy.Matcher;
// it is immutable and safe for concurrent use.
type Matcher struct {
	none     bool
	exact    map[string]bool
	suffixes []string // ".example.com"
}

// Matcher returns the name matcher of a normalized policy; registries is
// the node's list for ProfileRegistries (nil means DefaultRegistries).
func (p Policy) Matcher(registries []string) *Matcher {
	m := &Matcher{exact: map[string]bool{}}
	var names []string
	switch p.Profile {
	case ProfileNone:
		m.none = true
		return m
	case ProfileCustom:
		names = p.Allow
	default:
		if registries == nil {
			registries = DefaultRegistries
		}
		names = append(slices.Clone(registries), p.Allow...)
	}
	for _, n := range names {
		if s, ok := strings.CutPrefix(n, "*"); ok {
			m.suffixes = append(m.suffixes, s)
		} else {
			m.exact[n] = true
		}
	}
	return m
}

// Allowed reports whether name (any case, with or without the final dot)
// is on the list.
func (m *Matcher) Allowed(name string) bool {
	if m == nil || m.none {
		return false
	}
	name = strings.TrimSuffix(strings.ToLower(name), ".")
	if strings.ContainsRune(name, '\\') {
		// An escaped dot ("a\\.example.com") is one label holding a dot,
		// not a name under example.com: no pattern may match it.
		return false
	}
	if m.exact[name] {
		return true
	}
	for _, s := range m.suffixes {
		if len(name) > len(s) && strings.HasSuffix(name, s) {
			return true
		}
	}
	return false
}
