package api

import "regexp"

// TemplateNameRE is what a template's name (and a template version) must
// match: the servers refuse any other in a task, a pool target, a sandbox
// or a node's list of templates, so `warren image build` refuses to make
// one, and a node leaves any other out of what it advertises.
var TemplateNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,127}$`)

// TemplateNameRule says what TemplateNameRE allows, for errors.
const TemplateNameRule = "must be 1-128 of a-z, 0-9, '.', '_', '-', starting with a letter or digit"
