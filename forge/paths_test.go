package forge

import "testing"

// A glob matches paths as written, characters beyond ASCII included: a
// deny rule on docs/résumé.md must not let a write to it through.
func TestGlobRegexp(t *testing.T) {
	for _, c := range []struct {
		glob, path string
		want       bool
	}{
		{"docs/résumé.md", "docs/résumé.md", true},
		{"**/日本.txt", "a/日本.txt", true},
		{"**/日本.txt", "日本.txt", true},
		{"d?c/*.md", "dóc/x.md", true},
		{"src/*.go", "src/a.go", true},
		{"src/*.go", "src/a/b.go", false},
		{"src/**", "src/a/b.go", true},
		{"a+b.(c)", "a+b.(c)", true},
		{"a+b.(c)", "aab.xc", false},
		{"docs/résumé.md", "docs/resume.md", false},
		// A newline in a name is a character like any other.
		{".github/workflows/**", ".github/workflows/x\n.yml", true},
		{"**/go.mod", "a\nb/go.mod", true},
		{"src/*.go", "src/a\nb.go", true},
		{"d?c", "d\nc", true},
	} {
		re, err := GlobRegexp(c.glob)
		if err != nil {
			t.Fatalf("%q: %v", c.glob, err)
		}
		if got := re.MatchString(c.path); got != c.want {
			t.Errorf("%q against %q: %v, want %v (regexp %s)", c.glob, c.path, got, c.want, re)
		}
	}
}
