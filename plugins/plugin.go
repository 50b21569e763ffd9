package plugins

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"
	"github.com/tetratelabs/wazero/sys"

	"github.com/ticketd/ticketd/core"
)

// Verdict is a policy plugin's answer to a Grant.
type Verdict struct {
	Allow bool
	// Reason explains a denial; it may be shown to the client.
	Reason string
}

// Event is one audit event emitted by an on_applied hook.
type Event struct {
	// Type is 1..MaxEventTypeBytes of [A-Za-z0-9._-], e.g. "lock.granted".
	Type string
	// Data is a compact JSON object ({} when the guest sent none).
	Data json.RawMessage
	// Index is the log index of the applied command (set by the host).
	Index uint64
	// Plugin is the name of the plugin that emitted it (set by the host).
	Plugin string
}

// String formats an event as "plugin@index type data".
func (e Event) String() string {
	return fmt.Sprintf("%s@%d %s %s", e.Plugin, e.Index, e.Type, e.Data)
}

// Plugin is one loaded, compiled module and its pool of instances. It is
// safe for concurrent use.
type Plugin struct {
	name string
	sha  string
	cfg  Config
	log  *slog.Logger

	rt wazero.Runtime
	cm wazero.CompiledModule

	hasPolicy, hasAudit bool
	// abi is the module's ABI version (MinABIVersion..ABIVersion): what
	// its requests look like.
	abi uint32

	// idle holds warm instances; slots holds one token per live instance
	// (idle or busy), so len(slots) <= cfg.MaxInstances.
	idle  chan *instance
	slots chan struct{}
	// shares divides the instances' time among identities (share.go).
	shares *shares

	closed    atomic.Bool
	done      chan struct{}
	closeOnce sync.Once
	closeErr  error
}

var (
	_ Policy  = (*Plugin)(nil)
	_ Auditor = (*Plugin)(nil)
)

// instance is one instantiated module. It is used by one call at a time.
type instance struct {
	mod                 api.Module
	mem                 api.Memory
	alloc               api.Function
	validate, onApplied api.Function
	stderr              *capBuffer
}

// Load compiles wasm, checks it against the ABI, instantiates one instance
// (running _initialize), and checks its ABI version and hooks. The
// returned Plugin must be closed. Load fails with ErrPluginABI for a
// module that does not follow the ABI, ErrPluginTrap or ErrPluginTimeout
// if initialisation fails, and ErrConfig for a bad Config.
func Load(ctx context.Context, wasm []byte, cfg Config) (*Plugin, error) {
	sum := sha256.Sum256(wasm)
	sha := hex.EncodeToString(sum[:])
	cfg, err := cfg.withDefaults(sha)
	if err != nil {
		return nil, err
	}
	p := &Plugin{
		name:  cfg.Name,
		sha:   sha,
		cfg:   cfg,
		log:   cfg.Logger.With("plugin", cfg.Name),
		idle:  make(chan *instance, cfg.MaxInstances),
		slots: make(chan struct{}, cfg.MaxInstances),
		done:  make(chan struct{}),
	}
	p.shares = newShares(cfg.Name, cfg.IdentityCalls, cfg.IdentityTime)

	// The sandbox is wazero's default: no file system, environment,
	// arguments or sockets; fake wall and monotonic clocks; a fixed
	// random source; no-op sleep. Only the memory cap and the
	// cancellation on context done are added.
	rc := wazero.NewRuntimeConfig().
		WithMemoryLimitPages(cfg.MemoryLimitPages).
		WithCloseOnContextDone(true)
	if cfg.CompilationCache != nil {
		rc = rc.WithCompilationCache(cfg.CompilationCache)
	}
	p.rt = wazero.NewRuntimeWithConfig(ctx, rc)
	fail := func(err error) (*Plugin, error) {
		_ = p.rt.Close(context.WithoutCancel(ctx))
		return nil, err
	}
	if _, err := wasi_snapshot_preview1.Instantiate(ctx, p.rt); err != nil {
		return fail(fmt.Errorf("plugins: instantiating WASI: %w", err))
	}
	p.cm, err = p.rt.CompileModule(ctx, wasm)
	if err != nil {
		return fail(p.abiError("load", "not a valid module", err))
	}
	if err := p.checkModule(); err != nil {
		return fail(err)
	}
	p.slots <- struct{}{}
	inst, err := p.instantiate(ctx)
	if err != nil {
		return fail(err)
	}
	if err := p.checkInstance(ctx, inst); err != nil {
		return fail(err)
	}
	p.idle <- inst
	return p, nil
}

