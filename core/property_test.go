package core_test

import (
	"bytes"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/ticketd/ticketd/core"
)

// propertySeedEnv overrides the property test's seed, e.g. to replay a
// failure: TICKETD_PROPERTY_SEED=12345 go test -run TestProperty ./core/
const propertySeedEnv = "TICKETD_PROPERTY_SEED"

const defaultPropertySeed = 0x7469636b657464 // "ticketd"

func propertySeed(t *testing.T) uint64 {
	t.Helper()
	seed := uint64(defaultPropertySeed)
	if s := os.Getenv(propertySeedEnv); s != "" {
		v, err := strconv.ParseUint(s, 0, 64)
		if err != nil {
			t.Fatalf("%s=%q: %v", propertySeedEnv, s, err)
		}
		seed = v
	}
	t.Logf("seed %d (replay with %s=%d)", seed, propertySeedEnv, seed)
	return seed
}

// model is an independent reference implementation of SPEC §2-§4, kept as
// plain as possible: key -> token, and a counter.
type model struct {
	held map[string]uint64
	last uint64
}

func (m *model) apply(c core.Command, valid bool) core.Result {
	if !valid {
		return noop
	}
	tok, ok := m.held[c.Key]
	switch c.Kind {
	case core.KindGrant:
		if ok {
			return grantRejected(tok)
		}
		if m.last == math.MaxUint64 {
			return noop
		}
		m.last++
		m.held[c.Key] = m.last
		return granted(m.last)
	case core.KindRelease:
		if ok && tok == c.Token {
			delete(m.held, c.Key)
			return released
		}
		return notFound
	case core.KindExpire:
		if ok && tok == c.Token {
			delete(m.held, c.Key)
			return expiredTrue
		}
		return expiredFalse
	}
	panic("model: unexpected kind " + c.Kind.String())
}

// cmdGen produces random commands over a small key space so that grants
// collide, and picks tokens that are current, stale, random or absurd.
type cmdGen struct {
	r      *rand.Rand
	keys   []string
	issued []uint64            // every token issued so far
	byKey  map[string][]uint64 // tokens issued per key, including stale ones
}

var propertyKeys = []string{"a", "b", "c", "lock/orders/1", "잠금", strings.Repeat("z", core.MaxKeyLen)}

func (g *cmdGen) key() string { return g.keys[g.r.IntN(len(g.keys))] }

func (g *cmdGen) token(key string, mod *model) uint64 {
	for {
		switch p := g.r.IntN(100); {
		case p < 40:
			if tok, ok := mod.held[key]; ok {
				return tok
			}
		case p < 60:
			if ts := g.byKey[key]; len(ts) > 0 {
				return ts[g.r.IntN(len(ts))]
			}
		case p < 75:
			if len(g.issued) > 0 {
				return g.issued[g.r.IntN(len(g.issued))]
			}
		case p < 92:
			return 1 + g.r.Uint64N(mod.last%(1<<62)+3)
		case p < 96:
			return math.MaxUint64
		default:
			return 1 + g.r.Uint64()>>1
		}
	}
}

// command returns the next command and whether it is valid.
func (g *cmdGen) command(mod *model) (core.Command, bool) {
	r := g.r
	switch p := r.IntN(100); {
	case p < 45:
		owner := ""
		if r.IntN(2) == 0 {
			owner = "owner-" + strconv.Itoa(r.IntN(5))
		}
		leaseMS := core.MinLeaseMS + r.Uint64N(core.MaxLeaseMS-core.MinLeaseMS+1)
		return core.Grant(g.key(), owner, leaseMS, r.Uint64()), true
	case p < 70:
		k := g.key()
		return core.Release(k, g.token(k, mod)), true
	case p < 92:
		k := g.key()
		return core.Expire(k, g.token(k, mod)), true
	}
	invalid := []core.Command{
		core.Grant("", "", lease, 0),
		core.Grant(strings.Repeat("k", core.MaxKeyLen+1), "", lease, 0),
		core.Grant(g.key(), "", core.MinLeaseMS-1, 0),
		core.Grant(g.key(), "", core.MaxLeaseMS+1, 0),
		core.Grant(g.key(), strings.Repeat("o", core.MaxOwnerLen+1), lease, 0),
		core.Grant("\xff"+g.key(), "", lease, 0),
		{Kind: core.KindGrant, Key: g.key(), LeaseMS: lease, Token: 1 + r.Uint64N(10)},
		core.Release(g.key(), 0),
		core.Expire(g.key(), 0),
		{Kind: core.KindRelease, Key: g.key(), Token: g.token("a", mod), Owner: "o"},
		{Kind: core.KindExpire, Key: g.key(), Token: g.token("a", mod), LeaseMS: lease},
		{Kind: core.KindControl, Key: g.key()},
		{Kind: core.Kind(r.IntN(256)) | 8, Key: g.key(), Token: 1},
	}
	return invalid[r.IntN(len(invalid))], false
}

