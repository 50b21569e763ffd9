package plugins

// A tiny WebAssembly binary encoder for hand-made test modules: guests
// that a Go compiler would never produce (an alloc that returns a wild
// pointer, a module with no WASI and no _initialize, a missing export).

const (
	tI32 = 0x7f
	tI64 = 0x7e
)

type rawFunc struct {
	export          string // "" for none
	params, results []byte
	body            []byte // instructions, without the final end
}

type rawImport struct {
	module, name    string
	params, results []byte
}

type rawData struct {
	offset int32
	bytes  []byte
}

type rawModule struct {
	imports   []rawImport
	funcs     []rawFunc
	memPages  uint32
	noMemory  bool
	memExport string // default "memory"
	data      []rawData
}

func uleb(v uint64) []byte {
	var b []byte
	for {
		c := byte(v & 0x7f)
		v >>= 7
		if v != 0 {
			c |= 0x80
		}
		b = append(b, c)
		if v == 0 {
			return b
		}
	}
}

func sleb(v int64) []byte {
	var b []byte
	for {
		c := byte(v & 0x7f)
		v >>= 7
		if (v == 0 && c&0x40 == 0) || (v == -1 && c&0x40 != 0) {
			return append(b, c)
		}
		b = append(b, c|0x80)
	}
}

func name(s string) []byte { return append(uleb(uint64(len(s))), s...) }

func vec(items [][]byte) []byte {
	out := uleb(uint64(len(items)))
	for _, it := range items {
		out = append(out, it...)
	}
	return out
}

func section(id byte, content []byte) []byte {
	return append(append([]byte{id}, uleb(uint64(len(content)))...), content...)
}

func functype(params, results []byte) []byte {
	b := []byte{0x60}
	b = append(b, uleb(uint64(len(params)))...)
	b = append(b, params...)
	b = append(b, uleb(uint64(len(results)))...)
	return append(b, results...)
}

// Instructions.
func i32Const(v int32) []byte { return append([]byte{0x41}, sleb(int64(v))...) }
func i64Const(v int64) []byte { return append([]byte{0x42}, sleb(v)...) }

var (
	opUnreachable = []byte{0x00}
	opLoopForever = []byte{0x03, 0x40, 0x0c, 0x00, 0x0b} // loop; br 0; end
)

func (m rawModule) encode() []byte {
	out := []byte("\x00asm\x01\x00\x00\x00")
	var types, imports, funcs, exports, codes, datas [][]byte
	for i, im := range m.imports {
		types = append(types, functype(im.params, im.results))
		imports = append(imports, append(append(name(im.module), name(im.name)...), append([]byte{0x00}, uleb(uint64(i))...)...))
	}
	for i, f := range m.funcs {
		ti := len(types)
		types = append(types, functype(f.params, f.results))
		funcs = append(funcs, uleb(uint64(ti)))
		if f.export != "" {
			exports = append(exports, append(name(f.export), append([]byte{0x00}, uleb(uint64(len(m.imports)+i))...)...))
		}
		body := append([]byte{0x00}, f.body...) // no locals
		body = append(body, 0x0b)
		codes = append(codes, append(uleb(uint64(len(body))), body...))
	}
	if !m.noMemory {
		mexp := m.memExport
		if mexp == "" {
			mexp = "memory"
		}
		exports = append(exports, append(name(mexp), 0x02, 0x00))
	}
	for _, d := range m.data {
		seg := append([]byte{0x00}, i32Const(d.offset)...)
		seg = append(seg, 0x0b)
		seg = append(seg, uleb(uint64(len(d.bytes)))...)
		datas = append(datas, append(seg, d.bytes...))
	}
	out = append(out, section(1, vec(types))...)
	if len(imports) > 0 {
		out = append(out, section(2, vec(imports))...)
	}
	out = append(out, section(3, vec(funcs))...)
	if !m.noMemory {
		pages := m.memPages
		if pages == 0 {
			pages = 1
		}
		out = append(out, section(5, vec([][]byte{append([]byte{0x00}, uleb(uint64(pages))...)}))...)
	}
	out = append(out, section(7, vec(exports))...)
	out = append(out, section(10, vec(codes))...)
	if len(datas) > 0 {
		out = append(out, section(11, vec(datas))...)
	}
	return out
}

// Building blocks of a well-behaved raw plugin.

const rawAllowJSON = `{"allow":true}`

func rawABIVersion(v int32) rawFunc {
	return rawFunc{export: "ticketd_abi_version", results: []byte{tI32}, body: i32Const(v)}
}

func rawAlloc(ptr int32) rawFunc {
	return rawFunc{export: "ticketd_alloc", params: []byte{tI32}, results: []byte{tI32}, body: i32Const(ptr)}
}

func rawHook(export string, body []byte) rawFunc {
	return rawFunc{export: export, params: []byte{tI32, tI32}, results: []byte{tI64}, body: body}
}

// rawRespond returns the packed pointer/length of a data segment at 0x100.
func rawRespond(n int) []byte { return i64Const(0x100<<32 | int64(n)) }

// rawAllowModule is a complete, valid plugin in a few hundred bytes: no
// WASI, no _initialize, a constant allow.
func rawAllowModule() rawModule {
	return rawModule{
		funcs: []rawFunc{
			rawABIVersion(1),
			rawAlloc(0x1000),
			rawHook("validate_grant", rawRespond(len(rawAllowJSON))),
		},
		data: []rawData{{offset: 0x100, bytes: []byte(rawAllowJSON)}},
	}
}
