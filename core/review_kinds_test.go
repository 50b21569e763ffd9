package core_test

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"

	"github.com/ticketd/ticketd/core"
)

// TestKindsAttackProperty is the review's attack on the multi-holder keys
// (kinds.go), beside TestKindsProperty: it adds what that test leaves out
// — request ids (retries of held and ended grants, one id reused on
// another key, two identities sharing ids), RefreshSession, small bounds
// reached (holders per key, locks per session, delays, request records)
// and a data clock that moves so that ended records are forgotten — and
// checks the rules from the machine's own state rather than a model:
// replicas rebuilt from snapshot and from records agree byte for byte,
// never more than N holders and slots of a semaphore, never a shared
// holder beside an exclusive one or a key both held and delayed, tokens
// per key rising, a retry answered with the first grant's token, the
// fence lookup accepting exactly the current holders, and every bound.
func TestKindsAttackProperty(t *testing.T) {
	seed := propertySeed(t)
	counts := map[core.ResultKind]int{} // over every run
	for run := range 6 {
		t.Run(fmt.Sprint(run), func(t *testing.T) {
			r := rand.New(rand.NewPCG(seed^0x5eed25, uint64(run)))
			limit := func(m *core.Machine) *core.Machine {
				m.SetSessionLimitsForTest(0, attackMaxLocksPerSession, attackMaxDelays)
				m.SetMaxHoldersForTest(attackMaxHolders)
				m.SetRequestLimitForTest(attackMaxRequests)
				return m
			}
			replicas := []*core.Machine{limit(v5Machine(t)), limit(v5Machine(t)), limit(v5Machine(t))}
			a := &kindsAttack{
				maxEver: map[string]uint64{}, first: map[string]uint64{}, firstKey: map[string]string{},
			}
			clock := uint64(1)
			for step := range 1500 {
				clock += uint64(r.IntN(40_000)) // ended records are forgotten after RequestRetentionMS
				c := a.next(r, replicas[0], clock)
				want := replicas[0].Apply(c)
				for i := 1; i < len(replicas); i++ {
					if got := replicas[i].Apply(c); got != want {
						t.Fatalf("step %d replica %d: %+v = %v, replica 0 %v", step, i, c, got, want)
					}
				}
				counts[want.Kind]++
				a.check(t, step, replicas[0], c, want)
				for i := 1; i < len(replicas); i++ {
					if replicas[i].Digest() != replicas[0].Digest() {
						t.Fatalf("step %d: replica %d diverged", step, i)
					}
				}
				if step%61 == 60 {
					snap := replicas[0].Snapshot()
					for i := 1; i < len(replicas); i++ {
						if !bytes.Equal(replicas[i].Snapshot(), snap) {
							t.Fatalf("step %d: replica %d's snapshot differs with an equal digest", step, i)
						}
					}
					x := core.NewMachine()
					if err := x.Restore(snap); err != nil {
						t.Fatalf("step %d: Restore: %v", step, err)
					}
					replicas[1] = limit(x)
					replicas[2] = limit(rebuildFromRecords(t, r, replicas[0]))
				}
			}
		})
	}
	for _, k := range []core.ResultKind{core.ResultGranted, core.ResultGrantRepeated, core.ResultGrantEnded, core.ResultRequestMismatch,
		core.ResultHoldersExhausted, core.ResultSessionLocksExhausted, core.ResultDelaysExhausted, core.ResultLimitMismatch,
		core.ResultDelayed, core.ResultDelayCleared, core.ResultSessionExpired, core.ResultGrantRejected} {
		if counts[k] < 5 {
			t.Fatalf("%d %s in the runs: the test did not test (%v)", counts[k], k, counts)
		}
	}
}

// kindsAttack is what TestKindsAttackProperty remembers between steps.
type kindsAttack struct {
	maxEver  map[string]uint64 // highest token ever granted per key
	first    map[string]uint64 // identity/request id -> the token of its first grant
	firstKey map[string]string // and its key
	sessions []uint64          // ids opened (some closed since)
	seqs     []uint64          // delay sequence numbers seen (some cleared since)
}

