package noded

import "testing"

func TestScrubPaths(t *testing.T) {
	for in, want := range map[string]string{
		"open /var/lib/warren/x: no such file": "open …/x: no such file",
		`qmp "/run/a/qmp.sock": EOF`:           `qmp "…/qmp.sock": EOF`,
		"/abs/at/start: bad":                   "…/start: bad",
		"path=/a/b,other=/c/d":                 "path=…/b,other=…/d",
		"keep /work/kept here":                 "keep /work/kept here",
		"http://host/path 1/2 and a/b":         "http://host/path 1/2 and a/b",
		"no paths at all":                      "no paths at all",
	} {
		if got := scrubPaths(in, []string{"/work/kept"}); got != want {
			t.Errorf("scrubPaths(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestIECBytes(t *testing.T) {
	for b, want := range map[int64]string{256 << 20: "256 MiB", 24 << 30: "24 GiB", 3 << 29: "1.5 GiB", 125 << 30: "125 GiB", 1000: "1000 B"} {
		if got := iecBytes(b); got != want {
			t.Errorf("iecBytes(%d) = %q, want %q", b, got, want)
		}
	}
}

// A path the call named is kept only where it stands alone: as the end of
// a longer host path it is no path of the client's, and a URL is no path.
func TestScrubPathsKeepsOnlyWholeNamedPaths(t *testing.T) {
	for _, tc := range []struct{ in, keep, want string }{
		{"open /var/lib/warren/sb/upper/x: no such file", "/x", "open …/x: no such file"},
		{"read /x: gone; open /var/y/x: gone", "/x", "read /x: gone; open …/x: gone"},
		{"dial http://host/path failed", "", "dial http://host/path failed"},
		{"-chardev socket,path=/var/run/a.sock,server=on", "", "-chardev socket,path=…/a.sock,server=on"},
	} {
		if got := scrubPaths(tc.in, []string{tc.keep}); got != tc.want {
			t.Errorf("scrubPaths(%q, %q) = %q, want %q", tc.in, tc.keep, got, tc.want)
		}
	}
}
