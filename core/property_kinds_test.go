package core_test

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"testing"

	"github.com/ticketd/ticketd/core"
)

// The property test of semaphores and read/write locks (kinds.go): random
// commands on a few keys (mutex, shared, exclusive and semaphore Grants,
// with and without lock-delays and sessions, per-holder Release, Renew
// and Expire with current and stale tokens, ClearDelay of keys and slots,
// sessions closed and expired) applied to three replicas, one of them
// rebuilt from its snapshot and one from its storage records now and
// then, and to an independent model: a plain list of holders per key. The
// results must agree with the model, the replicas' digests with each
// other, and the state must keep the invariants: never more than N
// holders of a semaphore, never a shared holder beside an exclusive one,
// tokens per key rising, an exclusive grant's token above every shared
// token of its key granted before it.

// kHold is one holder in the model.
type kHold struct {
	token, session, delayMS uint64
	limit                   uint32
	mode                    core.Mode
}

// kKey is one key in the model: its holders (token order), delayed slots
// (seq order) and its delay as a key (a failed mutex or exclusive holder).
type kKey struct {
	holders  []kHold
	slots    []uint64
	keyDelay uint64 // seq; 0: none
}

type kindsModel struct {
	keys     map[string]*kKey
	last     uint64
	lastSeq  uint64
	sessions map[uint64]uint64 // open session -> its lock-delay
	lastSess uint64
	delays   int // delayed keys + delayed slots
	maxDelay int
}

func (m *kindsModel) key(k string) *kKey {
	if m.keys[k] == nil {
		m.keys[k] = &kKey{}
	}
	return m.keys[k]
}

func multiHold(h kHold) bool { return h.limit > 1 || h.mode == core.ModeShared }

// kind returns the key's kind (from a holder, else from the slots' kind
// remembered in slotKind) and whether it is a multi-holder key.
func (k *kKey) multi(slotKind map[string]kHold, name string) (kHold, bool) {
	if len(k.holders) > 0 {
		return k.holders[0], multiHold(k.holders[0])
	}
	if len(k.slots) > 0 {
		return slotKind[name], true
	}
	return kHold{}, false
}

func (m *kindsModel) sessionCount(id uint64) int {
	n := 0
	for _, k := range m.keys {
		for _, h := range k.holders {
			if h.session == id {
				n++
			}
		}
	}
	return n
}

func (m *kindsModel) grant(c core.Command, slotKind map[string]kHold) core.Result {
	k := m.key(c.Key)
	oldest := uint64(0)
	if len(k.holders) > 0 {
		oldest = k.holders[0].token
	}
	if kind, multi := k.multi(slotKind, c.Key); len(k.holders) > 0 && !multi {
		if c.Limit > 1 {
			return core.Result{Kind: core.ResultLimitMismatch, Limit: 1, Token: oldest}
		}
		return core.Result{Kind: core.ResultGrantRejected, Token: oldest}
	} else if multi {
		used := len(k.holders) + len(k.slots)
		switch {
		case c.Limit != kind.limit:
			return core.Result{Kind: core.ResultLimitMismatch, Limit: max(1, kind.limit), Token: oldest}
		case kind.limit > 1 && len(k.holders) >= int(kind.limit):
			return core.Result{Kind: core.ResultGrantRejected, Token: oldest}
		case kind.limit > 1 && used >= int(kind.limit):
			return core.Result{Kind: core.ResultDelayed}
		case kind.limit <= 1 && c.Mode == core.ModeExclusive && len(k.holders) > 0:
			return core.Result{Kind: core.ResultGrantRejected, Token: oldest}
		case kind.limit <= 1 && c.Mode == core.ModeExclusive:
			return core.Result{Kind: core.ResultDelayed}
		case kind.limit <= 1 && used >= core.MaxHoldersPerKey:
			return core.Result{Kind: core.ResultHoldersExhausted}
		}
	}
	if k.keyDelay != 0 {
		return core.Result{Kind: core.ResultDelayed}
	}
	if c.SessionID != 0 {
		if _, ok := m.sessions[c.SessionID]; !ok {
			return core.Result{Kind: core.ResultSessionNotFound}
		}
	}
	m.last++
	h := kHold{token: m.last, session: c.SessionID, delayMS: c.LockDelayMS, limit: c.Limit, mode: c.Mode}
	k.holders = append(k.holders, h)
	slotKind[c.Key] = h
	return core.Result{Kind: core.ResultGranted, Token: m.last}
}

