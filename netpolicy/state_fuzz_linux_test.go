package netpolicy

import (
	"encoding/json"
	"strings"
	"testing"
)

// FuzzSandboxState: a sandbox's state file, as reattach reads it, is
// refused or gives a policy whose matcher answers without a panic, and
// allows only listed names and names under listed "*." suffixes.
func FuzzSandboxState(f *testing.F) {
	f.Add([]byte(`{"id":"s","policy":{"profile":"custom","allow":["*.example.com","A.b."],"allow_prefixes":["10.0.0.0/8"]},"seen":[{"addr":"1.2.3.4","proto":6,"port":443,"packets":3}]}`), "x.example.com.")
	f.Add([]byte(`{"policy":{"profile":"none"}}`), "pypi.org")
	f.Fuzz(func(t *testing.T, b []byte, name string) {
		var st sandboxState
		if json.Unmarshal(b, &st) != nil {
			return
		}
		p, err := st.Policy.Normalize()
		if err != nil {
			return
		}
		m := p.Matcher([]string{})
		if !m.Allowed(name) {
			return
		}
		n := strings.TrimSuffix(strings.ToLower(name), ".")
		for _, a := range p.Allow {
			if a == n {
				return
			}
			if s, ok := strings.CutPrefix(a, "*."); ok && strings.HasSuffix(n, "."+s) && len(n) > len(s)+1 {
				return
			}
		}
		t.Fatalf("%q allowed by %+v", name, p)
	})
}