// checkModule checks imports and export signatures before anything runs.
func (p *Plugin) checkModule() error {
	for _, f := range p.cm.ImportedFunctions() {
		mod, name, _ := f.Import()
		if mod != wasiModule {
			return p.abiError("load", fmt.Sprintf("imports %s.%s; only %s may be imported", mod, name, wasiModule), nil)
		}
	}
	if ms := p.cm.ImportedMemories(); len(ms) > 0 {
		return p.abiError("load", "imports a memory; a plugin must define its own", nil)
	}
	mems := p.cm.ExportedMemories()
	mem, ok := mems[exportMemory]
	if !ok {
		return p.abiError("load", `does not export its memory as "memory"`, nil)
	}
	if mem.Min() > p.cfg.MemoryLimitPages {
		return p.abiError("load", fmt.Sprintf("needs %d memory pages, the limit is %d", mem.Min(), p.cfg.MemoryLimitPages), nil)
	}
	fns := p.cm.ExportedFunctions()
	if _, ok := fns[exportStart]; ok {
		// A command's exports may not be called once _start has returned,
		// and nothing else initialises it (a Go command's runtime).
		return p.abiError("load", "exports _start: it is a WASI command, not a reactor (build Go plugins with -buildmode=c-shared)", nil)
	}
	for _, sig := range signatures {
		def, ok := fns[sig.name]
		if !ok {
			if sig.required {
				return p.abiError("load", "does not export "+sig.name, nil)
			}
			continue
		}
		if !sameTypes(def.ParamTypes(), sig.params) || !sameTypes(def.ResultTypes(), sig.results) {
			return p.abiError("load", fmt.Sprintf("export %s has type %s, want %s", sig.name,
				funcType(def.ParamTypes(), def.ResultTypes()), funcType(sig.params, sig.results)), nil)
		}
	}
	_, p.hasPolicy = fns[exportValidateGrant]
	_, p.hasAudit = fns[exportOnApplied]
	return nil
}

// checkInstance asks a fresh instance for its ABI version and hooks.
func (p *Plugin) checkInstance(ctx context.Context, inst *instance) error {
	cctx, cancel := context.WithTimeout(ctx, p.cfg.CallTimeout)
	defer cancel()
	res, err := inst.mod.ExportedFunction(exportABIVersion).Call(cctx)
	if err != nil {
		return p.execError(exportABIVersion, err, inst)
	}
	v := uint32(res[0])
	if v < MinABIVersion || v > ABIVersion {
		return p.abiError(exportABIVersion, fmt.Sprintf("module speaks ABI version %d, this host speaks %d to %d", v, MinABIVersion, ABIVersion), nil)
	}
	p.abi = v
	if f := inst.mod.ExportedFunction(exportHooks); f != nil {
		res, err := f.Call(cctx)
		if err != nil {
			return p.execError(exportHooks, err, inst)
		}
		bits := uint32(res[0])
		if bits&^hooksKnown != 0 {
			return p.abiError(exportHooks, fmt.Sprintf("unknown hook bits %#x", bits&^hooksKnown), nil)
		}
		if bits&hookValidateGrant != 0 && !p.hasPolicy {
			return p.abiError(exportHooks, "claims validate_grant but does not export it", nil)
		}
		if bits&hookOnApplied != 0 && !p.hasAudit {
			return p.abiError(exportHooks, "claims on_applied but does not export it", nil)
		}
		p.hasPolicy = bits&hookValidateGrant != 0
		p.hasAudit = bits&hookOnApplied != 0
	}
	if !p.hasPolicy && !p.hasAudit {
		return p.abiError("load", "implements neither validate_grant nor on_applied", nil)
	}
	return nil
}

