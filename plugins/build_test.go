package plugins

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tetratelabs/wazero"
)

// Guest modules are built from source once per test binary, all in
// parallel, as soon as TestMain starts, and each is then compiled once into
// testCache (compiling a Go guest to machine code takes seconds, ten times
// that under -race); a test waits only for the ones it uses.

// guestDirs maps a guest name to its package directory, relative to this
// package.
var guestDirs = map[string]string{
	"ownerprefix": "../examples/plugins/ownerprefix",
	"audit":       "../examples/plugins/audit",
	"trap":        "./testdata/guests/trap",
	"loop":        "./testdata/guests/loop",
	"membomb":     "./testdata/guests/membomb",
	"badabi":      "./testdata/guests/badabi",
	"abi1":        "./testdata/guests/abi1",
	"kinds":       "./testdata/guests/kinds",
}

type build struct {
	built chan struct{} // closed when go build has finished
	ready chan struct{} // closed when the module is also in testCache
	wasm  []byte
	err   error
}

var (
	builds   = map[string]*build{}
	goBinary string // "" if go is not in PATH
	buildDir string

	// buildCtx kills builds still running when the tests are done (a
	// -run that needs no guest does not wait for them).
	buildCtx, cancelBuilds = context.WithCancel(context.Background())

	// testCache is shared by the tests' Loads so each module is compiled
	// to machine code once per test binary; see openTestCache.
	testCache wazero.CompilationCache
)

// openTestCache returns the compilation cache the tests share. Compiling a
// Go guest takes ~2s, ~10s under -race, so by default the machine code is
// also kept on disk, under the user cache directory, like Go's build
// cache: later runs (and CI on the same machine) skip compiling modules
// whose bytes have not changed. wazero keys entries by module hash, CPU
// features and its own version. TICKETD_PLUGINS_TEST_CACHE=off keeps it in
// memory; any other value is the directory to use.
func openTestCache() wazero.CompilationCache {
	dir := os.Getenv("TICKETD_PLUGINS_TEST_CACHE")
	if dir == "off" {
		return wazero.NewCompilationCache()
	}
	if dir == "" {
		base, err := os.UserCacheDir()
		if err != nil {
			return wazero.NewCompilationCache()
		}
		dir = filepath.Join(base, "ticketd", "plugins-test-wazero")
	}
	c, err := wazero.NewCompilationCacheWithDir(dir)
	if err != nil {
		fmt.Fprintf(os.Stderr, "plugins tests: no disk compilation cache (%v); compiling in memory\n", err)
		return wazero.NewCompilationCache()
	}
	return c
}

func TestMain(m *testing.M) {
	testCache = openTestCache()
	code := func() int {
		if path, err := exec.LookPath("go"); err == nil {
			goBinary = path
			dir, err := os.MkdirTemp("", "ticketd-plugins-test-")
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
			buildDir = dir
			defer os.RemoveAll(dir)
			startBuilds()
		}
		code := m.Run()
		cancelBuilds()
		waitBuilds() // never remove the directory under a running build
		return code
	}()
	os.Exit(code)
}

func startBuilds() {
	for name, dir := range guestDirs {
		b := &build{built: make(chan struct{}), ready: make(chan struct{})}
		builds[name] = b
		go func() {
			defer close(b.ready)
			b.wasm, b.err = buildGuest(buildCtx, name, dir)
			close(b.built)
			if b.err == nil {
				// Warm the compilation cache; a Load error is reported by
				// the test that loads the module.
				if p, err := Load(context.Background(), b.wasm, Config{CompilationCache: testCache}); err == nil {
					_ = p.Close(context.Background())
				}
			}
		}()
	}
}

func waitBuilds() {
	for _, b := range builds {
		<-b.built
	}
}

// buildGuest runs GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared.
func buildGuest(ctx context.Context, name, dir string) ([]byte, error) {
	out := filepath.Join(buildDir, name+".wasm")
	cmd := exec.CommandContext(ctx, goBinary, "build", "-buildmode=c-shared", "-o", out, dir)
	cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm", "GOFLAGS="+guestGoFlags())
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("building %s: %v\n%s", dir, err, stderr.String())
	}
	return os.ReadFile(out)
}

// guestGoFlags drops flags from GOFLAGS that cannot apply to a wasm build
// (a -race or -cover test run must still build plain guests).
func guestGoFlags() string {
	var keep []string
	for _, f := range strings.Fields(os.Getenv("GOFLAGS")) {
		switch {
		case f == "-race", f == "-msan", f == "-asan", strings.HasPrefix(f, "-cover"):
		default:
			keep = append(keep, f)
		}
	}
	return strings.Join(keep, " ")
}

// guest returns the built module, skipping the test if go is not in PATH.
func guest(tb testing.TB, name string) []byte {
	tb.Helper()
	if goBinary == "" {
		tb.Skip("skipping: the go command is not in PATH, so the guest modules cannot be built")
	}
	b, ok := builds[name]
	if !ok {
		tb.Fatalf("no guest %q", name)
	}
	<-b.ready
	if b.err != nil {
		tb.Fatal(b.err)
	}
	return b.wasm
}

// load builds (once) and loads a guest with the test defaults applied to
// cfg, closing it at the end of the test.
func load(tb testing.TB, name string, cfg Config) *Plugin {
	tb.Helper()
	return loadBytes(tb, guest(tb, name), cfg)
}

// testCallTimeout replaces the 50ms CallTimeoutDefault (and the 1s
// InitTimeoutDefault) in tests that are not about deadlines: on a loaded
// CI machine a healthy call can wait for a CPU longer than that. Tests
// about deadlines set CallTimeout or InitTimeout.
const testCallTimeout = 10 * time.Second

func loadBytes(tb testing.TB, wasm []byte, cfg Config) *Plugin {
	tb.Helper()
	if cfg.CompilationCache == nil {
		cfg.CompilationCache = testCache
	}
	if cfg.CallTimeout == 0 {
		cfg.CallTimeout = testCallTimeout
	}
	if cfg.InitTimeout == 0 {
		cfg.InitTimeout = testCallTimeout // a Go guest's _initialize on a loaded machine
	}
	if cfg.IdentityTime == 0 {
		// Not the 500ms default: traps and timeouts cost their
		// replacement's start-up, seconds under -race. Tests about
		// shares set it.
		cfg.IdentityTime = time.Hour
	}
	p, err := Load(context.Background(), wasm, cfg)
	if err != nil {
		tb.Fatalf("Load: %v", err)
	}
	tb.Cleanup(func() { _ = p.Close(context.Background()) })
	return p
}
