// Package repotest holds repository rules written as tests: every package
// has exactly one package doc comment, and imports follow the direction in
// DESIGN.md. It has no code of its own.
package repotest
