package forge

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/warrenhq/warren/api/textcut"
)

// MaxPatchHunks bounds the hunks of one patch: git apply moves a file's
// whole image for each of them (50,000 one-line hunks on a file of
// 200,000 lines took 36 s of CPU; 2,000 took 1 s). Each hunk changes a
// line at least, so a diff within the checks' default cap of 5000
// changed lines has at most 5000; this is twice that. git apply's
// deadline (applyTimeout) bounds the rest.
const MaxPatchHunks = 10000

// ErrBadPatch is a sandbox's patch that is not as `git diff` writes it:
// text git apply would read otherwise than the checks do, or parts that
// make it apply a file twice. The sandbox's git did not write it.
var ErrBadPatch = errors.New("the patch is not one git diff writes")

// binaryMethod is a binary hunk's first line, as git writes it. git reads
// the size with strtoul and ignores what follows, so anything looser
// would let a patch declare one size to git and another to checkPatch.
var binaryMethod = regexp.MustCompile(`^(literal|delta) ([0-9]+)$`)

// checkPatch reads a sandbox's patch the way git apply will before it
// runs, and refuses what would make git apply hold or do far more than
// the patch's size says (ErrDiffTooLarge), or what git diff never writes
// (ErrBadPatch):
//   - text before the first "diff --git", or a second "---" or "+++"
//     header in one section (git would read it as another patch);
//   - a rename or copy (the node's diff is made with --no-renames);
//   - a path in more than one section, except a deletion followed by a
//     creation (a type change, as git writes it): git applies each
//     section to the last one's result, copying the file each time;
//   - a hunk header without counts, or more than MaxPatchHunks hunks;
//   - a binary hunk whose first line is not "literal N" or "delta N", a
//     new file declared over MaxDiffBytes, or declared sizes (forward and
//     reverse hunks, which git inflates and holds all at once) over
//     MaxLiteralBytes in all.
//
// A delta hunk's result size is inside its deflated data, not declared:
// git apply's memory limit (applyMemory) bounds it, and its file-size
// limit the file it writes.
func checkPatch(patch []byte) error {
	type section struct {
		deleted, created bool
		sawOld, sawNew   bool
		names            []string
		binary           int // 0: not binary; then the binary hunks' method lines seen, plus one
	}
	var (
		cur              *section
		seen             = map[string]*section{} // by path: the section that last named it
		oldLeft, newLeft int
		hunks            int
		declared         uint64
	)
	bad := func(lineNo int, why string, a ...any) error {
		return fmt.Errorf("%w: line %d: %s", ErrBadPatch, lineNo, fmt.Sprintf(why, a...))
	}
	// end checks the current section's names against the sections before.
	end := func() error {
		if cur == nil {
			return nil
		}
		for _, p := range uniq(cur.names) {
			prev := seen[p]
			switch {
			case prev == nil:
			case prev.deleted && !prev.created && cur.created && !cur.deleted:
				// A type change: git deletes, then creates. Once only.
			default:
				return fmt.Errorf("%w: %s is in more than one section", ErrBadPatch, p)
			}
			seen[p] = cur
			if prev != nil {
				// A third section would find a creation before it.
				cur.deleted = false
			}
		}
		return nil
	}
	for i, raw := range strings.Split(string(patch), "\n") {
		lineNo := i + 1
		if oldLeft > 0 || newLeft > 0 {
			switch {
			case strings.HasPrefix(raw, "+"):
				newLeft--
			case strings.HasPrefix(raw, "-"):
				oldLeft--
			case strings.HasPrefix(raw, "\\"):
			default:
				oldLeft--
				newLeft--
			}
			continue
		}
		switch {
		case strings.HasPrefix(raw, "diff --git "):
			if err := end(); err != nil {
				return err
			}
			cur = &section{names: []string{pathFromHeader(raw)}}
			continue
		case cur == nil:
			if raw != "" {
				return bad(lineNo, "text before the first diff --git header")
			}
			continue
		}
		if cur.binary > 0 {
			// git takes a line as a hunk's method by these prefixes, space
			// included; a data line has none (base85 has no space).
			if strings.HasPrefix(raw, "literal ") || strings.HasPrefix(raw, "delta ") || cur.binary == 1 {
				m := binaryMethod.FindStringSubmatch(raw)
				if m == nil {
					return bad(lineNo, "a binary hunk's header is %q, not literal N or delta N", clip(raw))
				}
				if cur.binary > 2 {
					return bad(lineNo, "a third binary hunk in one file")
				}
				n, err := strconv.ParseUint(m[2], 10, 63)
				if err != nil || (cur.binary == 1 && n > MaxDiffBytes) {
					return fmt.Errorf("%w: a binary hunk (line %d) declares %s bytes, over %d", ErrDiffTooLarge, lineNo, clip(m[2]), MaxDiffBytes)
				}
				if declared += n; declared > MaxLiteralBytes {
					return fmt.Errorf("%w: its binary hunks declare %d bytes or more, over %d in all", ErrDiffTooLarge, declared, MaxLiteralBytes)
				}
				cur.binary++
				continue
			}
		}
		switch {
		case strings.HasPrefix(raw, "GIT binary patch"):
			if cur.binary > 0 {
				return bad(lineNo, "a second binary patch in one file")
			}
			cur.binary = 1
		case strings.HasPrefix(raw, "deleted file mode"):
			cur.deleted = true
		case strings.HasPrefix(raw, "new file mode"):
			cur.created = true
		case strings.HasPrefix(raw, "rename "), strings.HasPrefix(raw, "copy "),
			strings.HasPrefix(raw, "similarity index"), strings.HasPrefix(raw, "dissimilarity index"):
			return bad(lineNo, "a rename or copy")
		case strings.HasPrefix(raw, "--- "):
			if cur.sawOld || cur.binary > 0 {
				return bad(lineNo, "a second --- header in one section")
			}
			cur.sawOld = true
			if p := strings.TrimSuffix(strings.TrimPrefix(raw, "--- "), "\t"); p != "/dev/null" {
				cur.names = append(cur.names, strings.TrimPrefix(unquote(p), "a/"))
			}
		case strings.HasPrefix(raw, "+++ "):
			if cur.sawNew {
				return bad(lineNo, "a second +++ header in one section")
			}
			cur.sawNew = true
			if p := strings.TrimSuffix(strings.TrimPrefix(raw, "+++ "), "\t"); p != "/dev/null" {
				cur.names = append(cur.names, strings.TrimPrefix(unquote(p), "b/"))
			}
		case strings.HasPrefix(raw, "@@"):
			f := strings.Fields(raw)
			var okOld, okNew bool
			if len(f) >= 3 {
				oldLeft, okOld = hunkRange(f[1])
				newLeft, okNew = hunkRange(f[2])
			}
			if !okOld || !okNew {
				return bad(lineNo, "a hunk header without the counts git writes: %q", clip(raw))
			}
			if hunks++; hunks > MaxPatchHunks {
				return fmt.Errorf("%w: it has over %d hunks", ErrDiffTooLarge, MaxPatchHunks)
			}
		}
	}
	return end()
}

func uniq(s []string) []string {
	var out []string
	for _, v := range s {
		dup := false
		for _, o := range out {
			dup = dup || o == v
		}
		if !dup {
			out = append(out, v)
		}
	}
	return out
}

// clip is at most 80 bytes of s, for an error.
func clip(s string) string {
	return textcut.Ellipsis(s, 80)
}
