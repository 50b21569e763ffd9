package doctest

import (
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
)

// Block is one fenced shell block of a page.
type Block struct {
	File string // the page's path, for messages
	Line int    // line of the opening fence, from 1
	Text string // the block's lines, without the fences
	Directives
}

// Directives are what the doctest comments above a block say.
type Directives struct {
	Skip  string   // why the block is not run; "" when it is
	Needs []string // tools that must be on PATH
	// Unprivileged: the block cannot run as root (initdb and postgres
	// refuse to).
	Unprivileged bool
	Before       []string // commands run before the block's own
	Nodes        int      // nodes the block starts (0: one)
	Output       []string // texts the block's output must show
}

// Where names the block in messages (file:line).
func (b Block) Where() string { return fmt.Sprintf("%s:%d", b.File, b.Line) }

// shellLangs are the fence languages whose blocks are shell commands.
var shellLangs = map[string]bool{"sh": true, "bash": true, "shell": true}

var directiveRE = regexp.MustCompile(`^<!--\s*doctest:\s*(.*?)\s*-->$`)

// ParseFile reads and parses a Markdown page.
func ParseFile(path string) ([]Block, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return Parse(path, string(b))
}

// Parse returns the shell blocks of a Markdown page, with their
// directives. A directive that is not understood, or that no shell block
// follows, is an error.
func Parse(file, text string) ([]Block, error) {
	var (
		blocks  []Block
		pending Directives
		where   int // line of the first pending directive; 0: none
		fence   string
		lang    string
		start   int
		body    []string
	)
	lines := strings.Split(text, "\n")
	for i, line := range lines {
		n := i + 1
		trimmed := strings.TrimSpace(line)
		if fence != "" {
			if strings.HasPrefix(trimmed, fence) && strings.Trim(trimmed, fence[:1]) == "" {
				if shellLangs[lang] {
					blocks = append(blocks, Block{File: file, Line: start, Text: strings.Join(body, "\n"), Directives: pending})
				} else if where != 0 {
					return nil, fmt.Errorf("%s:%d: doctest directive above a %q block, not a shell block", file, where, lang)
				}
				pending, where, fence, body = Directives{}, 0, "", nil
				continue
			}
			body = append(body, line)
			continue
		}
		if f := fenceOf(trimmed); f != "" {
			fence, start = f, n
			lang, _, _ = strings.Cut(strings.TrimSpace(strings.TrimLeft(trimmed, f[:1])), " ")
			continue
		}
		if m := directiveRE.FindStringSubmatch(trimmed); m != nil {
			if err := pending.add(m[1]); err != nil {
				return nil, fmt.Errorf("%s:%d: %w", file, n, err)
			}
			if where == 0 {
				where = n
			}
			continue
		}
		if strings.Contains(trimmed, "doctest:") && strings.HasPrefix(trimmed, "<!--") {
			return nil, fmt.Errorf("%s:%d: a doctest directive is one line: <!-- doctest: ... -->", file, n)
		}
		if trimmed != "" && where != 0 {
			return nil, fmt.Errorf("%s:%d: doctest directive not right above a shell block (text in between)", file, where)
		}
	}
	if fence != "" {
		return nil, fmt.Errorf("%s:%d: code block never closed", file, start)
	}
	if where != 0 {
		return nil, fmt.Errorf("%s:%d: doctest directive with no block after it", file, where)
	}
	return blocks, nil
}

// fenceOf is the fence that opens a code block on this line ("```" or
// longer, or "~~~"), or "".
func fenceOf(line string) string {
	for _, c := range []string{"`", "~"} {
		n := len(line) - len(strings.TrimLeft(line, c))
		if n >= 3 {
			return strings.Repeat(c, n)
		}
	}
	return ""
}

// add records one directive.
func (d *Directives) add(s string) error {
	verb, arg, _ := strings.Cut(s, " ")
	arg = strings.TrimSpace(arg)
	switch verb {
	case "skip":
		reason := strings.TrimSuffix(strings.TrimPrefix(arg, "("), ")")
		if strings.TrimSpace(reason) == "" {
			return fmt.Errorf("doctest: skip needs a reason: <!-- doctest: skip (why) -->")
		}
		d.Skip = reason
	case "needs":
		if arg == "" {
			return fmt.Errorf("doctest: needs names the tools: <!-- doctest: needs TOOL... -->")
		}
		d.Needs = append(d.Needs, strings.Fields(arg)...)
	case "unprivileged":
		if arg != "" {
			return fmt.Errorf("doctest: unprivileged takes no argument")
		}
		d.Unprivileged = true
	case "before":
		if arg == "" {
			return fmt.Errorf("doctest: before needs a command")
		}
		d.Before = append(d.Before, arg)
	case "nodes":
		n, err := strconv.Atoi(arg)
		if err != nil || n < 1 {
			return fmt.Errorf("doctest: nodes %q: want a count of nodes", arg)
		}
		d.Nodes = n
	case "output":
		if arg == "" {
			return fmt.Errorf("doctest: output needs the text to wait for")
		}
		d.Output = append(d.Output, arg)
	default:
		return fmt.Errorf("doctest: unknown directive %q (skip, needs, unprivileged, before, nodes, output)", verb)
	}
	return nil
}
