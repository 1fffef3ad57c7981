package repotest

import (
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

const module = "github.com/warrenhq/warren"

type pkg struct {
	ImportPath string
	Dir        string
	Name       string
	GoFiles    []string
	Imports    []string
}

func listPackages(t *testing.T) []pkg {
	t.Helper()
	out, err := exec.Command("go", "list", "-json", module+"/...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	dec := json.NewDecoder(strings.NewReader(string(out)))
	var pkgs []pkg
	for dec.More() {
		var p pkg
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		pkgs = append(pkgs, p)
	}
	if len(pkgs) < 5 {
		t.Fatalf("go list found only %d packages", len(pkgs))
	}
	return pkgs
}

func rel(path string) string { return strings.TrimPrefix(strings.TrimPrefix(path, module), "/") }

func TestEveryPackageHasOneDoc(t *testing.T) {
	for _, p := range listPackages(t) {
		if strings.HasPrefix(rel(p.ImportPath), "api/gen/") {
			continue // generated
		}
		var withDoc []string
		for _, f := range p.GoFiles {
			af, err := parser.ParseFile(token.NewFileSet(), filepath.Join(p.Dir, f), nil, parser.PackageClauseOnly|parser.ParseComments)
			if err != nil {
				t.Fatal(err)
			}
			if af.Doc != nil {
				withDoc = append(withDoc, f)
			}
		}
		if len(withDoc) != 1 {
			t.Errorf("%s: %d files with a package doc comment %v, want exactly 1", p.ImportPath, len(withDoc), withDoc)
		}
	}
}

// allowed lists, for each top-level folder, the warren folders it may
// import (DESIGN.md, "Import direction"). Folders not listed may import
// nothing of warren's but api.
var allowed = map[string][]string{
	"api":       {"api"},
	"raftlog":   {},
	"actor":     {},
	"guest":     {"api"},
	"netpolicy": {"api"},
	"forge":     {"api"},
	"client":    {"api"},
	"scheduler": {"raftlog", "api", "internal"},
	"agent":     {"actor", "guest", "forge", "api"},
	"noded":     {"agent", "guest", "netpolicy", "api", "actor", "client", "internal"},
	"internal":  {},
	"bench":     {"*"},
	"cmd":       {"*"},
}

// forbidden are outside packages some folders must never import.
var forbidden = map[string][]string{
	"scheduler": {"github.com/vishvananda/netlink", "github.com/google/nftables", "github.com/containerd/", "qemu"},
	"agent":     {module + "/noded/driver"},
}

func top(path string) string { return strings.SplitN(rel(path), "/", 2)[0] }

func TestImportDirection(t *testing.T) {
	for _, p := range listPackages(t) {
		from := top(p.ImportPath)
		ok, listed := allowed[from]
		if !listed {
			ok = []string{"api"}
		}
		for _, imp := range p.Imports {
			for _, bad := range forbidden[from] {
				if strings.Contains(imp, bad) {
					t.Errorf("%s imports %s, which %s must never import", p.ImportPath, imp, from)
				}
			}
			if !strings.HasPrefix(imp, module+"/") {
				continue
			}
			to := top(imp)
			if to == "cmd" {
				t.Errorf("%s imports %s: nothing imports cmd", p.ImportPath, imp)
			}
			if to == from || contains(ok, "*") || contains(ok, to) {
				continue
			}
			t.Errorf("%s imports %s: %s may import only %v", p.ImportPath, imp, from, ok)
		}
	}
}

func contains(xs []string, x string) bool {
	for _, v := range xs {
		if v == x {
			return true
		}
	}
	return false
}

// A node daemon reads the task API through client.Read, never through
// Client.Tasks() directly (but for its streams, which fail over
// themselves): its appends follow the leader, so only Read
// moves its reads off a server that stopped (every read of a node whose
// first server was a follower that stopped failed for as long as it was
// gone).
func TestNodeDaemonsReadThroughRead(t *testing.T) {
	for _, p := range listPackages(t) {
		if !strings.HasPrefix(rel(p.ImportPath), "noded") {
			continue
		}
		for _, f := range p.GoFiles {
			af, err := parser.ParseFile(token.NewFileSet(), filepath.Join(p.Dir, f), nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			// X.cl.Tasks().M: M may be StreamEvents only (a stream is no
			// read with a deadline: it moves on with cl.Failover when it
			// breaks).
			ast.Inspect(af, func(n ast.Node) bool {
				call, ok := n.(*ast.SelectorExpr)
				if !ok {
					return true
				}
				tasks, ok := call.X.(*ast.CallExpr)
				if !ok {
					return true
				}
				sel, ok := tasks.Fun.(*ast.SelectorExpr)
				if !ok || sel.Sel.Name != "Tasks" {
					return true
				}
				if inner, ok := sel.X.(*ast.SelectorExpr); ok && inner.Sel.Name == "cl" && call.Sel.Name != "StreamEvents" {
					t.Errorf("%s/%s: %s.cl.Tasks().%s: read through cl.Read, which moves off a server that stopped", rel(p.ImportPath), f, exprName(inner.X), call.Sel.Name)
				}
				return true
			})
		}
	}
}

func exprName(e ast.Expr) string {
	if id, ok := e.(*ast.Ident); ok {
		return id.Name
	}
	return "…"
}
