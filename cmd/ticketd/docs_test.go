package main

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// No example puts a secret on a command line, where `ps` shows it to every
// user of the machine, or in a committed config file: README examples,
// docs, example configs, scripts and the Taskfile use a --...-file flag or
// a TICKETD_... variable instead.
func TestExamplesKeepSecretsOffArgv(t *testing.T) {
	flag := regexp.MustCompile(`--(peer-secret|control-credential|bootstrap-credential|join-credential|credential|nats-password)[ =]`)
	key := regexp.MustCompile(`(?m)^\s*(peer-secret|control-credential|bootstrap-credential|join-credential|nats-password)\s*:`)
	url := regexp.MustCompile(`nats://[^/\s:@]+:[^@\s]+@`)
	root := filepath.Join("..", "..")
	checked := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != root && (strings.HasPrefix(name, ".") || name == "bin" || name == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		switch filepath.Ext(path) {
		case ".md", ".yaml", ".yml", ".sh", ".conf":
		default:
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		checked++
		for i, line := range strings.Split(string(b), "\n") {
			if flag.MatchString(line) || key.MatchString(line) || url.MatchString(line) {
				t.Errorf("%s:%d puts a secret on argv or in a file: %s", path, i+1, strings.TrimSpace(line))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 10 {
		t.Fatalf("only %d files checked: is the walk rooted at the repository?", checked)
	}
}