// end removes holder i of key and, for a failure with delayMS, delays its
// slot or its key.
func (m *kindsModel) end(name string, i int, delayMS uint64) {
	k := m.keys[name]
	h := k.holders[i]
	k.holders = slices.Delete(k.holders, i, i+1)
	if delayMS == 0 {
		return
	}
	m.lastSeq++
	m.delays++
	if multiHold(h) {
		k.slots = append(k.slots, m.lastSeq)
	} else {
		k.keyDelay = m.lastSeq
	}
}

func (m *kindsModel) find(name string, token uint64) int {
	k := m.keys[name]
	if k == nil {
		return -1
	}
	for i, h := range k.holders {
		if h.token == token {
			return i
		}
	}
	return -1
}

func (m *kindsModel) apply(c core.Command, slotKind map[string]kHold) core.Result {
	switch c.Kind {
	case core.KindGrant:
		return m.grant(c, slotKind)
	case core.KindRelease:
		i := m.find(c.Key, c.Token)
		if i < 0 {
			return core.Result{Kind: core.ResultNotFound}
		}
		m.end(c.Key, i, 0)
		return core.Result{Kind: core.ResultReleased}
	case core.KindRenew:
		i := m.find(c.Key, c.Token)
		switch {
		case i < 0:
			return core.Result{Kind: core.ResultNotFound}
		case m.keys[c.Key].holders[i].session != 0:
			return core.Result{Kind: core.ResultNoop}
		}
		return core.Result{Kind: core.ResultRenewed, Token: c.Token}
	case core.KindExpire:
		i := m.find(c.Key, c.Token)
		if i < 0 || m.keys[c.Key].holders[i].session != 0 {
			return core.Result{Kind: core.ResultExpired}
		}
		h := m.keys[c.Key].holders[i]
		if h.delayMS > 0 && m.delays >= m.maxDelay {
			return core.Result{Kind: core.ResultDelaysExhausted}
		}
		m.end(c.Key, i, h.delayMS)
		return core.Result{Kind: core.ResultExpired, Existed: true}
	case core.KindClearDelay:
		k := m.keys[c.Key]
		if k != nil && k.keyDelay == c.DelaySeq {
			k.keyDelay = 0
			m.delays--
			return core.Result{Kind: core.ResultDelayCleared}
		}
		if k != nil {
			if i := slices.Index(k.slots, c.DelaySeq); i >= 0 {
				k.slots = slices.Delete(k.slots, i, i+1)
				m.delays--
				return core.Result{Kind: core.ResultDelayCleared}
			}
		}
		return core.Result{Kind: core.ResultNotFound}
	case core.KindOpenSession:
		m.lastSess++
		m.sessions[m.lastSess] = c.LockDelayMS
		return core.Result{Kind: core.ResultSessionOpened, Session: m.lastSess, Epoch: 1}
	case core.KindCloseSession, core.KindExpireSession:
		delayMS, ok := m.sessions[c.SessionID]
		if !ok {
			if c.Kind == core.KindCloseSession {
				return core.Result{Kind: core.ResultSessionNotFound}
			}
			return core.Result{Kind: core.ResultSessionExpired, Session: c.SessionID}
		}
		if c.Kind == core.KindCloseSession {
			delayMS = 0
		} else if delayMS > 0 && m.delays+m.sessionCount(c.SessionID) > m.maxDelay {
			return core.Result{Kind: core.ResultDelaysExhausted}
		}
		names := make([]string, 0, len(m.keys))
		for name := range m.keys {
			names = append(names, name)
		}
		sort.Strings(names) // key order, then token order within a key
		n := uint64(0)
		for _, name := range names {
			for i := 0; i < len(m.keys[name].holders); {
				if m.keys[name].holders[i].session == c.SessionID {
					m.end(name, i, delayMS)
					n++
					continue
				}
				i++
			}
		}
		delete(m.sessions, c.SessionID)
		if c.Kind == core.KindCloseSession {
			return core.Result{Kind: core.ResultSessionClosed, Session: c.SessionID, Count: n}
		}
		return core.Result{Kind: core.ResultSessionExpired, Session: c.SessionID, Existed: true, Count: n}
	}
	return core.Result{Kind: core.ResultNoop}
}