// instantiate makes a fresh instance and runs _initialize. The caller
// holds a slot for it and gives the slot back if this fails.
func (p *Plugin) instantiate(ctx context.Context) (*instance, error) {
	ictx, cancel := context.WithTimeout(ctx, p.cfg.InitTimeout)
	defer cancel()
	stderr := &capBuffer{max: maxStderrBytes}
	mc := wazero.NewModuleConfig().
		WithName("").         // anonymous: many instances of one module
		WithStartFunctions(). // _initialize is called below, under the deadline
		WithStderr(stderr)
	mod, err := p.rt.InstantiateModule(ictx, p.cm, mc)
	if err != nil {
		if p.closed.Load() {
			return nil, p.closedError("instantiate")
		}
		return nil, p.abiError("instantiate", "cannot instantiate", err)
	}
	inst := &instance{
		mod:       mod,
		mem:       mod.ExportedMemory(exportMemory),
		alloc:     mod.ExportedFunction(exportAlloc),
		validate:  mod.ExportedFunction(exportValidateGrant),
		onApplied: mod.ExportedFunction(exportOnApplied),
		stderr:    stderr,
	}
	if f := mod.ExportedFunction(exportInitialize); f != nil {
		if _, err := f.Call(ictx); err != nil {
			err = p.execError(exportInitialize, err, inst)
			_ = mod.Close(context.WithoutCancel(ctx))
			return nil, err
		}
	}
	return inst, nil
}

// acquire returns an idle instance or, below the cap, a fresh one.
func (p *Plugin) acquire(ctx context.Context, hook string) (*instance, error) {
	if p.closed.Load() {
		return nil, p.closedError(hook)
	}
	if err := ctx.Err(); err != nil {
		return nil, p.ctxError(hook, err)
	}
	select {
	case inst := <-p.idle:
		return inst, nil
	default:
	}
	select {
	case inst := <-p.idle:
		return inst, nil
	case p.slots <- struct{}{}:
		inst, err := p.instantiate(ctx)
		if err != nil {
			<-p.slots
			return nil, err
		}
		return inst, nil
	case <-ctx.Done():
		return nil, p.ctxError(hook, ctx.Err())
	case <-p.done:
		return nil, p.closedError(hook)
	}
}

// release returns a healthy instance to the pool.
func (p *Plugin) release(inst *instance) {
	if p.closed.Load() {
		p.discard(inst)
		return
	}
	p.idle <- inst // never blocks: len(idle) < len(slots) <= cap(idle)
}

// discard closes an instance that trapped, timed out or broke the ABI,
// and frees its slot; the next call instantiates a fresh one.
func (p *Plugin) discard(inst *instance) {
	_ = inst.mod.Close(context.Background())
	<-p.slots
}

// replace closes an instance that trapped, timed out or broke the ABI and
// makes a fresh one in its slot, on the failed call's time: the caller
// whose call broke it pays for its replacement (and its identity's share
// is charged for it, share.go), not whoever calls next. If the fresh
// instance fails too, the slot is freed and the next call tries again.
func (p *Plugin) replace(ctx context.Context, inst *instance) {
	if p.closed.Load() {
		p.discard(inst)
		return
	}
	_ = inst.mod.Close(context.Background())
	fresh, err := p.instantiate(context.WithoutCancel(ctx))
	if err != nil {
		<-p.slots
		return
	}
	p.release(fresh)
}

// call runs one hook on a pooled instance: it copies req into guest
// memory, calls fn, copies the response out and hands it to decode. On
// any failure the instance is replaced. held is how long the call held an
// instance (a replacement included).
func (p *Plugin) call(ctx context.Context, hook string, pick func(*instance) api.Function, req []byte, decode func([]byte) error) (held time.Duration, _ error) {
	if len(req) > MaxRequestBytes {
		return 0, fmt.Errorf("%w: %s request is %d bytes, the limit is %d", ErrRequestTooLarge, hook, len(req), MaxRequestBytes)
	}
	inst, err := p.acquire(ctx, hook)
	if err != nil {
		return 0, p.logged(err)
	}
	start := time.Now()
	cctx, cancel := context.WithTimeout(ctx, p.cfg.CallTimeout)
	resp, err := p.roundTrip(cctx, hook, inst, pick(inst), req)
	cancel()
	if err == nil {
		if derr := decode(resp); derr != nil {
			err = p.abiError(hook, derr.Error(), nil)
		}
	}
	if err != nil {
		p.replace(ctx, inst)
		return time.Since(start), p.logged(err)
	}
	p.release(inst)
	return time.Since(start), nil
}

