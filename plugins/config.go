package plugins

import (
	"fmt"
	"log/slog"
	"runtime"
	"time"

	"github.com/tetratelabs/wazero"
)

// Defaults for the zero fields of Config.
const (
	// MemoryLimitPagesDefault is 256 pages of 64 KiB: 16 MiB per instance.
	MemoryLimitPagesDefault uint32 = 256
	// CallTimeoutDefault bounds one hook call.
	CallTimeoutDefault = 50 * time.Millisecond
	// InitTimeoutDefault bounds instantiating a module and running its
	// _initialize export (a Go guest starts its runtime there).
	InitTimeoutDefault = time.Second
	// MaxInstancesDefault caps the instance pool; the default is also
	// capped at GOMAXPROCS.
	MaxInstancesDefault = 8
	// IdentityTimeDefault is the instance time one identity's policy
	// calls may use per second (share.go): a quarter of an instance,
	// ~6,000 calls of a 40µs policy, about what a cluster grants in a
	// second, while an identity whose calls run to their deadline spins a
	// quarter of a core at most (a spinning guest also takes CPU from
	// every other request of the node).
	IdentityTimeDefault = 250 * time.Millisecond
)

// maxMemoryLimitPages is the WebAssembly 32-bit limit (4 GiB); wazero
// panics above it.
const maxMemoryLimitPages = 65536

// Config configures one loaded plugin. The zero value is usable: every
// zero field takes its ...Default.
type Config struct {
	// Name identifies the plugin in errors, logs and events. Default: the
	// first 12 hex digits of its SHA-256, prefixed "sha256:".
	Name string
	// MemoryLimitPages caps each instance's linear memory, in 64 KiB
	// pages. A module whose declared minimum exceeds it is refused at
	// Load. Default MemoryLimitPagesDefault.
	MemoryLimitPages uint32
	// CallTimeout bounds one hook call, including copying the request in
	// and the response out. Default CallTimeoutDefault.
	CallTimeout time.Duration
	// InitTimeout bounds instantiating a fresh instance. Default
	// InitTimeoutDefault.
	InitTimeout time.Duration
	// MaxInstances caps the live instances, idle or busy. A call that
	// finds none idle and the cap reached waits for one (under its own
	// context). Default min(GOMAXPROCS, MaxInstancesDefault).
	MaxInstances int
	// IdentityCalls caps the policy calls of one identity running at once
	// (share.go); its further calls wait for one of them. Default: half
	// of MaxInstances, at least 1; at most MaxInstances.
	IdentityCalls int
	// IdentityTime is the instance time one identity's policy calls may
	// use per second, at most one second's worth saved up; while it is
	// spent, its calls are refused with a *ShareError. Default
	// IdentityTimeDefault.
	IdentityTime time.Duration
	// Logger receives a warning for every failed call. Default: discard.
	Logger *slog.Logger
	// CompilationCache, if set, is shared with other runtimes so the same
	// module is compiled to machine code once per process (or, with
	// wazero.NewCompilationCacheWithDir, once per machine). Optional.
	CompilationCache wazero.CompilationCache
}

func (c Config) withDefaults(sha string) (Config, error) {
	if c.Name == "" {
		c.Name = "sha256:" + sha[:12]
	}
	if c.MemoryLimitPages == 0 {
		c.MemoryLimitPages = MemoryLimitPagesDefault
	}
	if c.MemoryLimitPages > maxMemoryLimitPages {
		return c, fmt.Errorf("%w: MemoryLimitPages %d exceeds %d", ErrConfig, c.MemoryLimitPages, maxMemoryLimitPages)
	}
	switch {
	case c.CallTimeout == 0:
		c.CallTimeout = CallTimeoutDefault
	case c.CallTimeout < 0:
		return c, fmt.Errorf("%w: negative CallTimeout %v", ErrConfig, c.CallTimeout)
	}
	switch {
	case c.InitTimeout == 0:
		c.InitTimeout = InitTimeoutDefault
	case c.InitTimeout < 0:
		return c, fmt.Errorf("%w: negative InitTimeout %v", ErrConfig, c.InitTimeout)
	}
	switch {
	case c.MaxInstances == 0:
		c.MaxInstances = min(runtime.GOMAXPROCS(0), MaxInstancesDefault)
	case c.MaxInstances < 0:
		return c, fmt.Errorf("%w: negative MaxInstances %d", ErrConfig, c.MaxInstances)
	}
	switch {
	case c.IdentityCalls == 0:
		c.IdentityCalls = max(1, c.MaxInstances/2)
	case c.IdentityCalls < 0:
		return c, fmt.Errorf("%w: negative IdentityCalls %d", ErrConfig, c.IdentityCalls)
	case c.IdentityCalls > c.MaxInstances:
		c.IdentityCalls = c.MaxInstances // more could never run at once
	}
	switch {
	case c.IdentityTime == 0:
		c.IdentityTime = IdentityTimeDefault
	case c.IdentityTime < 0:
		return c, fmt.Errorf("%w: negative IdentityTime %v", ErrConfig, c.IdentityTime)
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c, nil
}
