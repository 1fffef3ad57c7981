// Package forge is git outside the sandbox: the node's clone cache of bare
// mirrors, the checkout of a task's workspace at its pinned base commit,
// the diff's checks (secrets with gitleaks' rules, CI configuration,
// dependency manifests, tests, size), the push of the agent's branch with
// a credential that never enters a sandbox, and the pull requests, through
// adapters for GitHub, Gitea/Forgejo and GitLab. Git always runs with
// fsmonitor off, no hooks, no system or global config, and no prompts.
package forge
