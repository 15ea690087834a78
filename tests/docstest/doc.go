// Package docstest holds no code, only a test: every shell block of the
// README and of docs/*.md is pasted into a shell against a started
// service, as a newcomer pastes it, so a command that no longer pastes
// (a missing tool, an undefined variable, an answer that changed) fails
// `make test`.
package docstest
