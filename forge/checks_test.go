package forge

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func fileDiff(path string, added ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "diff --git a/%s b/%s\nnew file mode 100644\n--- /dev/null\n+++ b/%s\n@@ -0,0 +1,%d @@\n", path, path, path, len(added))
	for _, l := range added {
		b.WriteString("+" + l + "\n")
	}
	return b.String()
}

// An AWS-style key is blocked with a finding that does not repeat it; a
// CI edit needs approval, a dependency edit too, and a test edit is
// flagged (issue 8, acceptance 2).
func TestChecksFindSecretsAndSensitiveEdits(t *testing.T) {
	const key = "AKIAQYLPMN5HHHFPZAM2"
	diff := fileDiff("config/aws.go", "package config", "", `const id = "`+key+`"`) +
		fileDiff(".github/workflows/ci.yml", "on: push") +
		fileDiff("go.mod", "module x") +
		fileDiff("calc/calc_test.go", "package calc")
	r, err := Check([]byte(diff), CheckConfig{})
	if err != nil {
		t.Fatal(err)
	}
	byKind := map[string]Finding{}
	for _, f := range r.Findings {
		byKind[f.Kind] = f
		if strings.Contains(f.Message, key) {
			t.Errorf("a finding repeats the secret: %+v", f)
		}
	}
	if s := byKind[FindSecret]; s.Action != Block || s.Path != "config/aws.go" || s.Line != 3 || !strings.Contains(s.Rule, "aws") {
		t.Errorf("secret finding: %+v", s)
	}
	if f := byKind[FindCIConfig]; f.Action != Approve || f.Path != ".github/workflows/ci.yml" {
		t.Errorf("CI finding: %+v", f)
	}
	if f := byKind[FindManifest]; f.Action != Approve || f.Path != "go.mod" {
		t.Errorf("manifest finding: %+v", f)
	}
	if f := byKind[FindTests]; f.Action != Flag {
		t.Errorf("tests finding: %+v", f)
	}
	if !r.Blocked || !r.NeedsApproval || r.Files != 4 || r.Findings[0].Action != Block {
		t.Errorf("report: %+v", r)
	}
	// Without the secret: approval, not a block. With tests asked for: no
	// tests finding. Config may make CI edits block.
	r, _ = Check([]byte(fileDiff(".github/workflows/ci.yml", "on: push")+fileDiff("a_test.go", "package a")), CheckConfig{TestsRequested: true})
	if r.Blocked || !r.NeedsApproval || len(r.Findings) != 1 {
		t.Errorf("CI only: %+v", r)
	}
	r, _ = Check([]byte(fileDiff(".github/workflows/ci.yml", "on: push")), CheckConfig{Actions: map[string]string{FindCIConfig: Block}})
	if !r.Blocked {
		t.Errorf("CI set to block: %+v", r)
	}
	// A plain edit has nothing to say.
	r, _ = Check([]byte(fileDiff("calc/calc.go", "package calc", "func Add(a, b int) int { return a + b }")), CheckConfig{})
	if len(r.Findings) != 0 || r.Added != 2 {
		t.Errorf("plain edit: %+v", r)
	}
}

func TestChecksSizeCaps(t *testing.T) {
	var diff strings.Builder
	for i := range 5 {
		diff.WriteString(fileDiff(fmt.Sprintf("f%d.txt", i), strings.Repeat("x", 100), "y"))
	}
	r, _ := Check([]byte(diff.String()), CheckConfig{MaxFiles: 4, MaxLines: 9, MaxFileBytes: 50})
	var msgs []string
	for _, f := range r.Findings {
		msgs = append(msgs, f.Message)
	}
	all := strings.Join(msgs, "; ")
	if !r.Blocked || !strings.Contains(all, "5 files, over the cap of 4") || !strings.Contains(all, "10 lines, over the cap of 9") || !strings.Contains(all, "over the cap of 50") {
		t.Fatalf("findings: %s", all)
	}
}