func (p *Plugin) roundTrip(ctx context.Context, hook string, inst *instance, fn api.Function, req []byte) ([]byte, error) {
	inst.stderr.Reset()
	res, err := inst.alloc.Call(ctx, uint64(len(req)))
	if err != nil {
		return nil, p.execError(exportAlloc, err, inst)
	}
	ptr := uint32(res[0])
	if ptr == 0 {
		return nil, p.abiError(exportAlloc, "returned a null pointer", nil)
	}
	if !inst.mem.Write(ptr, req) {
		return nil, p.abiError(exportAlloc, fmt.Sprintf("returned %#x: %d bytes there fall outside the %d-byte memory", ptr, len(req), inst.mem.Size()), nil)
	}
	res, err = fn.Call(ctx, uint64(ptr), uint64(len(req)))
	if err != nil {
		return nil, p.execError(hook, err, inst)
	}
	rptr, rlen := uint32(res[0]>>32), uint32(res[0])
	switch {
	case rlen == 0:
		return nil, p.abiError(hook, "returned an empty response", nil)
	case rlen > MaxResponseBytes:
		return nil, p.abiError(hook, fmt.Sprintf("returned a %d-byte response, the limit is %d", rlen, MaxResponseBytes), nil)
	}
	view, ok := inst.mem.Read(rptr, rlen)
	if !ok {
		return nil, p.abiError(hook, fmt.Sprintf("returned %#x+%d, outside the %d-byte memory", rptr, rlen, inst.mem.Size()), nil)
	}
	// view aliases guest memory: copy before the instance runs again.
	return bytes.Clone(view), nil
}

// ValidateGrant asks the plugin whether a Grant may be proposed. It fails
// closed: on any error the Verdict denies, with Reason "plugin error: ...",
// and the error is a *CallError matching ErrPluginTrap, ErrPluginMemory,
// ErrPluginTimeout, ErrPluginABI, ErrCanceled or ErrClosed (or ErrNoHook
// if the plugin has no policy hook).
func (p *Plugin) ValidateGrant(ctx context.Context, g Grant) (Verdict, error) {
	if !p.hasPolicy {
		return Verdict{Reason: "plugin error: " + p.name + ": has no validate_grant hook"},
			fmt.Errorf("%w: %s validate_grant", ErrNoHook, p.name)
	}
	identity := g.Identity
	req, err := encodeGrant(p.abi, g)
	if err != nil {
		return Verdict{Reason: "plugin error: cannot encode request"}, fmt.Errorf("plugins: encoding grant: %w", err)
	}
	sh, err := p.shares.begin(ctx, identity)
	if err != nil {
		if !errors.Is(err, ErrShareSpent) {
			err = p.ctxError(exportValidateGrant, err)
		}
		return failClosed(p.name, err), err
	}
	var v Verdict
	held, err := p.call(ctx, exportValidateGrant, func(i *instance) api.Function { return i.validate }, req, func(b []byte) error {
		var derr error
		v, derr = decodeVerdict(b)
		return derr
	})
	p.shares.end(identity, sh, held)
	if err != nil {
		return failClosed(p.name, err), err
	}
	if !v.Allow && v.Reason == "" {
		v.Reason = "denied by plugin " + p.name
	}
	return v, nil
}

// OnApplied shows the plugin one applied command and returns the events
// it emits, each stamped with index and the plugin's name. The plugin
// receives copies; nothing it returns can change cmd or res.
func (p *Plugin) OnApplied(ctx context.Context, index uint64, cmd core.Command, res core.Result) ([]Event, error) {
	if !p.hasAudit {
		return nil, fmt.Errorf("%w: %s on_applied", ErrNoHook, p.name)
	}
	req, err := encodeApplied(p.abi, index, cmd, res)
	if err != nil {
		return nil, fmt.Errorf("plugins: encoding applied command: %w", err)
	}
	var evs []Event
	_, err = p.call(ctx, exportOnApplied, func(i *instance) api.Function { return i.onApplied }, req, func(b []byte) error {
		var derr error
		evs, derr = decodeEvents(b, index, p.name)
		return derr
	})
	if err != nil {
		return nil, err
	}
	return evs, nil
}

// Name returns the plugin's name (Config.Name or "sha256:" and the first
// 12 hex digits of its SHA-256).
func (p *Plugin) Name() string { return p.name }

