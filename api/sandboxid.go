package api

import (
	"crypto/rand"
	"fmt"
	"strings"

	"github.com/warrenhq/warren/api/textcut"
)

// A sandbox id names the node that holds the sandbox, so a server can
// forward calls without keeping a record: "sb-" + 10 characters + "-" +
// the node id.
const (
	sandboxIDPrefix = "sb-"
	sandboxIDRand   = 10
	sandboxIDHead   = len(sandboxIDPrefix) + sandboxIDRand // the node id starts after this and a '-'
)

// NewSandboxID makes a fresh sandbox id on node.
func NewSandboxID(node string) string {
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, sandboxIDRand)
	_, _ = rand.Read(b)
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	return sandboxIDPrefix + string(b) + "-" + node
}

// SandboxNode returns the node id a sandbox id names. The error says what
// is wrong with id; callers put the field's name in front.
func SandboxNode(id string) (string, error) {
	if len(id) < sandboxIDHead+2 || !strings.HasPrefix(id, sandboxIDPrefix) || id[sandboxIDHead] != '-' {
		id = textcut.Ellipsis(id, 80)
		return "", fmt.Errorf("%q is not a sandbox id (sb-XXXXXXXXXX-NODE)", id)
	}
	return id[sandboxIDHead+1:], nil
}
