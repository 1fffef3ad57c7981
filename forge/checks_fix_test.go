package forge

import "testing"

// TestSecretWithGitleaksAllowCommentIsBlocked checks that an added line
// carrying a "gitleaks:allow" comment is still scanned: the comment is
// text the model writes, so it must not opt its own line out of the
// secret check (the detector's IgnoreGitleaksAllow is set).
func TestSecretWithGitleaksAllowCommentIsBlocked(t *testing.T) {
	const key = "AKIAQYLPMN5HHHFPZAM2"
	for _, comment := range []string{"// gitleaks:allow", "# gitleaks:allow", "/* gitleaks:allow */"} {
		diff := fileDiff("config/aws.go", "package config", "", `const id = "`+key+`" `+comment)
		r, err := Check([]byte(diff), CheckConfig{})
		if err != nil {
			t.Fatal(err)
		}
		if !r.Blocked {
			t.Errorf("%s: a secret with the comment is not blocked (findings %+v)", comment, r.Findings)
		}
		found := false
		for _, f := range r.Findings {
			if f.Kind == FindSecret && f.Path == "config/aws.go" && f.Line == 3 {
				found = true
			}
		}
		if !found {
			t.Errorf("%s: no secret finding on config/aws.go:3 (findings %+v)", comment, r.Findings)
		}
	}
}
