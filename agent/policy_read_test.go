package agent

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestReadFileRulesHoldForSearch checks that a deny or approve rule of
// read_file alone holds for search, which prints the lines of the files
// it reads, with the reach of a folder tool (globReaches); that it does
// not hold for list_files (names, not content) nor for the other tools;
// and that an allow rule of read_file grants search nothing.
func TestReadFileRulesHoldForSearch(t *testing.T) {
	pol, err := NewPolicy([]Rule{
		{Tool: ToolReadFile, Path: "secrets/**", Tier: Deny, Reason: "no reading secrets"},
		{Tool: ToolReadFile, Path: "config/*/prod.env", Tier: Approve, Reason: "production config"},
		{Tool: ToolReadFile, Path: "open/**", Tier: Allow},
		{Tool: ToolSearch, Path: "open/private/**", Tier: Deny, Reason: "search's own rule"},
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		tool, input string
		want        Tier
	}{
		{ToolReadFile, `{"path":"secrets/prod.env"}`, Deny},
		{ToolSearch, `{"pattern":"TOKEN","path":"secrets/prod.env"}`, Deny},
		{ToolSearch, `{"pattern":"TOKEN","path":"secrets"}`, Deny},
		{ToolSearch, `{"pattern":"TOKEN","path":"secrets/deep"}`, Deny},
		{ToolSearch, `{"pattern":"TOKEN"}`, Deny},
		{ToolSearch, `{"pattern":"TOKEN","path":"."}`, Deny},
		{ToolSearch, `{"pattern":"TOKEN","path":"calc/../secrets"}`, Deny},
		{ToolSearch, `{"pattern":"TOKEN","path":"calc"}`, Allow},
		{ToolSearch, `{"pattern":"TOKEN","path":"secretsx"}`, Allow},
		{ToolSearch, `{"pattern":"x","path":"config/eu"}`, Approve},
		{ToolSearch, `{"pattern":"x","path":"config/eu/prod.env"}`, Approve},
		{ToolSearch, `{"pattern":"x","path":"config/eu/old"}`, Allow},
		// list_files prints names: a rule of read_file is not its.
		{ToolListFiles, `{"path":"secrets"}`, Allow},
		{ToolListFiles, `{}`, Allow},
		// Nor does it reach the other tools.
		{ToolEditFile, `{"path":"secrets/prod.env"}`, Allow},
		{ToolWriteFile, `{"path":"secrets/prod.env"}`, Allow},
		// An allow rule of read_file does not let search past its own.
		{ToolReadFile, `{"path":"open/private/x"}`, Allow},
		{ToolSearch, `{"pattern":"x","path":"open/private/x"}`, Deny},
	} {
		got, rule := pol.Decide(c.tool, json.RawMessage(c.input), "/work/repo")
		if got != c.want {
			t.Errorf("%s %s: %s, want %s", c.tool, c.input, got, c.want)
			continue
		}
		if c.tool == ToolSearch && got == Deny && !strings.Contains(c.input, "open/") {
			if rule == nil || !strings.Contains(rule.Reason, "no reading secrets") || !strings.Contains(rule.Reason, "read_file") {
				t.Errorf("%s %s: the reason %+v does not carry the rule's and say it is read_file's", c.tool, c.input, rule)
			}
		}
	}
	if pol.Rules[0].Reason != "no reading secrets" {
		t.Errorf("Decide changed the policy's rule: %+v", pol.Rules[0])
	}
	// A rule of read_file without a path keeps search from every file.
	all, err := NewPolicy([]Rule{{Tool: ToolReadFile, Tier: Approve}})
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := all.Decide(ToolSearch, json.RawMessage(`{"pattern":"x","path":"calc"}`), "/work/repo"); got != Approve {
		t.Errorf("search under a path-less approve rule of read_file: %s, want approve", got)
	}
}

// TestSearchCannotPrintAFileReadFileMayNotRead runs the tools through a
// policy whose only rule denies read_file under secrets/: no search it
// lets through prints the denied file's lines.
func TestSearchCannotPrintAFileReadFileMayNotRead(t *testing.T) {
	tl := newRepo(t)
	if err := os.MkdirAll(filepath.Join(tl.Root, "secrets"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(tl.Root, "secrets", "prod.env"), []byte("TOKEN=hunter2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	pol, err := NewPolicy([]Rule{{Tool: ToolReadFile, Path: "secrets/**", Tier: Deny, Reason: "no reading secrets"}})
	if err != nil {
		t.Fatal(err)
	}
	allowed := 0
	for _, input := range []string{
		`{"pattern":"TOKEN"}`,
		`{"pattern":"hunter2","path":"."}`,
		`{"pattern":"TOKEN","path":"secrets"}`,
		`{"pattern":"TOKEN","path":"secrets/prod.env"}`,
		`{"pattern":"TOKEN","path":"calc/.."}`,
		`{"pattern":"TOKEN","glob":"*.env"}`,
		`{"pattern":"func","path":"calc"}`,
	} {
		if tier, _ := pol.Decide(ToolSearch, json.RawMessage(input), tl.Root); tier != Allow {
			continue
		}
		allowed++
		if r := call(t, tl, ToolSearch, input); strings.Contains(r.View, "hunter2") {
			t.Errorf("search %s is allowed and prints the denied file: %q", input, r.View)
		}
	}
	if allowed == 0 {
		t.Error("no search was allowed: the policy should leave calc to search")
	}
}
