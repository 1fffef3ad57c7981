package agent

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestFolderToolsHonourPathRules checks that search and list_files, which
// act on every file under their folder (the root when they name none),
// are denied (or sent for approval) when a deny (approve) path rule's
// glob could match a file under that folder, and stay allowed for a
// folder the glob cannot reach: otherwise search reads the lines of a
// file read_file may not read.
func TestFolderToolsHonourPathRules(t *testing.T) {
	pol, err := NewPolicy([]Rule{
		{Path: "secrets/**", Tier: Deny, Reason: "no reading secrets"},
		{Tool: ToolSearch, Path: "config/*/prod.env", Tier: Approve, Reason: "production config"},
		{Tool: ToolListFiles, Path: "*.key", Tier: Deny},
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		tool, input string
		want        Tier
	}{
		{ToolReadFile, `{"path":"secrets/prod.env"}`, Deny},
		{ToolReadFile, `{"path":"calc/calc.go"}`, Allow},
		{ToolSearch, `{"pattern":"TOKEN"}`, Deny},
		{ToolSearch, `{"pattern":"TOKEN","path":"."}`, Deny},
		{ToolSearch, `{"pattern":"TOKEN","path":"/work/repo"}`, Deny},
		{ToolSearch, `{"pattern":"TOKEN","path":"secrets"}`, Deny},
		{ToolSearch, `{"pattern":"TOKEN","path":"secrets/deep/x"}`, Deny},
		{ToolSearch, `{"pattern":"TOKEN","path":"calc/../secrets"}`, Deny},
		{ToolSearch, `{"pattern":"TOKEN","path":"calc"}`, Allow},
		{ToolSearch, `{"pattern":"TOKEN","path":"secretsx"}`, Allow},
		{ToolListFiles, `{}`, Deny},
		{ToolListFiles, `{"path":"secrets"}`, Deny},
		{ToolListFiles, `{"path":"calc"}`, Allow},
		// config/*/prod.env reaches into config and config/eu, not
		// into config/eu/old or config/eu/x.go.
		{ToolSearch, `{"pattern":"x","path":"config"}`, Approve},
		{ToolSearch, `{"pattern":"x","path":"config/eu"}`, Approve},
		{ToolSearch, `{"pattern":"x","path":"config/eu/prod.env"}`, Approve},
		{ToolSearch, `{"pattern":"x","path":"config/eu/old"}`, Allow},
		{ToolSearch, `{"pattern":"x","path":"config/eu/x.go"}`, Allow},
		{ToolListFiles, `{"path":"config"}`, Allow}, // the rule is search's
		// *.key matches files of the root only.
		{ToolListFiles, `{"path":"calc"}`, Allow},
	} {
		got, rule := pol.Decide(c.tool, json.RawMessage(c.input), "/work/repo")
		if got != c.want {
			t.Errorf("%s %s: %s, want %s", c.tool, c.input, got, c.want)
		}
		if got == Deny && c.tool == ToolSearch && (rule == nil || !strings.Contains(rule.Reason, "no reading secrets")) {
			t.Errorf("%s %s: the reason %+v does not carry the rule's", c.tool, c.input, rule)
		}
	}
	// The reason tells the model why a search of the root is denied.
	_, rule := pol.Decide(ToolSearch, json.RawMessage(`{"pattern":"x"}`), "/work/repo")
	if rule == nil || !strings.Contains(rule.Reason, "secrets/**") {
		t.Errorf("the reason does not name the rule's path: %+v", rule)
	}
	if pol.Rules[0].Reason != "no reading secrets" {
		t.Errorf("Decide changed the policy's rule: %+v", pol.Rules[0])
	}
}

// TestSearchCannotReadADeniedFile runs the tools through the policy, as
// the loop does: no search or listing the policy lets through prints the
// content or the name of a file under a denied folder.
func TestSearchCannotReadADeniedFile(t *testing.T) {
	tl := newRepo(t)
	if err := os.MkdirAll(filepath.Join(tl.Root, "secrets"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(tl.Root, "secrets", "prod.env"), []byte("TOKEN=hunter2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	pol, err := NewPolicy([]Rule{{Path: "secrets/**", Tier: Deny, Reason: "no reading secrets"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ tool, input string }{
		{ToolSearch, `{"pattern":"TOKEN"}`},
		{ToolSearch, `{"pattern":"TOKEN","path":"."}`},
		{ToolSearch, `{"pattern":"TOKEN","path":"secrets"}`},
		{ToolSearch, `{"pattern":"TOKEN","path":"calc/.."}`},
		{ToolSearch, `{"pattern":"TOKEN","path":"calc"}`},
		{ToolListFiles, `{"depth":3}`},
		{ToolListFiles, `{"path":"calc"}`},
	} {
		if tier, _ := pol.Decide(c.tool, json.RawMessage(c.input), tl.Root); tier != Allow {
			continue
		}
		if r := call(t, tl, c.tool, c.input); strings.Contains(r.View, "hunter2") || strings.Contains(r.View, "prod.env") {
			t.Errorf("%s %s is allowed and shows the denied file: %q", c.tool, c.input, r.View)
		}
	}
}

// TestFileToolsRefuseSymlinkedPaths checks that the file tools refuse a
// path that goes through a symbolic link in the repository (a folder or
// the file itself): the policy matches the path as given, so a link
// ci -> .github/workflows would otherwise make write_file ci/evil.yml an
// edit of CI configuration without the approval it needs, and a link to
// a denied file would let read_file read it. Paths without links still
// work, new folders included.
func TestFileToolsRefuseSymlinkedPaths(t *testing.T) {
	tl := newRepo(t)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(tl.Root, ".github", "workflows"), 0o755))
	must(os.WriteFile(filepath.Join(tl.Root, ".github", "workflows", "ci.yml"), []byte("on: push\n"), 0o644))
	must(os.MkdirAll(filepath.Join(tl.Root, "secrets"), 0o755))
	must(os.WriteFile(filepath.Join(tl.Root, "secrets", "prod.env"), []byte("TOKEN=hunter2\n"), 0o644))
	must(os.Symlink(".github/workflows", filepath.Join(tl.Root, "ci")))
	must(os.Symlink("../secrets/prod.env", filepath.Join(tl.Root, "calc", "env")))
	must(os.Symlink("../secrets", filepath.Join(tl.Root, "calc", "s")))
	pol, err := NewPolicy(append([]Rule{{Path: "secrets/**", Tier: Deny, Reason: "no reading secrets"}}, DefaultPolicy()...))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ tool, input, link string }{
		{ToolWriteFile, `{"path":"ci/evil.yml","content":"on: push\n"}`, "ci"},
		{ToolWriteFile, `{"path":"ci/new/evil.yml","content":"on: push\n"}`, "ci"},
		{ToolEditFile, `{"path":"ci/ci.yml","old_string":"push","new_string":"pull_request"}`, "ci"},
		{ToolReadFile, `{"path":"ci/ci.yml"}`, "ci"},
		{ToolReadFile, `{"path":"calc/env"}`, "calc/env"},
		{ToolReadFile, `{"path":"calc/s/prod.env"}`, "calc/s"},
		{ToolSearch, `{"pattern":"TOKEN","path":"calc/s"}`, "calc/s"},
		{ToolSearch, `{"pattern":"TOKEN","path":"calc/env"}`, "calc/env"},
		{ToolListFiles, `{"path":"calc/s"}`, "calc/s"},
	} {
		// Policy lets each through: it sees no CI or secrets path.
		if tier, _ := pol.Decide(c.tool, json.RawMessage(c.input), tl.Root); tier != Allow {
			t.Errorf("%s %s: the policy says %s; the test wants a call it allows", c.tool, c.input, tier)
			continue
		}
		r := call(t, tl, c.tool, c.input)
		if !r.IsError || !strings.Contains(r.View, "symbolic link "+c.link+" ") || strings.Contains(r.View, "hunter2") {
			t.Errorf("%s %s: want a refusal naming the link %s, got %q", c.tool, c.input, c.link, r.View)
		}
	}
	if _, err := os.Stat(filepath.Join(tl.Root, ".github", "workflows", "evil.yml")); err == nil {
		t.Error("write_file through ci/ wrote .github/workflows/evil.yml")
	}
	if b, _ := os.ReadFile(filepath.Join(tl.Root, ".github", "workflows", "ci.yml")); string(b) != "on: push\n" {
		t.Errorf("edit_file through ci/ changed the workflow: %q", b)
	}
	// By its real path, the CI edit is one the policy sees.
	if tier, _ := pol.Decide(ToolWriteFile, json.RawMessage(`{"path":".github/workflows/evil.yml"}`), tl.Root); tier != Approve {
		t.Errorf("write_file .github/workflows/evil.yml: %s, want approve", tier)
	}
	// Paths without links work as before.
	for _, c := range []struct{ tool, input string }{
		{ToolReadFile, `{"path":"calc/calc.go"}`},
		{ToolReadFile, `{"path":"/` + strings.TrimPrefix(tl.Root, "/") + `/calc/calc.go"}`},
		{ToolWriteFile, `{"path":"new/dir/x.go","content":"package x\n"}`},
		{ToolEditFile, `{"path":"calc/calc.go","old_string":"return a - b","new_string":"return a + b"}`},
		{ToolSearch, `{"pattern":"func","path":"calc"}`},
		{ToolListFiles, `{"path":"calc"}`},
		{ToolReadFile, `{"path":"calc/missing.go"}`},
	} {
		r := call(t, tl, c.tool, c.input)
		if strings.Contains(r.View, "symbolic link") {
			t.Errorf("%s %s: refused as a link: %q", c.tool, c.input, r.View)
		}
	}
}
