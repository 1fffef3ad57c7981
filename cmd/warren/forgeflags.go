package main

import (
	"flag"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	"github.com/warrenhq/warren/agent"
	"github.com/warrenhq/warren/forge"
)

// forgeFlags are the node's git service settings: where agent branches
// are pushed and pull requests opened, and what the diff checks do. The
// token comes only from the environment (WARREN_FORGE_TOKEN).
type forgeFlags struct {
	kind, url, user, checks, hosts string
	draft, allowLocal              bool
	maxFiles, maxLines, maxKiB     int
}

func (f *forgeFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.kind, "forge", "none", "agent tasks: where pull requests are opened: github, gitea, forgejo, gitlab or none (the branch is pushed to the task's repository and the PR is recorded in the task's log only); the token is WARREN_FORGE_TOKEN")
	fs.StringVar(&f.url, "forge-url", "", "the forge's API base URL (github: https://api.github.com by default; gitea/forgejo: required, e.g. https://gitea.example.com; gitlab: https://gitlab.com by default)")
	fs.StringVar(&f.user, "forge-user", "", "the user git sends with the token over HTTP(S) (default x-access-token)")
	fs.BoolVar(&f.draft, "pr-draft", false, "open pull requests as drafts")
	fs.StringVar(&f.hosts, "forge-git-hosts", "", "the forge's git hosts (host or host:port, comma-separated): only their https repositories (http on loopback) get the token, and only they get pull requests (default: github.com for github without --forge-url, else --forge-url's host, without a leading api. for github)")
	fs.BoolVar(&f.allowLocal, "allow-local-repos", false, "let tasks name repositories on this node (absolute paths, file://); off on a shared node, where any tenant could read any repository the node can")
	fs.StringVar(&f.checks, "diff-checks", "", "what each diff finding does, KIND=ACTION comma-separated: kinds secret, ci_config, manifest, tests, size; actions block, approve, flag (default secret=block,ci_config=approve,manifest=approve,tests=flag,size=block)")
	fs.IntVar(&f.maxFiles, "diff-max-files", 100, "the size check: most files a diff may change")
	fs.IntVar(&f.maxLines, "diff-max-lines", 5000, "the size check: most lines a diff may add and delete")
	fs.IntVar(&f.maxKiB, "diff-max-file-kib", 1024, "the size check: most KiB a diff may add to one file")
}

// service builds the node's git service under dataDir.
func (f *forgeFlags) service(dataDir string) (*agent.GitService, error) {
	actions, err := forge.ParseActions(f.checks)
	if err != nil {
		return nil, fmt.Errorf("diff-checks: %w", err)
	}
	if f.maxFiles < 1 || f.maxLines < 1 || f.maxKiB < 1 {
		return nil, fmt.Errorf("diff-max-files, diff-max-lines, diff-max-file-kib: must be positive, got %d, %d, %d", f.maxFiles, f.maxLines, f.maxKiB)
	}
	if f.maxKiB > 1<<30 { // KiB: 1 TiB; past 2^53 the shift to bytes wrapped negative, which meant the default
		return nil, fmt.Errorf("diff-max-file-kib: %d is over the limit of %d (1 TiB)", f.maxKiB, 1<<30)
	}
	token := os.Getenv("WARREN_FORGE_TOKEN")
	var fg forge.Forge
	if f.kind != "" && f.kind != "none" {
		if fg, err = forge.New(f.kind, f.url, token); err != nil {
			return nil, err
		}
	} else if f.url != "" {
		return nil, fmt.Errorf("forge-url: set, but --forge is none")
	}
	var auth *forge.Auth
	if token != "" {
		auth = &forge.Auth{User: f.user, Token: token}
	}
	checks := forge.CheckConfig{Actions: actions, MaxFiles: f.maxFiles, MaxLines: f.maxLines, MaxFileBytes: f.maxKiB << 10}
	g := agent.NewGitService(filepath.Join(dataDir, "git"), fg, auth, checks, f.draft)
	g.AllowLocal = f.allowLocal
	g.Hosts = splitComma(f.hosts)
	if len(g.Hosts) == 0 && fg != nil {
		switch u, err := url.Parse(f.url); {
		case f.url == "" && f.kind == "github":
			g.Hosts = []string{"github.com"}
		case f.url == "" && f.kind == "gitlab":
			g.Hosts = []string{"gitlab.com"}
		case err == nil && u.Host != "" && f.kind == "github":
			// GitHub's API may have a host of its own, api.<git host>
			// (api.github.com, api.<name>.ghe.com); GitHub Enterprise
			// Server serves both on one host (/api/v3).
			g.Hosts = []string{strings.TrimPrefix(u.Host, "api.")}
		case err == nil && u.Host != "":
			g.Hosts = []string{u.Host}
		}
	}
	return g, nil
}
