package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"regexp"
	"strings"

	"github.com/warrenhq/warren/forge"
)

// Tier is what policy does with a tool call.
type Tier string

// The tiers.
const (
	Allow   Tier = "allow"   // run it
	Approve Tier = "approve" // wait for a person's approval first
	Deny    Tier = "deny"    // never run it; the model gets an error
)

// Rule puts matching tool calls in a tier. A rule matches a call of Tool
// ("" or "*": any tool) whose path matches the glob Path (file tools) and
// whose command matches the regular expression Command (run_command); an
// empty Path or Command matches anything. A deny or approve rule of
// read_file holds for search too: search prints the lines of the files it
// reads, so a rule that keeps the model from reading a file keeps search
// from printing it (see Decide).
type Rule struct {
	Tool    string `json:"tool,omitempty"`
	Path    string `json:"path,omitempty"`    // glob, relative to the repository root; ** crosses directories
	Command string `json:"command,omitempty"` // RE2 regular expression
	Tier    Tier   `json:"tier"`
	Reason  string `json:"reason,omitempty"`
}

// Policy is a task's rules, the first match winning; a call no rule
// matches is allowed (everything inside the sandbox is, by default). Deny
// rules are enforced here, outside the model: a denied call never reaches
// the sandbox.
type Policy struct {
	Rules []Rule `json:"rules"`

	compiled []compiledRule
}

type compiledRule struct {
	Rule
	path, cmd *regexp.Regexp
}

// CIConfig and Manifests are the paths the default policy wants approved
// edits of (forge's lists, which the diff checks flag too).
var (
	CIConfig  = forge.CIConfig
	Manifests = forge.Manifests
)

// DefaultPolicy allows everything in the sandbox except edits (edit_file,
// write_file) of CI configuration and dependency manifests, which need
// approval. Task rules come before these.
func DefaultPolicy() []Rule {
	var rs []Rule
	for _, tool := range []string{ToolEditFile, ToolWriteFile} {
		for _, p := range CIConfig {
			rs = append(rs, Rule{Tool: tool, Path: p, Tier: Approve, Reason: "edits CI configuration"})
		}
		for _, p := range Manifests {
			rs = append(rs, Rule{Tool: tool, Path: p, Tier: Approve, Reason: "edits a dependency manifest"})
		}
	}
	return rs
}

// NewPolicy checks and compiles rules; errors name the rule and field.
func NewPolicy(rules []Rule) (*Policy, error) {
	p := &Policy{Rules: rules}
	var errs []error
	for i, r := range rules {
		c := compiledRule{Rule: r}
		switch r.Tier {
		case Allow, Approve, Deny:
		default:
			errs = append(errs, fmt.Errorf("rules[%d].tier: %q is not allow, approve or deny", i, r.Tier))
		}
		if r.Tool != "" && r.Tool != "*" && !isTool(r.Tool) {
			errs = append(errs, fmt.Errorf("rules[%d].tool: %q is not a tool", i, r.Tool))
		}
		if r.Path != "" {
			re, err := globRegexp(r.Path)
			if err != nil {
				errs = append(errs, fmt.Errorf("rules[%d].path: %v", i, err))
			}
			c.path = re
		}
		if r.Command != "" {
			re, err := regexp.Compile(r.Command)
			if err != nil {
				errs = append(errs, fmt.Errorf("rules[%d].command: %v", i, err))
			}
			c.cmd = re
		}
		p.compiled = append(p.compiled, c)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return p, nil
}

func isTool(name string) bool {
	for _, t := range toolSpecs {
		if t.Name == name {
			return true
		}
	}
	return false
}

func globRegexp(g string) (*regexp.Regexp, error) { return forge.GlobRegexp(g) }

// Decide returns the tier of a call and the rule that put it there (nil:
// no rule matched, allowed). root is the repository in the sandbox: a
// path is matched as the file the tool acts on, relative to root.
func (p *Policy) Decide(tool string, input json.RawMessage, root string) (Tier, *Rule) {
	if p == nil {
		return Allow, nil
	}
	var in struct {
		Path    string `json:"path"`
		Command string `json:"command"`
	}
	_ = json.Unmarshal(input, &in)
	relPath, inRoot := repoPath(in.Path, root)
	// search and list_files act on every file under their folder (the
	// root when they name none): a deny or approve path rule holds for
	// them when its glob could match a file under that folder.
	folderTool := tool == ToolSearch || tool == ToolListFiles
	for i := range p.compiled {
		c := &p.compiled[i]
		// search reads the files under its folder and prints their lines:
		// what keeps read_file from a file (deny, approve) keeps search
		// from it too. An allow rule of read_file grants search nothing.
		// (list_files prints names, not content: a read_file rule does
		// not hold for it.)
		asRead := tool == ToolSearch && c.Tool == ToolReadFile && c.Tier != Allow
		if c.Tool != "" && c.Tool != "*" && c.Tool != tool && !asRead {
			continue
		}
		var notes []string
		if asRead {
			notes = append(notes, "a rule of read_file, which holds for search: search prints the lines of the files it reads")
		}
		if c.path != nil {
			switch {
			case !inRoot:
				continue
			case folderTool && c.Tier != Allow:
				if !globReaches(c.Path, relPath) {
					continue
				}
				if in.Path == "" || !c.path.MatchString(relPath) {
					notes = append(notes, fmt.Sprintf("the rule's path %s lies under the folder %s; %s a folder it does not reach",
						c.Path, orDefault(relPath, "."), strings.TrimSuffix(tool, "_files")))
				}
			case in.Path == "" || !c.path.MatchString(relPath):
				continue
			}
		}
		if c.cmd != nil && (tool != ToolRunCommand || !c.cmd.MatchString(in.Command)) {
			continue
		}
		if len(notes) > 0 {
			r := c.Rule
			r.Reason = fmt.Sprintf("%s (%s)", orDefault(r.Reason, "a rule of the task's policy"), strings.Join(notes, "; "))
			return c.Tier, &r
		}
		return c.Tier, &c.Rule
	}
	return Allow, nil
}

// globReaches reports whether the glob g (GlobRegexp's syntax) could
// match dir or a path under it ("" is the repository root). It errs
// towards yes: a glob with ** after the folder's depth reaches anything
// under it.
func globReaches(g, dir string) bool {
	if dir == "" {
		return true
	}
	gs, ds := strings.Split(g, "/"), strings.Split(dir, "/")
	for i, gc := range gs {
		if strings.Contains(gc, "**") {
			return true // crosses any number of folders from here
		}
		if i == len(ds) {
			return true // the glob goes on below dir
		}
		re, err := globRegexp(gc)
		if err != nil || !re.MatchString(ds[i]) {
			return false
		}
	}
	return len(gs) == len(ds) // the glob names dir itself (a file searched)
}

// repoPath is the path p of a call relative to root, resolved as
// Tools.resolve does ("../repo/x" is x when root is /work/repo): a rule
// must match the file the tool acts on. ok is false for a path outside
// root, which matches no path rule (the tool refuses it).
func repoPath(p, root string) (rel string, ok bool) {
	full := path.Clean(path.Join(root, p))
	if path.IsAbs(p) {
		full = path.Clean(p)
	}
	if full == root {
		return "", true
	}
	return strings.CutPrefix(full, root+"/")
}
