package agent

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"
)

// The top-level declarations a repo map lists, by language (Go, Python,
// JavaScript/TypeScript, Rust, Java/C#/Kotlin classes), as ripgrep
// patterns, and the regexp that takes the name out of a match.
var (
	symbolPatterns = []string{
		`^func (\([^)]*\) )?[A-Za-z_]\w*`, `^type [A-Za-z_]\w*`,
		`^(async )?def [A-Za-z_]\w*`, `^class [A-Za-z_]\w*`,
		`^(export )?(default )?(async )?(function|class|interface) [A-Za-z_$][\w$]*`,
		`^(pub(\([^)]*\))? )?(fn|struct|enum|trait) [A-Za-z_]\w*`,
		`^(public |final |abstract )*(class|interface|record) [A-Za-z_]\w*`,
	}
	symbolName = regexp.MustCompile(`(?:func (?:\([^)]*\) )?|type |def |class |function |interface |fn |struct |enum |trait |record )([A-Za-z_$][\w$]*)`)
)

// MaxRepoMapBytes bounds the map the model sees.
const MaxRepoMapBytes = 24 << 10

// RepoMap computes the repository's files and their top-level symbols
// (once, at the task's start) and returns it.
func (t *Tools) RepoMap(ctx context.Context) (string, error) {
	files, err := t.SB.Exec(ctx, []string{"rg", "--files", "--sort", "path"}, t.Root, 2*time.Minute)
	if err != nil {
		return "", fmt.Errorf("repo_map: %w", err)
	}
	argv := []string{"rg", "--no-heading", "--line-number", "--color", "never", "--max-columns", "200"}
	for _, p := range symbolPatterns {
		argv = append(argv, "-e", p)
	}
	syms, err := t.SB.Exec(ctx, append(argv, "."), t.Root, 2*time.Minute)
	if err != nil {
		return "", fmt.Errorf("repo_map: %w", err)
	}
	bySym := map[string][]string{}
	for _, l := range strings.Split(string(syms.Stdout), "\n") {
		file, rest, ok := strings.Cut(l, ":")
		if !ok {
			continue
		}
		_, text, _ := strings.Cut(rest, ":")
		if m := symbolName.FindStringSubmatch(text); m != nil {
			file = strings.TrimPrefix(file, "./")
			if !slices.Contains(bySym[file], m[1]) {
				bySym[file] = append(bySym[file], m[1])
			}
		}
	}
	var sb strings.Builder
	for _, f := range strings.Split(strings.TrimSpace(string(files.Stdout)), "\n") {
		if f == "" {
			continue
		}
		sb.WriteString(f)
		if s := bySym[f]; len(s) > 0 {
			sb.WriteString(": " + strings.Join(s, ", "))
		}
		sb.WriteByte('\n')
		if sb.Len() > MaxRepoMapBytes {
			sb.WriteString("[the map is cut here; use list_files and search for the rest]\n")
			break
		}
	}
	t.repoMap = sb.String()
	return t.repoMap, nil
}