// ABIVersion returns the ABI version the module speaks.
func (p *Plugin) ABIVersion() uint32 { return p.abi }

// SHA256 returns the hex SHA-256 of the module bytes given to Load.
func (p *Plugin) SHA256() string { return p.sha }

// HasPolicy reports whether the plugin implements validate_grant.
func (p *Plugin) HasPolicy() bool { return p.hasPolicy }

// HasAudit reports whether the plugin implements on_applied.
func (p *Plugin) HasAudit() bool { return p.hasAudit }

// Close closes every instance and the runtime. Calls in flight fail with
// ErrClosed; later calls fail with ErrClosed. Close is idempotent.
func (p *Plugin) Close(ctx context.Context) error {
	p.closeOnce.Do(func() {
		p.closed.Store(true)
		close(p.done)
		p.closeErr = p.rt.Close(ctx)
	})
	return p.closeErr
}

// execError classifies an error returned by a guest function.
func (p *Plugin) execError(hook string, err error, inst *instance) error {
	e := &CallError{Plugin: p.name, Hook: hook, Detail: err.Error(), Stderr: inst.stderr.String(), Cause: err}
	var exit *sys.ExitError
	switch {
	case p.closed.Load():
		e.Err = ErrClosed
	case errors.As(err, &exit) && exit.ExitCode() == sys.ExitCodeDeadlineExceeded:
		e.Err = ErrPluginTimeout
	case errors.As(err, &exit) && exit.ExitCode() == sys.ExitCodeContextCanceled:
		e.Err = ErrCanceled
	case outOfMemory(e.Stderr):
		e.Err = ErrPluginMemory
	default:
		e.Err = ErrPluginTrap
	}
	return e
}

// outOfMemory recognises the Go runtime's (and TinyGo's) fatal error when
// memory.grow fails under the limit.
func outOfMemory(stderr string) bool {
	return strings.Contains(stderr, "out of memory")
}

func (p *Plugin) abiError(hook, detail string, cause error) error {
	if cause != nil {
		detail += ": " + cause.Error()
	}
	return &CallError{Plugin: p.name, Hook: hook, Err: ErrPluginABI, Detail: detail, Cause: cause}
}

func (p *Plugin) ctxError(hook string, err error) error {
	e := &CallError{Plugin: p.name, Hook: hook, Err: ErrCanceled, Detail: "before the call started", Cause: err}
	if errors.Is(err, context.DeadlineExceeded) {
		e.Err = ErrPluginTimeout
	}
	return e
}

func (p *Plugin) closedError(hook string) error {
	return &CallError{Plugin: p.name, Hook: hook, Err: ErrClosed}
}

func (p *Plugin) logged(err error) error {
	var ce *CallError
	if errors.As(err, &ce) && ce.Err != ErrClosed {
		p.log.Warn("plugin call failed", "hook", ce.Hook, "err", err, "stderr", ce.Stderr)
	}
	return err
}

// failClosed is the deny Verdict that goes with a failed call.
func failClosed(name string, err error) Verdict {
	var ce *CallError
	if errors.As(err, &ce) {
		return Verdict{Reason: "plugin error: " + ce.Plugin + ": " + ce.short()}
	}
	if errors.Is(err, ErrShareSpent) {
		return Verdict{Reason: "plugin error: " + name + ": the caller's share of its time is spent"}
	}
	return Verdict{Reason: "plugin error: " + name + ": failed"}
}

// funcType formats a wasm function type, e.g. "(i32,i32)->(i64)".
func funcType(params, results []api.ValueType) string {
	f := func(ts []api.ValueType) string {
		s := make([]string, len(ts))
		for i, t := range ts {
			s[i] = api.ValueTypeName(t)
		}
		return "(" + strings.Join(s, ",") + ")"
	}
	return f(params) + "->" + f(results)
}

// capBuffer keeps the first max bytes written to it and drops the rest.
// It belongs to one instance, which one call uses at a time.
type capBuffer struct {
	max int
	buf []byte
}

func (b *capBuffer) Write(p []byte) (int, error) {
	if room := b.max - len(b.buf); room > 0 {
		b.buf = append(b.buf, p[:min(room, len(p))]...)
	}
	return len(p), nil
}

func (b *capBuffer) Reset()         { b.buf = b.buf[:0] }
func (b *capBuffer) String() string { return string(b.buf) }
