package main

import (
	"fmt"
	"strings"
)

// cmdLine is one command: its words, and where each starts in the line,
// so that a message keeps its spacing.
type cmdLine struct {
	line  string
	words []string
	offs  []int
}

func parseLine(line string) *cmdLine {
	cl := &cmdLine{line: line}
	for i := 0; i < len(line); {
		for i < len(line) && (line[i] == ' ' || line[i] == '\t') {
			i++
		}
		if i == len(line) {
			break
		}
		j := i
		for j < len(line) && line[j] != ' ' && line[j] != '\t' {
			j++
		}
		cl.words = append(cl.words, line[i:j])
		cl.offs = append(cl.offs, i)
		i = j
	}
	return cl
}

// args are the words after the command name.
func (cl *cmdLine) args() []string { return cl.words[1:] }

// rest is the line from argument i on, as typed.
func (cl *cmdLine) rest(i int) string { return strings.TrimSpace(cl.line[cl.offs[i+1]:]) }

// usageError is a command used wrongly. An empty msg is filled in by exec
// with the command's usage (and note).
type usageError struct{ msg, note string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return &usageError{msg: fmt.Sprintf(format, args...)} }

type unreachableError struct{ err error }

func (e *unreachableError) Error() string { return e.err.Error() }
func (e *unreachableError) Unwrap() error { return e.err }
