package netpolicy

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

func TestPolicyNormalize(t *testing.T) {
	p, err := Policy{}.Normalize()
	if err != nil || p.Profile != ProfileRegistries {
		t.Fatalf("default: %+v %v", p, err)
	}
	p, err = Policy{Profile: ProfileCustom, Allow: []string{"Example.COM.", "example.com", "*.pkg.dev"}}.Normalize()
	if err != nil || len(p.Allow) != 2 || p.Allow[0] != "example.com" {
		t.Fatalf("custom: %+v %v", p, err)
	}
	for _, c := range []struct {
		p    Policy
		want string
	}{
		{Policy{Profile: "open"}, "profile:"},
		{Policy{Profile: ProfileNone, Allow: []string{"a.org"}}, "allows nothing"},
		{Policy{Allow: []string{"a b.org"}}, "allow[0]"},
		{Policy{Allow: []string{"ok.org", "*"}}, "allow[1]"},
		{Policy{Allow: []string{"a.*.org"}}, "wildcard"},
		{Policy{Allow: []string{"-a.org"}}, "starts or ends"},
		{Policy{Allow: []string{"a..org"}}, "empty label"},
		{Policy{AllowPrefixes: []netip.Prefix{{}}}, "allow_prefixes[0]"},
		{Policy{Allow: make([]string, MaxNames+1)}, "over the limit"},
	} {
		if _, err := c.p.Normalize(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v; want an error with %q", c.p, err, c.want)
		}
	}
}

func TestMatcher(t *testing.T) {
	p, _ := Policy{Profile: ProfileCustom, Allow: []string{"pypi.org", "*.pythonhosted.org"}}.Normalize()
	m := p.Matcher(nil)
	for name, want := range map[string]bool{
		"pypi.org": true, "PyPI.org.": true, "files.pythonhosted.org": true, "a.b.pythonhosted.org": true,
		"pythonhosted.org": false, "evilpythonhosted.org": false, `x\.pythonhosted.org`: false, `evil\.files.pythonhosted.org`: false, "pypi.org.evil.com": false, "xpypi.org": false, "": false,
	} {
		if got := m.Allowed(name); got != want {
			t.Errorf("Allowed(%q) = %v, want %v", name, got, want)
		}
	}
	reg, _ := Policy{Allow: []string{"github.com"}}.Normalize()
	if m := reg.Matcher(nil); !m.Allowed("proxy.golang.org") || !m.Allowed("github.com") || m.Allowed("gitlab.com") {
		t.Error("registries plus an extra name")
	}
	none, _ := Policy{Profile: ProfileNone}.Normalize()
	if none.Matcher(nil).Allowed("proxy.golang.org") {
		t.Error("profile none allows a registry")
	}
}

func FuzzPolicyNormalize(f *testing.F) {
	f.Add("custom", "*.example.com", "10.0.0.0/8")
	f.Add("registries", "a..b", "::/0")
	f.Fuzz(func(t *testing.T, profile, name, pfx string) {
		var ps []netip.Prefix
		if p, err := netip.ParsePrefix(pfx); err == nil {
			ps = append(ps, p)
		}
		p, err := Policy{Profile: profile, Allow: []string{name}, AllowPrefixes: ps}.Normalize()
		if err != nil {
			return
		}
		// A normalized policy normalizes to itself and its matcher
		// allows what it lists.
		q, err := p.Normalize()
		if err != nil || len(q.Allow) != len(p.Allow) {
			t.Fatalf("not idempotent: %+v -> %+v, %v", p, q, err)
		}
		m := p.Matcher(nil)
		for _, n := range p.Allow {
			if !strings.HasPrefix(n, "*.") && !m.Allowed(n) {
				t.Fatalf("%q listed but not allowed", n)
			}
			if s, ok := strings.CutPrefix(n, "*."); ok && !m.Allowed("x."+s) {
				t.Fatalf("%q listed but x.%s not allowed", n, s)
			}
		}
	})
}

func TestPoolSlots(t *testing.T) {
	p, err := newPool(DefaultPrefix4, DefaultPrefix6)
	if err != nil {
		t.Fatal(err)
	}
	if p.slots() != 16383 {
		t.Fatalf("slots = %d", p.slots())
	}
	s := p.slot(1)
	if s.Host4.String() != "10.213.0.5" || s.Sandbox4.String() != "10.213.0.6" || s.Sandbox6.String() != "fd77:6172:7265::6" {
		t.Fatalf("slot 1 = %+v", s)
	}
	if r := p.slot(0); r.Host4.String() != "10.213.0.1" {
		t.Fatalf("resolver = %v", r.Host4)
	}
	rapid.Check(t, func(t *rapid.T) {
		i := rapid.IntRange(1, p.slots()).Draw(t, "i")
		s := p.slot(i)
		for _, a := range []netip.Addr{s.Sandbox4, s.Sandbox6} {
			if j, ok := p.slotOf(a); !ok || j != i {
				t.Fatalf("slotOf(%v) = %d %v, want %d", a, j, ok, i)
			}
		}
		for _, a := range []netip.Addr{s.Host4, s.Host6} {
			if _, ok := p.slotOf(a); ok {
				t.Fatalf("the node's end %v maps to a slot", a)
			}
		}
		if !p.p4.Contains(s.Sandbox4) || !p.p6.Contains(s.Sandbox6) {
			t.Fatalf("slot %d outside the pool: %+v", i, s)
		}
	})
	if _, err := newPool(netip.MustParsePrefix("10.0.0.0/30"), DefaultPrefix6); err == nil {
		t.Error("a /30 pool accepted")
	}
	if _, err := newPool(DefaultPrefix6, DefaultPrefix6); err == nil {
		t.Error("an IPv6 prefix accepted as prefix4")
	}
}

