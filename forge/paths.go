package forge

import (
	"fmt"
	"regexp"
	"strings"
)

// CIConfig and Manifests are the paths whose edits need a person's look:
// the agent's default policy sends edits of them for approval, and the
// diff checks flag them.
var (
	CIConfig = []string{".github/workflows/**", ".github/actions/**", ".gitlab-ci.yml", ".gitlab/**", ".circleci/**",
		".travis.yml", "Jenkinsfile", "azure-pipelines.yml", ".buildkite/**", ".drone.yml", "bitbucket-pipelines.yml"}
	Manifests = []string{"go.mod", "**/go.mod", "go.sum", "**/go.sum", "**/package.json", "**/package-lock.json", "**/yarn.lock",
		"**/pnpm-lock.yaml", "**/requirements*.txt", "**/pyproject.toml", "**/poetry.lock", "**/Pipfile", "**/Pipfile.lock",
		"**/setup.py", "**/setup.cfg", "**/Cargo.toml", "**/Cargo.lock", "**/pom.xml", "**/build.gradle", "**/build.gradle.kts",
		"**/Gemfile", "**/Gemfile.lock", "**/composer.json", "**/composer.lock"}
	// Tests are test files and directories of the common languages.
	Tests = []string{"**/*_test.go", "**/test_*.py", "**/*_test.py", "**/tests/**", "**/test/**", "**/__tests__/**",
		"**/*.test.js", "**/*.test.ts", "**/*.spec.js", "**/*.spec.ts", "**/*.test.jsx", "**/*.test.tsx", "**/*_spec.rb",
		"**/src/test/**", "**/*Test.java", "**/*_test.rs", "**/testdata/**"}
)

// GlobRegexp turns a glob of repository paths into an anchored regexp: *
// and ? stay within a path element, ** crosses them ("**/" also matches
// nothing). Every character matches, a newline too.
func GlobRegexp(g string) (*regexp.Regexp, error) {
	if strings.HasPrefix(g, "/") || strings.Contains(g, "..") {
		return nil, fmt.Errorf("%q: want a path relative to the repository root, without ..", g)
	}
	var sb strings.Builder
	// (?s): a name may hold a newline, which '.' would not match, and a
	// path with one ("a\nb/go.mod") would slip past every ** rule.
	sb.WriteString("(?s)^")
	for i := 0; i < len(g); i++ {
		switch c := g[i]; c {
		case '*':
			if i+1 < len(g) && g[i+1] == '*' {
				i++
				if i+1 < len(g) && g[i+1] == '/' {
					i++
					sb.WriteString("(?:.*/)?")
				} else {
					sb.WriteString(".*")
				}
			} else {
				sb.WriteString("[^/]*")
			}
		case '?':
			sb.WriteString("[^/]")
		default:
			// The run up to the next wildcard, whole: a byte at a time,
			// string(c) would make each byte of a multi-byte character a
			// character of its own (é would become Ã©), and the rule
			// would never match.
			j := i
			for j < len(g) && g[j] != '*' && g[j] != '?' {
				j++
			}
			sb.WriteString(regexp.QuoteMeta(g[i:j]))
			i = j - 1
		}
	}
	sb.WriteString("$")
	return regexp.Compile(sb.String())
}

// globSet matches a path against any of some globs.
type globSet []*regexp.Regexp

func mustGlobs(gs []string) globSet {
	var out globSet
	for _, g := range gs {
		re, err := GlobRegexp(g)
		if err != nil {
			panic(err)
		}
		out = append(out, re)
	}
	return out
}

func (s globSet) match(path string) bool {
	for _, re := range s {
		if re.MatchString(path) {
			return true
		}
	}
	return false
}