// nextKindsCommand makes a random command for the model's state.
func nextKindsCommand(r *rand.Rand, m *kindsModel) core.Command {
	name := fmt.Sprintf("k%d", r.IntN(4))
	k := m.key(name)
	pickToken := func() uint64 {
		if len(k.holders) == 0 || r.IntN(6) == 0 {
			return 1 + r.Uint64N(m.last+1) // often stale
		}
		return k.holders[r.IntN(len(k.holders))].token
	}
	switch p := r.IntN(100); {
	case p < 45:
		c := core.Grant(name, "o", lease, 1)
		switch r.IntN(5) {
		case 0:
			c = c.WithKind(0, core.ModeShared)
		case 1:
			c = c.WithKind(uint32(2+r.IntN(2)), core.ModeExclusive)
		case 2:
			c = c.WithKind(0, core.ModeShared)
		}
		if r.IntN(3) == 0 && len(m.sessions) > 0 {
			ids := make([]uint64, 0, len(m.sessions))
			for id := range m.sessions {
				ids = append(ids, id)
			}
			slices.Sort(ids)
			c = c.InSession(ids[r.IntN(len(ids))])
		} else if r.IntN(2) == 0 {
			c = c.WithLockDelay(delay)
		}
		return c
	case p < 58:
		return core.Release(name, pickToken())
	case p < 72:
		return core.Expire(name, pickToken())
	case p < 76:
		return core.Renew(name, pickToken(), 2*lease)
	case p < 86:
		seqs := slices.Clone(k.slots)
		if k.keyDelay != 0 {
			seqs = append(seqs, k.keyDelay)
		}
		if len(seqs) == 0 || r.IntN(8) == 0 {
			return core.ClearDelay(name, 1+r.Uint64N(m.lastSeq+1))
		}
		return core.ClearDelay(name, seqs[r.IntN(len(seqs))])
	case p < 90:
		return core.OpenSession("", ttl, uint64(r.IntN(2))*delay)
	default:
		id := 1 + r.Uint64N(m.lastSess+1)
		if r.IntN(2) == 0 {
			return core.CloseSession(id, "")
		}
		return core.ExpireSession(id, 1)
	}
}