func TestRangesMerge(t *testing.T) {
	pf := func(s ...string) []netip.Prefix {
		var out []netip.Prefix
		for _, x := range s {
			out = append(out, netip.MustParsePrefix(x))
		}
		return out
	}
	got := ranges(pf("10.1.0.0/16", "10.0.0.0/8", "192.168.0.0/24", "192.168.1.0/24", "::1/128", "240.0.0.0/4"), false)
	want := []string{"10.0.0.0-10.255.255.255", "192.168.0.0-192.168.1.255", "240.0.0.0-255.255.255.255"}
	if len(got) != len(want) {
		t.Fatalf("got %v", got)
	}
	for i, r := range got {
		if s := r.from.String() + "-" + r.to.String(); s != want[i] {
			t.Errorf("range %d = %s, want %s", i, s, want[i])
		}
	}
	// Every denied range is in Deny4/Deny6 of computed rules, and every
	// address Denied reports is inside one of them.
	r := computeRules(Slot{}, []netip.Addr{netip.MustParseAddr("203.0.113.2")}, nil, nil, Policy{})
	in := func(a netip.Addr) bool {
		rs := r.Deny4
		if a.Is6() {
			rs = r.Deny6
		}
		for _, x := range rs {
			if x.from.Compare(a) <= 0 && a.Compare(x.to) <= 0 {
				return true
			}
		}
		return false
	}
	for _, a := range []string{"10.1.2.3", "169.254.169.254", "127.0.0.1", "203.0.113.2", "fe80::1", "fd00::1", "::ffff:10.0.0.1", "255.255.255.255"} {
		if !in(netip.MustParseAddr(a)) {
			t.Errorf("%s is not denied", a)
		}
	}
	for _, a := range []string{"198.51.100.10", "8.8.8.8", "2001:db8::1", "203.0.113.3"} {
		if in(netip.MustParseAddr(a)) {
			t.Errorf("%s is denied", a)
		}
	}
}

func TestSummarise(t *testing.T) {
	seen := map[attemptKey]uint64{}
	a := Attempt{Allowed: false, Addr: netip.MustParseAddr("198.51.100.20"), Proto: 6, Port: 80, Packets: 3}
	b, _ := summarise(seen, []Attempt{a}, nil)
	if len(b.Events) != 1 || b.Events[0].Count != 3 || b.Events[0].Verdict != "deny" || b.Events[0].Proto != "tcp" {
		t.Fatalf("first: %+v", b)
	}
	if b, _ := summarise(seen, []Attempt{a}, nil); len(b.Events) != 0 {
		t.Fatalf("unchanged counter reported again: %+v", b)
	}
	a.Packets = 5
	if b, _ := summarise(seen, []Attempt{a}, nil); len(b.Events) != 1 || b.Events[0].Count != 2 {
		t.Fatalf("delta: %+v", b)
	}
	// 100 attempts, half denied: 32 in the first batch (24 denials, 8
	// allowances), the rest in later ones; none is lost.
	var many []Attempt
	for i := range 100 {
		many = append(many, Attempt{Allowed: i%2 == 0, Addr: netip.AddrFrom4([4]byte{198, 51, 100, byte(i)}), Proto: 17, Port: 53, Packets: 1})
	}
	seen2 := map[attemptKey]uint64{}
	dns := []AuditEvent{{Verdict: "deny", Kind: "dns", Name: "x.test.", Count: 1}}
	reported := map[string]int{}
	for round := 0; round < 5; round++ {
		b, left := summarise(seen2, many, dns)
		dns = left
		if len(b.Events) > MaxAuditEvents {
			t.Fatalf("round %d: %d events", round, len(b.Events))
		}
		if round == 0 {
			var d, a int
			for _, e := range b.Events {
				if e.Verdict == "deny" {
					d++
				} else {
					a++
				}
			}
			if d != 24 || a != 8 || b.Omitted != 101-32 {
				t.Fatalf("first batch: %d denials, %d allowances, %d waiting", d, a, b.Omitted)
			}
		}
		for _, e := range b.Events {
			reported[e.Verdict+e.Addr+e.Name]++
		}
	}
	if len(reported) != 101 {
		t.Fatalf("%d of 101 attempts reported after 5 rounds", len(reported))
	}
	for k, n := range reported {
		if n != 1 {
			t.Fatalf("%s reported %d times", k, n)
		}
	}
}

// A destination tried once is reported even while the sandbox keeps 32
// others busy: events were ordered by count alone, so a flood of
// repeated attempts (two a second to each of 32 denied hosts) kept the
// single attempt 33rd, in Omitted only, until its entry left the audit
// set and it was forgotten, never on the task's log.
func TestASingleAttemptIsNotStarvedByAFlood(t *testing.T) {
	seen := map[attemptKey]uint64{}
	victim := Attempt{Addr: netip.MustParseAddr("169.254.169.254"), Proto: 6, Port: 80, Packets: 1}
	var flood []Attempt
	for i := range MaxAuditEvents {
		flood = append(flood, Attempt{Addr: netip.AddrFrom4([4]byte{198, 51, 100, byte(i)}), Proto: 6, Port: 443})
	}
	reported := false
	for round := 0; round < 600 && !reported; round++ {
		for i := range flood {
			flood[i].Packets += 2
		}
		b, _ := summarise(seen, append(slices.Clone(flood), victim), nil)
		for _, e := range b.Events {
			reported = reported || e.Addr == victim.Addr.String()
		}
	}
	if !reported {
		t.Fatalf("an attempt tried once was never reported in 600 rounds beside %d destinations tried twice a round", len(flood))
	}
}
