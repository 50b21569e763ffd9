package plugins

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// Hand-made modules: the ABI is not Go-specific, and a hostile module can
// do things no Go guest would.

func TestRawModuleWithoutWASI(t *testing.T) {
	p := loadBytes(t, rawAllowModule().encode(), Config{})
	if !p.HasPolicy() || p.HasAudit() {
		t.Fatalf("HasPolicy=%v HasAudit=%v", p.HasPolicy(), p.HasAudit())
	}
	wantAllows(t, p, "any")
}

func TestRawLoadRefusals(t *testing.T) {
	with := func(edit func(*rawModule)) []byte {
		m := rawAllowModule()
		edit(&m)
		return m.encode()
	}
	for _, tc := range []struct {
		name   string
		wasm   []byte
		detail string
	}{
		{"not wasm", []byte("definitely not wasm"), "not a valid module"},
		{"empty", nil, "not a valid module"},
		{"no alloc", with(func(m *rawModule) { m.funcs = append(m.funcs[:1], m.funcs[2:]...) }), "does not export ticketd_alloc"},
		{"no version", with(func(m *rawModule) { m.funcs = m.funcs[1:] }), "does not export ticketd_abi_version"},
		{"no hooks", with(func(m *rawModule) { m.funcs = m.funcs[:2] }), "neither validate_grant nor on_applied"},
		{"version type", with(func(m *rawModule) {
			m.funcs[0] = rawFunc{export: "ticketd_abi_version", results: []byte{tI64}, body: i64Const(1)}
		}), "has type ()->(i64), want ()->(i32)"},
		{"hook type", with(func(m *rawModule) {
			m.funcs[2] = rawFunc{export: "validate_grant", params: []byte{tI32, tI32}, results: []byte{tI32}, body: i32Const(0)}
		}), "export validate_grant has type"},
		{"foreign import", with(func(m *rawModule) {
			m.imports = []rawImport{{module: "env", name: "now", results: []byte{tI64}}}
		}), "imports env.now"},
		{"unknown wasi import", with(func(m *rawModule) {
			m.imports = []rawImport{{module: "wasi_snapshot_preview1", name: "no_such_call"}}
		}), "cannot instantiate"},
		{"command", with(func(m *rawModule) { m.funcs = append(m.funcs, rawFunc{export: "_start"}) }), "-buildmode=c-shared"},
		{"no memory", with(func(m *rawModule) { m.noMemory = true; m.data = nil }), `does not export its memory`},
		{"memory renamed", with(func(m *rawModule) { m.memExport = "mem" }), `does not export its memory`},
		{"memory too big", with(func(m *rawModule) { m.memPages = 300 }), "over limit of 256 pages"},
		{"version 0", with(func(m *rawModule) { m.funcs[0] = rawABIVersion(0) }), "ABI version 0"},
		{"version 3", with(func(m *rawModule) { m.funcs[0] = rawABIVersion(3) }), "module speaks ABI version 3, this host speaks 1 to 2"},
		{"unknown hook bits", with(func(m *rawModule) {
			m.funcs = append(m.funcs, rawFunc{export: "ticketd_hooks", results: []byte{tI32}, body: i32Const(5)})
		}), "unknown hook bits 0x4"},
		{"hooks claim missing export", with(func(m *rawModule) {
			m.funcs = append(m.funcs, rawFunc{export: "ticketd_hooks", results: []byte{tI32}, body: i32Const(3)})
		}), "claims on_applied"},
		{"hooks claim nothing", with(func(m *rawModule) {
			m.funcs = append(m.funcs, rawFunc{export: "ticketd_hooks", results: []byte{tI32}, body: i32Const(0)})
		}), "neither validate_grant nor on_applied"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := Load(ctx, tc.wasm, Config{})
			if err == nil {
				p.Close(ctx)
				t.Fatal("Load succeeded")
			}
			var ce *CallError
			if !errors.Is(err, ErrPluginABI) || !errors.As(err, &ce) {
				t.Fatalf("Load = %v, want ErrPluginABI", err)
			}
			if !strings.Contains(err.Error(), tc.detail) {
				t.Errorf("Load = %v, want it to mention %q", err, tc.detail)
			}
		})
	}
}

func TestRawHooksBitsNarrowExports(t *testing.T) {
	m := rawAllowModule()
	m.funcs = append(m.funcs,
		rawHook("on_applied", opUnreachable),
		rawFunc{export: "ticketd_hooks", results: []byte{tI32}, body: i32Const(1)})
	p := loadBytes(t, m.encode(), Config{})
	if !p.HasPolicy() || p.HasAudit() {
		t.Fatalf("ticketd_hooks=1: HasPolicy=%v HasAudit=%v, want true false", p.HasPolicy(), p.HasAudit())
	}
}

func TestRawInitLoopTimesOut(t *testing.T) {
	m := rawAllowModule()
	m.funcs = append(m.funcs, rawFunc{export: "_initialize", body: opLoopForever})
	start := time.Now()
	_, err := Load(ctx, m.encode(), Config{InitTimeout: 50 * time.Millisecond})
	if !errors.Is(err, ErrPluginTimeout) {
		t.Fatalf("Load = %v, want ErrPluginTimeout", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("cut off after %v", d)
	}
}

func TestRawInitTrap(t *testing.T) {
	m := rawAllowModule()
	m.funcs = append(m.funcs, rawFunc{export: "_initialize", body: opUnreachable})
	if _, err := Load(ctx, m.encode(), Config{}); !errors.Is(err, ErrPluginTrap) {
		t.Fatalf("Load = %v, want ErrPluginTrap", err)
	}
}

func TestRawCallFaults(t *testing.T) {
	for _, tc := range []struct {
		name     string
		edit     func(*rawModule)
		sentinel error
		detail   string
	}{
		{"unreachable", func(m *rawModule) { m.funcs[2] = rawHook("validate_grant", opUnreachable) }, ErrPluginTrap, "unreachable"},
		{"alloc wild pointer", func(m *rawModule) { m.funcs[1] = rawAlloc(-16) }, ErrPluginABI, "fall outside"},
		{"alloc at the edge", func(m *rawModule) { m.funcs[1] = rawAlloc(65536 - 8) }, ErrPluginABI, "fall outside"},
		{"alloc null", func(m *rawModule) { m.funcs[1] = rawAlloc(0) }, ErrPluginABI, "null pointer"},
		{"alloc traps", func(m *rawModule) {
			m.funcs[1] = rawFunc{export: "ticketd_alloc", params: []byte{tI32}, results: []byte{tI32}, body: opUnreachable}
		}, ErrPluginTrap, "ticketd_alloc"},
		{"response past the end", func(m *rawModule) {
			m.funcs[2] = rawHook("validate_grant", i64Const(65530<<32|14))
		}, ErrPluginABI, "outside the 65536-byte memory"},
		{"hook loops", func(m *rawModule) {
			m.funcs[2] = rawHook("validate_grant", append(append([]byte{}, opLoopForever...), opUnreachable...))
		}, ErrPluginTimeout, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := rawAllowModule()
			tc.edit(&m)
			p := loadBytes(t, m.encode(), Config{CallTimeout: CallTimeoutDefault})
			for i := 0; i < 2; i++ { // the second call runs on a fresh instance
				v, err := p.ValidateGrant(ctx, Grant{Key: "k", Owner: "o", Identity: "", LeaseMS: 1000})
				ce := wantFailClosed(t, v, err, tc.sentinel)
				if !strings.Contains(ce.Error(), tc.detail) {
					t.Errorf("err = %v, want it to mention %q", err, tc.detail)
				}
			}
		})
	}
}