func TestKindsProperty(t *testing.T) {
	seed := propertySeed(t)
	for run := range 8 {
		t.Run(fmt.Sprint(run), func(t *testing.T) {
			r := rand.New(rand.NewPCG(seed, uint64(run)))
			maxDelay := 3 + r.IntN(6)
			replicas := []*core.Machine{v5Machine(t), v5Machine(t), v5Machine(t)}
			for _, x := range replicas {
				x.SetSessionLimitsForTest(0, 0, maxDelay)
			}
			mod := &kindsModel{keys: map[string]*kKey{}, sessions: map[uint64]uint64{}, maxDelay: maxDelay}
			slotKind := map[string]kHold{}   // the kind of a key's last grant, which its slots keep
			maxEver := map[string]uint64{}   // highest token ever granted per key
			maxShared := map[string]uint64{} // highest shared token ever granted per key
			counts := map[core.ResultKind]int{}
			for step := range 600 {
				c := nextKindsCommand(r, mod)
				want := mod.apply(c, slotKind)
				for i, x := range replicas {
					if got := x.Apply(c); got != want {
						t.Fatalf("step %d replica %d: %+v = %v, model %v", step, i, c, got, want)
					}
				}
				counts[want.Kind]++
				if want.Kind == core.ResultGranted {
					if want.Token <= maxEver[c.Key] {
						t.Fatalf("step %d: token %d of %q not above %d", step, want.Token, c.Key, maxEver[c.Key])
					}
					maxEver[c.Key] = want.Token
					if c.Mode == core.ModeShared {
						maxShared[c.Key] = want.Token
					} else if c.Limit == 0 && want.Token <= maxShared[c.Key] {
						t.Fatalf("step %d: exclusive token %d of %q not above shared %d", step, want.Token, c.Key, maxShared[c.Key])
					}
				}
				for i := 1; i < len(replicas); i++ {
					if replicas[i].Digest() != replicas[0].Digest() {
						t.Fatalf("step %d: replica %d diverged", step, i)
					}
				}
				checkKindsInvariants(t, replicas[0], mod)
				if step%97 == 96 {
					x := core.NewMachine()
					if err := x.Restore(replicas[0].Snapshot()); err != nil {
						t.Fatal(err)
					}
					x.SetSessionLimitsForTest(0, 0, maxDelay)
					replicas[1] = x
					y := rebuildFromRecords(t, r, replicas[0])
					y.SetSessionLimitsForTest(0, 0, maxDelay)
					replicas[2] = y
				}
			}
			for _, k := range []core.ResultKind{core.ResultGranted, core.ResultGrantRejected, core.ResultLimitMismatch, core.ResultDelayed,
				core.ResultDelayCleared, core.ResultReleased, core.ResultRenewed} {
				if counts[k] == 0 {
					t.Fatalf("no %s in the run: the test did not test (%v)", k, counts)
				}
			}
		})
	}
}

// checkKindsInvariants checks the machine's keys against the model and the
// rules: at most N holders of a semaphore (with its delayed slots), never
// a shared holder beside an exclusive one, holders in token order.
func checkKindsInvariants(t *testing.T, m *core.Machine, mod *kindsModel) {
	t.Helper()
	for name, k := range mod.keys {
		got := m.Holders(name)
		if len(got) != len(k.holders) {
			t.Fatalf("%q: %d holders, model %d", name, len(got), len(k.holders))
		}
		shared, exclusive := 0, 0
		for i, l := range got {
			if l.Token != k.holders[i].token || l.Limit != k.holders[i].limit || l.Mode != k.holders[i].mode {
				t.Fatalf("%q holder %d: %+v, model %+v", name, i, l, k.holders[i])
			}
			if i > 0 && l.Token <= got[i-1].Token {
				t.Fatalf("%q: holders not in token order", name)
			}
			if l.Mode == core.ModeShared {
				shared++
			} else {
				exclusive++
			}
			if l.Limit > 1 && len(got)+len(k.slots) > int(l.Limit) {
				t.Fatalf("%q: %d holders and %d slots, limit %d", name, len(got), len(k.slots), l.Limit)
			}
		}
		if shared > 0 && exclusive > 0 || exclusive > 1 && got[0].Limit <= 1 {
			t.Fatalf("%q: %d shared beside %d exclusive", name, shared, exclusive)
		}
		kh, _ := m.KeyHolders(name)
		var slots []uint64
		for _, d := range kh.Delays {
			slots = append(slots, d.Seq)
		}
		if !slices.Equal(slots, k.slots) {
			t.Fatalf("%q: slots %v, model %v", name, slots, k.slots)
		}
		d, ok := m.Delay(name)
		if ok != (k.keyDelay != 0) || ok && d.Seq != k.keyDelay {
			t.Fatalf("%q: key delay %+v %t, model %d", name, d, ok, k.keyDelay)
		}
		var all []uint64
		for _, d := range m.Delays(name) {
			all = append(all, d.Seq)
		}
		want := k.slots // a key is delayed as a key or has delayed slots, never both
		if k.keyDelay != 0 {
			want = append(slices.Clone(k.slots), k.keyDelay)
		}
		if !slices.Equal(all, want) {
			t.Fatalf("%q: Delays %v, model slots %v, key delay %d", name, all, k.slots, k.keyDelay)
		}
	}
}
