package main

import (
	"flag"
	"slices"
	"testing"
)

// The forge's git hosts, the only ones whose repositories get the token
// and pull requests, default to where the forge serves git: for github
// that is not its API host.
func TestForgeGitHostsDefaults(t *testing.T) {
	t.Setenv("WARREN_FORGE_TOKEN", "tok")
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"--forge", "github"}, []string{"github.com"}},
		{[]string{"--forge", "github", "--forge-url", "https://api.github.com"}, []string{"github.com"}},
		{[]string{"--forge", "github", "--forge-url", "https://api.github.com/"}, []string{"github.com"}},
		{[]string{"--forge", "github", "--forge-url", "https://api.acme.ghe.com"}, []string{"acme.ghe.com"}},
		{[]string{"--forge", "github", "--forge-url", "https://ghe.example.com/api/v3"}, []string{"ghe.example.com"}},
		{[]string{"--forge", "gitlab"}, []string{"gitlab.com"}},
		{[]string{"--forge", "gitea", "--forge-url", "https://gitea.example.com:3000"}, []string{"gitea.example.com:3000"}},
		{[]string{"--forge", "github", "--forge-url", "https://api.github.com", "--forge-git-hosts", "git.example.com"}, []string{"git.example.com"}},
		{[]string{"--forge", "none"}, nil},
	} {
		var f forgeFlags
		fs := flag.NewFlagSet("node", flag.ContinueOnError)
		f.register(fs)
		if err := fs.Parse(c.args); err != nil {
			t.Fatal(err)
		}
		g, err := f.service(t.TempDir())
		if err != nil {
			t.Fatalf("%v: %v", c.args, err)
		}
		if !slices.Equal(g.Hosts, c.want) {
			t.Errorf("%v: git hosts %v, want %v", c.args, g.Hosts, c.want)
		}
	}
	// What the hosts are for: a github.com repository gets the token.
	var f forgeFlags
	fs := flag.NewFlagSet("node", flag.ContinueOnError)
	f.register(fs)
	fs.Parse([]string{"--forge", "github", "--forge-url", "https://api.github.com"})
	g, err := f.service(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if g.Cache.Auth("https://github.com/acme/calc.git") == nil {
		t.Errorf("hosts %v: a github.com repository gets no token", g.Hosts)
	}
}