func TestParseActions(t *testing.T) {
	a, err := ParseActions("tests=block, ci_config=flag")
	if err != nil || a[FindTests] != Block || a[FindCIConfig] != Flag {
		t.Fatalf("%v %v", a, err)
	}
	for _, bad := range []string{"tests", "nope=block", "tests=maybe"} {
		if _, err := ParseActions(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// ParseDiff takes any bytes (a sandbox makes the diff).
func FuzzParseDiff(f *testing.F) {
	f.Add([]byte(fileDiff("a.go", "x")))
	f.Add([]byte("diff --git a/x b/x\nGIT binary patch\nliteral 12\nabc\n\n@@ -1 +1 @@\n+y\n"))
	f.Add([]byte("diff --git a/x b/x\nGIT binary patch\nliteral \n"))
	f.Add([]byte("@@ -1,2 +x @@\n+a\ndiff --git \"a/\\x\" \"b/\\x\"\n+++ \"b/\\303\"\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, fd := range ParseDiff(b) {
			if fd.Bytes < 0 || fd.Removed < 0 {
				t.Fatalf("negative count %+v", fd)
			}
		}
	})
}

// Added lines that look like file headers stay added lines of their file:
// they neither rename the file (and dodge its checks) nor skip the scan.
func TestChecksHeaderLikeLinesInAHunk(t *testing.T) {
	diff := "diff --git a/setup.py b/setup.py\n--- a/setup.py\n+++ b/setup.py\n@@ -1,1 +1,3 @@\n x = 1\n+++ b/README.md\n+++ 0 or \"AKIAQYLPMN5HHHFPZAM2\"\n"
	files := ParseDiff([]byte(diff))
	if len(files) != 1 || files[0].Path != "setup.py" || len(files[0].Added) != 2 || files[0].Added[1].N != 3 {
		t.Fatalf("parsed %+v", files)
	}
	r, _ := Check([]byte(diff), CheckConfig{})
	kinds := map[string]bool{}
	for _, f := range r.Findings {
		kinds[f.Kind] = true
	}
	if !kinds[FindManifest] || !kinds[FindSecret] {
		t.Fatalf("findings %+v", r.Findings)
	}
}

// A file with no "+++ b/" line (a deletion, a mode change, an empty new
// file) takes its path from the "diff --git" header, which git C-quotes
// for some paths: the checks see the path either way.
func TestParseDiffPathFromHeader(t *testing.T) {
	for h, want := range map[string]string{
		"diff --git a/x.go b/x.go": "x.go",
		`diff --git "a/.github/workflows/d\303\251ploy.yml" "b/.github/workflows/d\303\251ploy.yml"`: ".github/workflows/déploy.yml",
		`diff --git "a/q\"uote b/x" "b/q\"uote b/x"`:                                                 `q"uote b/x`,
		"diff --git a/.github/workflows/a b/c.yml b/.github/workflows/a b/c.yml":                     ".github/workflows/a b/c.yml",
		"diff --git a/old b/new":      "new",
		`diff --git "a/\303\251" b/e`: "e",
		`diff --git "a/unterminated`:  `"a/unterminated`,
		"diff --git a/ b/":            "",
		"diff --git a":                "a",
	} {
		files := ParseDiff([]byte(h + "\ndeleted file mode 100644\nindex 1234567..0000000\n"))
		if len(files) != 1 || files[0].Path != want {
			t.Errorf("%s: parsed %+v, want the path %q", h, files, want)
		}
	}
}

// nodeDiff is the diff the node's checks read for what repo has staged:
// the repository mirrored and checked out at HEAD in a workspace, the
// staged change applied there as a sandbox's patch, and the workspace's
// text diff taken.
func nodeDiff(t *testing.T, repo string) []byte {
	t.Helper()
	ctx := context.Background()
	c := &Cache{Dir: t.TempDir()}
	mirror, err := c.Mirror(ctx, repo, "")
	if err != nil {
		t.Fatal(err)
	}
	ws, err := c.Git.Checkout(ctx, mirror, sh(t, repo, "rev-parse", "HEAD"), filepath.Join(t.TempDir(), "ws"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ws.Apply(ctx, []byte(sh(t, repo, "diff", "--cached", "--binary", "HEAD")+"\n")); err != nil {
		t.Fatal(err)
	}
	text, err := ws.TextDiff(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return text
}

// Deleting a CI workflow whose path git quotes asks for approval.
func TestChecksDeletedFileWithAQuotedPath(t *testing.T) {
	needGit(t)
	repo := t.TempDir()
	sh(t, repo, "init", "-q", "-b", "main")
	os.MkdirAll(filepath.Join(repo, ".github", "workflows"), 0o755)
	os.WriteFile(filepath.Join(repo, ".github", "workflows", "déploy.yml"), []byte("on: push\n"), 0o644)
	os.WriteFile(filepath.Join(repo, "a.txt"), []byte("a\n"), 0o644)
	sh(t, repo, "add", "-A")
	sh(t, repo, "commit", "-qm", "first")
	sh(t, repo, "rm", "-q", ".github/workflows/déploy.yml")
	text := nodeDiff(t, repo)
	if !strings.Contains(string(text), `diff --git "a/`) {
		t.Fatalf("the trap is not set: git did not quote the path:\n%s", text)
	}
	r, err := Check(text, CheckConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if !r.NeedsApproval || len(r.Findings) != 1 || r.Findings[0].Path != ".github/workflows/déploy.yml" {
		t.Errorf("deleting .github/workflows/déploy.yml: findings %+v", r.Findings)
	}
}

// Added files whose paths have a space (git ends such a name with a TAB
// on its "+++" line, quoted or not) get the checks of their names: a CI
// workflow, a manifest and a test, through the node's own diff.
func TestChecksPathsWithSpaces(t *testing.T) {
	needGit(t)
	repo := t.TempDir()
	sh(t, repo, "init", "-q", "-b", "main")
	os.WriteFile(filepath.Join(repo, "a.txt"), []byte("a\n"), 0o644)
	sh(t, repo, "add", "-A")
	sh(t, repo, "commit", "-qm", "first")
	files := map[string]string{
		"my app/package.json":            FindManifest,
		"requirements dev.txt":           FindManifest,
		"my app/calc_test.go":            FindTests,
		".github/workflows/dé ploy.yml":  FindCIConfig,
		`.github/workflows/q"uote x.yml`: FindCIConfig,
	}
	for p := range files {
		os.MkdirAll(filepath.Dir(filepath.Join(repo, p)), 0o755)
		os.WriteFile(filepath.Join(repo, p), []byte("on: push\n"), 0o644)
	}
	sh(t, repo, "add", "-A")
	text := nodeDiff(t, repo)
	if !strings.Contains(string(text), "+++ b/my app/package.json\t\n") {
		t.Fatalf("the trap is not set: no TAB after a name with a space:\n%s", text)
	}
	r, err := Check(text, CheckConfig{})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, f := range r.Findings {
		got[f.Path] = f.Kind
	}
	for p, kind := range files {
		if got[p] != kind {
			t.Errorf("%q: finding %q, want %q (all: %+v)", p, got[p], kind, r.Findings)
		}
	}
}

// A hunk of more lines than any cap (a 17-million-line file) is read by
// its header's counts like any other: its lines are scanned and counted.
// A header whose counts git would not write blocks the diff.
func TestChecksHugeAndBrokenHunkHeaders(t *testing.T) {
	const key = "AKIAQYLPMN5HHHFPZAM2"
	diff := "diff --git a/big.txt b/big.txt\nnew file mode 100644\n--- /dev/null\n+++ b/big.txt\n@@ -0,0 +1,16777217 @@\n+\n+" + key + "\n"
	r, err := Check([]byte(diff), CheckConfig{})
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]bool{}
	for _, f := range r.Findings {
		kinds[f.Kind] = true
	}
	if !r.Blocked || !kinds[FindSecret] || r.Added != 2 {
		t.Errorf("a hunk of 16777217 lines: added %d, findings %+v; want its 2 lines scanned and the key blocked", r.Added, r.Findings)
	}
	for _, h := range []string{"@@ -0,0 +1,99999999999999999999 @@", "@@ -0,0 +1,-3 @@", "@@ -x +1,2 @@", "@@ - +1 @@"} {
		r, err := Check([]byte(strings.Replace(diff, "@@ -0,0 +1,16777217 @@", h, 1)), CheckConfig{Actions: map[string]string{FindSize: Flag}})
		if err != nil {
			t.Fatal(err)
		}
		unreadable := false
		for _, f := range r.Findings {
			unreadable = unreadable || (f.Action == Block && strings.Contains(f.Message, "cannot be checked"))
		}
		if !r.Blocked || !unreadable {
			t.Errorf("%s: findings %+v; want the diff blocked as unreadable", h, r.Findings)
		}
	}
}
