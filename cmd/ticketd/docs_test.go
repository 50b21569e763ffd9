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
	flag := regexp.MustCompile(`--(peer-secret|control-credential|bootstrap-credential|join-credential|credential|nats-password|nats-token)[ =]`)
	key := regexp.MustCompile(`(?m)^\s*(peer-secret|control-credential|bootstrap-credential|join-credential|nats-password|nats-token)\s*:`)
	url := regexp.MustCompile(`nats://[^/\s@]+@`)
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

// Every fuzz target in the repository is run by CI (.ci/run) and by the
// Taskfile's fuzz task, with its package: a new decoder's fuzz target that
// only runs its seed corpus is easy to miss.
func TestEveryFuzzTargetRuns(t *testing.T) {
	root := filepath.Join("..", "..")
	decl := regexp.MustCompile(`(?m)^func (Fuzz\w+)\(f \*testing\.F\)`)
	type target struct{ pkg, name string }
	var targets []target
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != root && (strings.HasPrefix(name, ".") || name == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, filepath.Dir(path))
		if err != nil {
			return err
		}
		for _, m := range decl.FindAllStringSubmatch(string(b), -1) {
			targets = append(targets, target{"./" + filepath.ToSlash(rel), m[1]})
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(targets) < 10 {
		t.Fatalf("only %d fuzz targets found: is the walk rooted at the repository?", len(targets))
	}
	ci, err := os.ReadFile(filepath.Join(root, ".ci", "run"))
	if err != nil {
		t.Fatal(err)
	}
	task, err := os.ReadFile(filepath.Join(root, "Taskfile.yml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tg := range targets {
		if !strings.Contains(string(ci), "fuzz "+tg.pkg+" "+tg.name+"\n") {
			t.Errorf(".ci/run does not run %s in %s (want a line `fuzz %s %s`)", tg.name, tg.pkg, tg.pkg, tg.name)
		}
		if !regexp.MustCompile(`-fuzz='\^` + tg.name + `\$'.* ` + regexp.QuoteMeta(tg.pkg) + `\n`).Match(task) {
			t.Errorf("Taskfile.yml's fuzz task does not run %s in %s", tg.name, tg.pkg)
		}
	}
}
