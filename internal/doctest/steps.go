package doctest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"reflect"
	"regexp"
	"strings"
	"time"
)

// Step is one command of a block, as a user types it.
type Step struct {
	Line int    // line of the page where it starts
	Text string // the command, with its continuation lines and comments
	// ExpectError is the error code a trailing `# error: CODE` comment
	// promises ("" when none): the step must fail, saying "error: CODE".
	ExpectError string
	// ExpectJSON holds the fields a trailing `# {"key":...,...}` comment
	// shows: stdout's first line must be a JSON object with those values.
	ExpectJSON map[string]any
}

// bashCheckTimeout bounds one `bash -n` (a syntax check of a few lines).
const bashCheckTimeout = 10 * time.Second

// Steps cuts a block into steps: a line with its backslash continuations,
// or as many lines as bash needs to find the command complete. Blank and
// comment-only lines between steps are dropped.
func Steps(b Block) ([]Step, error) {
	var (
		steps []Step
		cur   []string
		first int
	)
	for i, line := range strings.Split(b.Text, "\n") {
		n := b.Line + 1 + i
		if len(cur) == 0 {
			t := strings.TrimSpace(line)
			if t == "" || strings.HasPrefix(t, "#") {
				continue
			}
			first = n
		}
		cur = append(cur, line)
		if continued(line) {
			continue
		}
		text := strings.Join(cur, "\n")
		complete, err := shellComplete(text)
		if err != nil {
			return nil, fmt.Errorf("%s:%d: %w", b.File, first, err)
		}
		if !complete {
			continue
		}
		st := Step{Line: first, Text: text}
		if err := st.readComments(); err != nil {
			return nil, fmt.Errorf("%s:%d: %w", b.File, first, err)
		}
		steps = append(steps, st)
		cur = nil
	}
	if len(cur) > 0 {
		return nil, fmt.Errorf("%s:%d: the command never ends (unclosed quote, loop or backslash)", b.File, first)
	}
	return steps, nil
}

// continued reports whether a line ends in an unescaped backslash.
func continued(line string) bool {
	n := len(line) - len(strings.TrimRight(line, `\`))
	return n%2 == 1
}

// shellComplete asks bash whether text is a whole command: incomplete is
// an "unexpected end of file"; any other syntax error is an error.
func shellComplete(text string) (bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), bashCheckTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, "bash", "-n", "-c", text).CombinedOutput()
	if err == nil {
		return true, nil
	}
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return false, fmt.Errorf("bash -n: %w", err)
	}
	if s := string(out); strings.Contains(s, "unexpected end of file") || strings.Contains(s, "unexpected EOF") {
		return false, nil
	}
	return false, fmt.Errorf("not valid shell: %s", strings.TrimSpace(string(out)))
}

// Comments are the comments of a shell text: from a # that starts a word
// outside quotes to the end of its line.
func Comments(text string) []string {
	var out []string
	forComments(text, func(start, end int) { out = append(out, text[start+1:end]) })
	return out
}

// StripComments is text without its comments (and trailing blanks).
func StripComments(text string) string {
	var b strings.Builder
	last := 0
	forComments(text, func(start, end int) {
		b.WriteString(text[last:start])
		last = end
	})
	b.WriteString(text[last:])
	return strings.TrimRight(b.String(), " \t\n")
}

// forComments calls f with the byte range of each comment ('#' to the end
// of its line). It follows bash's quoting: single quotes, double quotes
// and backslash escapes.
func forComments(text string, f func(start, end int)) {
	var quote byte
	for i := 0; i < len(text); i++ {
		c := text[i]
		switch {
		case quote == '\'':
			if c == '\'' {
				quote = 0
			}
		case c == '\\':
			i++
		case quote == '"':
			if c == '"' {
				quote = 0
			}
		case c == '\'' || c == '"':
			quote = c
		case c == '#' && (i == 0 || strings.IndexByte(" \t\n;&|(", text[i-1]) >= 0):
			end := strings.IndexByte(text[i:], '\n')
			if end < 0 {
				end = len(text)
			} else {
				end += i
			}
			f(i, end)
			i = end
		}
	}
}

var ellipsisRE = regexp.MustCompile(`,\s*\.\.\.\s*}$`)

// readComments fills the expectations from the step's comments.
func (s *Step) readComments() error {
	for _, c := range Comments(s.Text) {
		c = strings.TrimSpace(c)
		switch {
		case strings.HasPrefix(c, "error:"):
			code, _, _ := strings.Cut(strings.TrimSpace(strings.TrimPrefix(c, "error:")), ":")
			if code == "" || strings.ContainsAny(code, " \t") {
				return fmt.Errorf("comment %q: want `# error: CODE: ...`", c)
			}
			s.ExpectError = code
		case strings.HasPrefix(c, "{"):
			sample := jsonPrefix(c)
			var v map[string]any
			if err := json.Unmarshal([]byte(ellipsisRE.ReplaceAllString(sample, "}")), &v); err != nil {
				return fmt.Errorf("comment %q: a comment starting with { shows the output, as a JSON object whose last field may be `...`: %v", c, err)
			}
			s.ExpectJSON = v
		}
	}
	return nil
}

// jsonPrefix is s up to the } that closes its first {.
func jsonPrefix(s string) string {
	depth, inString := 0, false
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case inString && c == '\\':
			i++
		case c == '"':
			inString = !inString
		case inString:
		case c == '{':
			depth++
		case c == '}':
			depth--
			if depth == 0 {
				return s[:i+1]
			}
		}
	}
	return s
}

// Check compares what a finished step did with what its comments promise
// (and, without an error comment, wants exit status 0).
func (s Step) Check(r Result) error {
	if s.ExpectError != "" {
		if r.Status == 0 {
			return fmt.Errorf("exit status 0, want a failure with error: %s", s.ExpectError)
		}
		if !strings.Contains(r.Stderr, "error: "+s.ExpectError) {
			return fmt.Errorf("exit status %d, stderr %q: want error: %s", r.Status, r.Stderr, s.ExpectError)
		}
		return nil
	}
	if r.Status != 0 {
		return fmt.Errorf("exit status %d", r.Status)
	}
	if s.ExpectJSON == nil {
		return nil
	}
	line, _, _ := strings.Cut(strings.TrimSpace(r.Stdout), "\n")
	var got map[string]any
	if err := json.Unmarshal([]byte(line), &got); err != nil {
		return fmt.Errorf("stdout %q is not the JSON object the comment shows", r.Stdout)
	}
	for k, want := range s.ExpectJSON {
		if !reflect.DeepEqual(got[k], want) {
			return fmt.Errorf("stdout %s: %q is %v, the comment shows %v", line, k, got[k], want)
		}
	}
	return nil
}