func (g *cmdGen) observe(c core.Command, res core.Result) {
	if res.Kind == core.ResultGranted {
		g.issued = append(g.issued, res.Token)
		g.byKey[c.Key] = append(g.byKey[c.Key], res.Token)
	}
}

// replicas are the machines of one sequence, each fed a different way.
type replicas struct {
	direct  *core.Machine // (a) Apply directly
	viaLog  *core.Machine // (b) through EncodeEntry -> DecodeEntry
	viaSnap *core.Machine // (c) replaced by Snapshot -> Restore at random points
	viaRecs *core.Machine // (d) rebuilt from lock records + Load at random points
}

func newReplicas(lastToken uint64) replicas {
	ms := replicas{core.NewMachine(), core.NewMachine(), core.NewMachine(), new(core.Machine)}
	for _, m := range []*core.Machine{ms.direct, ms.viaLog, ms.viaSnap, ms.viaRecs} {
		m.Load(lastToken, nil)
	}
	return ms
}

func TestProperty(t *testing.T) {
	seed := propertySeed(t)
	sequences, maxLen := 2000, 200
	if testing.Short() {
		sequences = 200
	}
	for seq := range sequences {
		runSequence(t, seed, seq, maxLen)
		if t.Failed() {
			t.Fatalf("sequence %d failed (seed %d)", seq, seed)
		}
	}
}

func runSequence(t *testing.T, seed uint64, seq, maxLen int) {
	r := rand.New(rand.NewPCG(seed, uint64(seq)))
	g := &cmdGen{r: r, keys: propertyKeys[:1+r.IntN(len(propertyKeys))], byKey: map[string][]uint64{}}
	mod := &model{held: map[string]uint64{}}
	// Most sequences start from a fresh counter; some start from a restored
	// high one, and a few right below the end of the token space.
	switch p := r.IntN(100); {
	case p < 10:
		mod.last = r.Uint64N(1 << 40)
	case p < 15:
		mod.last = math.MaxUint64 - r.Uint64N(40)
	}
	ms := newReplicas(mod.last)
	var history []core.Command
	fail := func(format string, args ...any) {
		t.Helper()
		t.Errorf("seq %d step %d: "+format, append([]any{seq, len(history)}, args...)...)
		tail := history[max(0, len(history)-20):]
		t.Logf("last %d commands: %+v", len(tail), tail)
	}

	n := 1 + r.IntN(maxLen)
	for step := range n {
		if r.IntN(16) == 0 {
			ms.viaSnap = snapshotRestore(t, ms.viaSnap, step%2 == 0)
		}
		if r.IntN(16) == 0 {
			ms.viaRecs = rebuildFromRecords(t, r, ms.viaRecs)
		}
		c, valid := g.command(mod)
		history = append(history, c)
		lastBefore := ms.direct.LastToken()

		want := mod.apply(c, valid)
		ra := ms.direct.Apply(c)
		rb := applyViaLog(t, ms.viaLog, uint64(step), c, valid)
		rc := ms.viaSnap.Apply(c)
		rd := ms.viaRecs.Apply(c)
		if ra != want || rb != want || rc != want || rd != want {
			fail("%+v: model %v, direct %v, via log %v, via snapshot %v, via records %v", c, want, ra, rb, rc, rd)
			return
		}
		if valid != (c.Validate() == nil) {
			fail("%+v: Validate() = %v, generator says valid=%t", c, c.Validate(), valid)
			return
		}
		g.observe(c, ra)

		// Token invariants: a grant takes exactly the next token, so every
		// Granted token is above every earlier one; nothing else moves it.
		last := ms.direct.LastToken()
		switch {
		case ra.Kind == core.ResultGranted && (ra.Token != lastBefore+1 || last != ra.Token):
			fail("granted %d with counter %d -> %d", ra.Token, lastBefore, last)
			return
		case ra.Kind != core.ResultGranted && last != lastBefore:
			fail("%v moved the counter %d -> %d", ra, lastBefore, last)
			return
		}
		if ms.direct.Len() != len(mod.held) {
			fail("Len() = %d, model holds %d", ms.direct.Len(), len(mod.held))
			return
		}
	}

	checkTable(t, ms.direct, mod)
	want := ms.direct.Snapshot()
	for name, m := range map[string]*core.Machine{"via log": ms.viaLog, "via snapshot": ms.viaSnap, "via records": ms.viaRecs} {
		if m.Digest() != ms.direct.Digest() || !bytes.Equal(m.Snapshot(), want) {
			fail("%s replica diverged:\n direct %x\n %s %x", name, want, name, m.Snapshot())
		}
	}
	// Tokens issued in this sequence are strictly increasing overall.
	if !slices.IsSorted(g.issued) || len(slices.Compact(slices.Clone(g.issued))) != len(g.issued) {
		fail("issued tokens not strictly increasing: %v", g.issued)
	}
}