var attackKeys = []string{"a", "b", "c"}

// The bounds TestKindsAttackProperty sets, small enough to reach.
const attackMaxDelays, attackMaxLocksPerSession, attackMaxHolders, attackMaxRequests = 3, 2, 4, 12

// next makes a random command, biased to the bounds and to retries.
func (a *kindsAttack) next(r *rand.Rand, m *core.Machine, clock uint64) core.Command {
	key := attackKeys[r.IntN(len(attackKeys))]
	holders := m.Holders(key)
	token := func() uint64 {
		if len(holders) == 0 || r.IntN(5) == 0 {
			return 1 + r.Uint64N(m.LastToken()+1)
		}
		return holders[r.IntN(len(holders))].Token
	}
	switch p := r.IntN(100); {
	case p < 50:
		c := core.Grant(key, "o", lease, clock)
		switch r.IntN(4) {
		case 0:
			c = c.WithKind(0, core.ModeShared)
		case 1:
			c = c.WithKind(uint32(2+r.IntN(3)), core.ModeExclusive)
		case 2:
			c = c.WithKind(3, core.ModeExclusive)
		}
		if len(a.sessions) > 0 && r.IntN(3) == 0 {
			id := a.sessions[len(a.sessions)-1] // the newest, most often open
			if r.IntN(4) == 0 {
				id = a.sessions[r.IntN(len(a.sessions))]
			}
			c = c.InSession(id)
		} else if r.IntN(2) == 0 {
			c = c.WithLockDelay(delay)
		}
		if r.IntN(2) == 0 {
			c = c.WithRequest([]string{"alice", "bob"}[r.IntN(2)], fmt.Sprintf("rid-%d", r.IntN(8)))
		}
		return c
	case p < 62:
		return core.Release(key, token())
	case p < 74:
		return core.Expire(key, token())
	case p < 78:
		return core.Renew(key, token(), 2*lease)
	case p < 83:
		var seqs []uint64
		for _, d := range m.Delays(key) {
			seqs = append(seqs, d.Seq)
		}
		if len(seqs) == 0 || r.IntN(6) == 0 {
			return core.ClearDelay(key, 1+r.Uint64N(m.LastDelaySeq()+1))
		}
		return core.ClearDelay(key, seqs[r.IntN(len(seqs))])
	case p < 86:
		return core.OpenSession("", ttl, uint64(r.IntN(2))*delay)
	case p < 90 && len(a.sessions) > 0:
		return core.RefreshSession(a.sessions[r.IntN(len(a.sessions))])
	case len(a.sessions) > 0:
		id := a.sessions[r.IntN(len(a.sessions))]
		if r.IntN(2) == 0 {
			return core.CloseSession(id, "")
		}
		epoch := uint64(1)
		if x, ok := m.Session(id); ok {
			epoch = x.Epoch
		}
		return core.ExpireSession(id, epoch)
	}
	return core.OpenSession("", ttl, delay)
}

