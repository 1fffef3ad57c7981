package api

import "testing"

func TestRepoCredential(t *testing.T) {
	for _, c := range []struct {
		in, shown string
		bad       bool
	}{
		{"https://github.com/a/b.git", "https://github.com/a/b.git", false},
		{"https://TOKEN@github.com/a/b.git", "https://github.com/a/b.git", true},
		{"https://u:TOKEN@github.com/a/b.git", "https://github.com/a/b.git", true},
		{"https://u:p@x@host/a?q=1", "https://host/a?q=1", true},
		{"http://TOKEN@host", "http://host", true},
		{"git://TOKEN@host/r", "git://host/r", true},
		{"ssh://git@host/r", "ssh://git@host/r", false},
		{"SSH://git@host/r", "SSH://git@host/r", false},
		{"ssh://git:TOKEN@host/r", "ssh://host/r", true},
		{"https://host/a@b", "https://host/a@b", false},
		{"https://host?x=a@b", "https://host?x=a@b", false},
		{"git@host:a/b.git", "git@host:a/b.git", false},
		{"/srv/repo", "/srv/repo", false},
	} {
		shown, bad := RepoCredential(c.in)
		if shown != c.shown || bad != c.bad {
			t.Errorf("RepoCredential(%q) = %q, %v; want %q, %v", c.in, shown, bad, c.shown, c.bad)
		}
	}
}

// The scp-like form the servers take is the one the nodes check out.
func TestScpLikeRepo(t *testing.T) {
	for repo, want := range map[string]bool{
		"git@github.com:o/r.git":     true,
		"deploy@git.example.com:r":   true,
		"git@github.com:/o/r.git":    false, // the nodes refused it; the servers took it
		"git@github.com:":            false,
		"git@github.com:o/r x":       false,
		"https://github.com/o/r.git": false,
		"git@github.com:o/r.git\n":   false,
		"user:pw@github.com:o/r.git": false,
	} {
		if got := ScpLikeRepo.MatchString(repo); got != want {
			t.Errorf("%q: %v, want %v", repo, got, want)
		}
	}
}