// applyViaLog is what a replica does with a raft entry: decode, then apply.
// Transports validate before proposing, so a valid command must survive the
// round trip exactly. An invalid one must not turn into itself: either the
// decoder rejects it (the replica skips it), or EncodeEntry dropped the
// fields that made it invalid, which a proposer never relies on.
func applyViaLog(t *testing.T, m *core.Machine, reqID uint64, c core.Command, valid bool) core.Result {
	t.Helper()
	b := core.EncodeEntry(core.Entry{RequestID: reqID, Command: c})
	e, err := core.DecodeEntry(b)
	switch {
	case valid && err != nil:
		t.Fatalf("valid %+v does not decode: %v", c, err)
	case valid && (e.Command != c || e.RequestID != reqID):
		t.Fatalf("valid %+v round-trips to %+v", c, e)
	case !valid:
		if err == nil && e.Command == c {
			t.Fatalf("decoder accepted invalid %+v", c)
		}
		return noop
	}
	return m.Apply(e.Command)
}

func snapshotRestore(t *testing.T, m *core.Machine, zeroValue bool) *core.Machine {
	t.Helper()
	snap := m.Snapshot()
	fresh := core.NewMachine()
	if zeroValue {
		fresh = new(core.Machine)
	}
	if err := fresh.Restore(snap); err != nil {
		t.Fatalf("Restore(own snapshot): %v", err)
	}
	if !bytes.Equal(fresh.Snapshot(), snap) {
		t.Fatal("Snapshot(Restore(s)) != s")
	}
	return fresh
}

// rebuildFromRecords mimics a restart from per-key storage rows: every lock
// is written as a record, read back in storage order (any order), and loaded
// with the persisted counter. A nil r keeps key order.
func rebuildFromRecords(t *testing.T, r *rand.Rand, m *core.Machine) *core.Machine {
	t.Helper()
	var locks []core.Lock
	for _, l := range m.Locks() {
		got, err := core.DecodeLockRecord(core.EncodeLockRecord(l))
		if err != nil || got != l {
			t.Fatalf("lock record round trip of %+v: %+v, %v", l, got, err)
		}
		locks = append(locks, got)
	}
	if r != nil {
		r.Shuffle(len(locks), func(i, j int) { locks[i], locks[j] = locks[j], locks[i] })
	}
	fresh := core.NewMachine()
	fresh.Load(m.LastToken(), locks)
	return fresh
}

// checkTable asserts the table invariants and agreement with the model.
func checkTable(t *testing.T, m *core.Machine, mod *model) {
	t.Helper()
	locks := m.Locks()
	tokens := map[uint64]bool{}
	for i, l := range locks {
		if i > 0 && locks[i-1].Key >= l.Key {
			t.Fatalf("keys not strictly ascending (two holders for a key?): %q then %q", locks[i-1].Key, l.Key)
		}
		if l.Token == 0 || l.Token > m.LastToken() || tokens[l.Token] {
			t.Fatalf("lock %+v: token 0, above LastToken %d, or shared", l, m.LastToken())
		}
		tokens[l.Token] = true
		if mod.held[l.Key] != l.Token {
			t.Fatalf("lock %+v, model has token %d", l, mod.held[l.Key])
		}
		if got, ok := m.Get(l.Key); !ok || got != l {
			t.Fatalf("Get(%q) = %+v, %t; Locks has %+v", l.Key, got, ok, l)
		}
	}
	if len(locks) != len(mod.held) || m.Len() != len(locks) || m.LastToken() != mod.last {
		t.Fatalf("table %d locks (Len %d), last %d; model %d locks, last %d", len(locks), m.Len(), m.LastToken(), len(mod.held), mod.last)
	}
}
