package agent

import "github.com/warrenhq/warren/internal/testenv"

// The tests run git on repositories of their own; run under `git rebase
// -x` or from a git hook, they would inherit GIT_DIR and write into the
// enclosing repository.
func init() { testenv.UnsetGit() }