// check checks m after c applied with result res.
func (a *kindsAttack) check(t *testing.T, step int, m *core.Machine, c core.Command, res core.Result) {
	t.Helper()
	fail := func(format string, args ...any) {
		t.Helper()
		t.Fatalf("step %d, %+v = %v: %s", step, c, res, fmt.Sprintf(format, args...))
	}
	if res.Kind == core.ResultSessionOpened {
		a.sessions = append(a.sessions, res.Session)
	}
	rid := c.Identity + "/" + c.RequestID
	if c.Kind == core.KindGrant {
		switch res.Kind {
		case core.ResultGranted:
			if res.Token <= a.maxEver[c.Key] {
				fail("token not above %d, the key's highest", a.maxEver[c.Key])
			}
			a.maxEver[c.Key] = res.Token
			if c.RequestID != "" {
				if _, seen := a.first[rid]; seen && c.Key == a.firstKey[rid] {
					// Granted again: allowed only once the first grant's
					// record is forgotten (the data clock moved on).
					if rec := m.LookupRequest(c.Identity, c.RequestID); rec.Token != res.Token {
						fail("request record names token %d", rec.Token)
					}
				}
				a.first[rid], a.firstKey[rid] = res.Token, c.Key
			}
		case core.ResultGrantRepeated, core.ResultGrantEnded:
			if tok, ok := a.first[rid]; !ok || tok != res.Token || a.firstKey[rid] != c.Key {
				fail("the request's grant was token %d on %q", tok, a.firstKey[rid])
			}
			if res.Kind == core.ResultGrantRepeated {
				if _, ok := m.Holder(c.Key, res.Token); !ok {
					fail("a repeated grant names token %d, which does not hold %q", res.Token, c.Key)
				}
			}
		}
	}
	total := 0
	for _, key := range attackKeys {
		holders := m.Holders(key)
		total += len(holders)
		_, plain := m.Get(key)
		_, keyDelayed := m.Delay(key)
		kh, multi := m.KeyHolders(key)
		switch {
		case plain && (multi || keyDelayed), multi && keyDelayed:
			fail("%q: held plainly %t, multi-holder %t, delayed as a key %t", key, plain, multi, keyDelayed)
		case plain && len(holders) != 1:
			fail("%q: a plain lock and %d holders", key, len(holders))
		}
		if multi {
			n := len(kh.Holders) + len(kh.Delays)
			if kh.Limit > 1 && n > int(kh.Limit) || kh.Limit == 0 && (kh.Mode != core.ModeShared || n > attackMaxHolders) {
				fail("%q: limit %d mode %s, %d holders and %d slots", key, kh.Limit, kh.Mode, len(kh.Holders), len(kh.Delays))
			}
			for _, l := range kh.Holders {
				if l.Limit != kh.Limit || l.Mode != kh.Mode || l.Key != key {
					fail("%q: holder %+v of another kind", key, l)
				}
			}
		}
		for i, l := range holders {
			if i > 0 && l.Token <= holders[i-1].Token || l.Token > a.maxEver[key] {
				fail("%q: holders %+v out of order or above the highest token", key, holders)
			}
			if got, ok := m.Holder(key, l.Token); !ok || got != l {
				fail("Holder(%q, %d) = %+v, %t", key, l.Token, got, ok)
			}
		}
		// The fence lookup accepts exactly the current holders' tokens.
		for tok := uint64(1); tok <= m.LastToken(); tok++ {
			_, ok := m.Holder(key, tok)
			if ok != slices.ContainsFunc(holders, func(l core.Lock) bool { return l.Token == tok }) {
				fail("Holder(%q, %d) = %t, holders %+v", key, tok, ok, holders)
			}
		}
	}
	if m.Len() != total {
		fail("Len %d, %d holders", m.Len(), total)
	}
	if n := m.DelayCount() + m.SlotDelayCount(); n > attackMaxDelays {
		fail("%d delays, the bound is %d", n, attackMaxDelays)
	}
	for _, id := range a.sessions {
		if n := m.SessionLockCount(id); n > attackMaxLocksPerSession {
			fail("session %d holds %d locks, the bound is %d", id, n, attackMaxLocksPerSession)
		}
		if locks := m.SessionLocks(id); len(locks) != m.SessionLockCount(id) {
			fail("session %d: SessionLocks %d, SessionLockCount %d", id, len(locks), m.SessionLockCount(id))
		}
	}
	if rs := m.RequestState(); len(rs.Ended) > attackMaxRequests {
		fail("%d ended request records, the bound is %d", len(rs.Ended), attackMaxRequests)
	}
	// Holders and KeyHolders are copies: changing one changes nothing.
	if kh, ok := m.KeyHolders("a"); ok && len(kh.Holders) > 0 {
		before := m.Digest()
		kh.Holders[0].Token = 0
		if m.Digest() != before || !reflect.DeepEqual(m.Holders("a")[0].Token != 0, true) {
			fail("KeyHolders shares memory with the machine")
		}
	}
}
