package core_test

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"reflect"
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
// plain as possible: key -> token, and a counter; and the request records
// (core/requests.go) as a plain FIFO scanned from the end.
type model struct {
	held   map[string]uint64
	leases map[string]uint64 // key -> lease_ms, which renewals only lengthen
	last   uint64
	ctl    *ctlModel // for the cluster version

	rids  map[string]reqID // key -> request of the lock held on it, if any
	byReq map[reqID]string // request -> key of the lock holding it
	ended []endedModel     // oldest first
	clock uint64
	limit int // the request records' limit

	s sessModel // sessions and lock-delays (property_sessions_test.go)
}

type reqID struct{ identity, rid string }

type endedModel struct {
	req       reqID
	key       string
	token, at uint64
}

func (m *model) end(key string) {
	if id, ok := m.rids[key]; ok {
		m.ended = append(m.ended, endedModel{id, key, m.held[key], m.clock})
		delete(m.rids, key)
		delete(m.byReq, id)
	}
	delete(m.held, key)
	delete(m.leases, key)
	delete(m.s.lockSess, key)
	delete(m.s.lockDelay, key)
}

// prune forgets up to n ended records older than the retention.
func (m *model) prune(n int) {
	for i := 0; i < n && len(m.ended) > 0 && m.clock-m.ended[0].at > core.RequestRetentionMS; i++ {
		m.ended = m.ended[1:]
	}
}

// lookup is the record of a request: held, or its newest ended one if
// not older than the retention.
func (m *model) lookup(id reqID) core.RequestRecord {
	if key, ok := m.byReq[id]; ok {
		return core.RequestRecord{Status: core.RequestHeld, Key: key, KeyHash: core.RequestKeyHash(key), Token: m.held[key]}
	}
	for i := len(m.ended) - 1; i >= 0; i-- {
		if e := m.ended[i]; e.req == id {
			if m.clock-e.at > core.RequestRetentionMS {
				break
			}
			return core.RequestRecord{Status: core.RequestEnded, KeyHash: core.RequestKeyHash(e.key), Token: e.token}
		}
	}
	return core.RequestRecord{}
}

func (m *model) apply(c core.Command, valid bool) core.Result {
	if !valid {
		return noop
	}
	if c.Kind == core.KindControl {
		panic("model: control command")
	}
	// Version 2, 3 and 4 commands change nothing before the cluster
	// agreed on their version.
	session := c.Kind >= core.KindOpenSession && c.Kind <= core.KindClearDelay
	switch {
	case c.Kind == core.KindSettle && m.ctl.version < 6,
		(session || c.SessionID != 0 || c.LockDelayMS != 0) && m.ctl.version < 4,
		c.RequestID != "" && m.ctl.version < 3,
		(c.Kind == core.KindRenew || c.Identity != "") && m.ctl.version < 2:
		return noop
	}
	if m.ctl.version >= 3 {
		if c.Kind == core.KindGrant || c.Kind == core.KindSettle {
			m.clock = max(m.clock, c.GrantedAtMS)
		}
		m.prune(core.RequestPruneBudget)
	}
	if session {
		return m.applySession(c)
	}
	tok, ok := m.held[c.Key]
	switch c.Kind {
	case core.KindGrant:
		id := reqID{c.Identity, c.RequestID}
		if c.RequestID != "" {
			switch rec := m.lookup(id); {
			case rec.Status == core.RequestHeld && rec.Key == c.Key:
				return core.Result{Kind: core.ResultGrantRepeated, Token: rec.Token}
			case rec.Status == core.RequestEnded && rec.KeyHash == core.RequestKeyHash(c.Key):
				return core.Result{Kind: core.ResultGrantEnded, Token: rec.Token}
			case rec.Status != core.RequestUnknown:
				return core.Result{Kind: core.ResultRequestMismatch, Token: rec.Token}
			}
		}
		if ok {
			return grantRejected(tok)
		}
		if r, refused := m.s.grantRefused(c); refused {
			return r
		}
		if m.last == math.MaxUint64 {
			return noop
		}
		if c.RequestID != "" && len(m.byReq)+len(m.ended) >= m.limit {
			if len(m.ended) == 0 || m.clock-m.ended[0].at < core.MinRequestRetentionMS {
				return core.Result{Kind: core.ResultRequestsExhausted}
			}
			m.ended = m.ended[1:]
		}
		m.last++
		m.held[c.Key] = m.last
		m.leases[c.Key] = c.LeaseMS
		if c.SessionID != 0 {
			m.s.lockSess[c.Key] = c.SessionID
		}
		if c.LockDelayMS != 0 {
			m.s.lockDelay[c.Key] = c.LockDelayMS
		}
		if c.RequestID != "" {
			m.rids[c.Key] = id
			m.byReq[id] = c.Key
		}
		return granted(m.last)
	case core.KindSettle:
		id := reqID{c.Identity, c.RequestID}
		switch rec := m.lookup(id); {
		case rec.Status == core.RequestHeld && rec.Key == c.Key:
			m.end(c.Key)
			return core.Result{Kind: core.ResultReleased, Token: rec.Token}
		case rec.Status == core.RequestEnded && rec.KeyHash == core.RequestKeyHash(c.Key):
			return core.Result{Kind: core.ResultGrantEnded, Token: rec.Token}
		case rec.Status != core.RequestUnknown:
			return core.Result{Kind: core.ResultRequestMismatch, Token: rec.Token}
		}
		if len(m.byReq)+len(m.ended) >= m.limit {
			if len(m.ended) == 0 || m.clock-m.ended[0].at < core.MinRequestRetentionMS {
				return core.Result{Kind: core.ResultRequestsExhausted}
			}
			m.ended = m.ended[1:]
		}
		m.ended = append(m.ended, endedModel{id, c.Key, 0, m.clock})
		return core.Result{Kind: core.ResultSettled}
	case core.KindRenew:
		if ok && tok == c.Token && m.s.lockSess[c.Key] != 0 {
			return noop
		}
		if ok && tok == c.Token {
			m.leases[c.Key] = max(m.leases[c.Key], c.LeaseMS)
			return core.Result{Kind: core.ResultRenewed, Token: tok}
		}
		return notFound
	case core.KindRelease:
		if ok && tok == c.Token {
			m.end(c.Key)
			return released
		}
		return notFound
	case core.KindExpire:
		if !ok || tok != c.Token || m.s.lockSess[c.Key] != 0 {
			return expiredFalse
		}
		d := m.s.lockDelay[c.Key]
		if d > 0 && len(m.s.delays) >= m.s.limit(2, core.MaxDelayedKeys) {
			return core.Result{Kind: core.ResultDelaysExhausted}
		}
		m.end(c.Key)
		if d > 0 {
			m.s.delay(c.Key, d)
		}
		return expiredTrue
	}
	panic("model: unexpected kind " + c.Kind.String())
}

// ctlModel is an independent reference implementation of the control
// transitions (SPEC §2 Control), kept as plain as possible.
type ctlModel struct {
	bootstrapped bool
	boot         [32]byte
	lastID       uint64
	lastInc      uint64
	members      map[uint64]core.Member
	retired      map[uint64]uint64
	creds        map[[32]byte]bool // minted hashes; true once consumed
	pending      *core.Replacement
	version      uint64 // 0 until SetClusterVersion
	fence        []core.FenceSeed
}

func newCtlModel() *ctlModel {
	return &ctlModel{members: map[uint64]core.Member{}, retired: map[uint64]uint64{}, creds: map[[32]byte]bool{}}
}

func (m *ctlModel) reject(r core.ControlReason) core.Result {
	return core.Result{Kind: core.ResultControlRejected, Reason: r}
}

// lookup is the shared "which member" rule: current with that incarnation,
// or why not.
func (m *ctlModel) lookup(id, inc uint64, anyInc bool) (core.Member, core.ControlReason) {
	if mem, ok := m.members[id]; ok {
		if anyInc || mem.Incarnation == inc {
			return mem, ""
		}
		return core.Member{}, core.ReasonStaleIncarnation
	}
	if _, ok := m.retired[id]; ok {
		return core.Member{}, core.ReasonNodeRetired
	}
	return core.Member{}, core.ReasonUnknownNode
}

func (m *ctlModel) addrTaken(a string, except uint64) bool {
	for id, mem := range m.members {
		if mem.Address == a && id != except {
			return true
		}
	}
	return false
}

func (m *ctlModel) busy(id uint64) bool {
	return m.pending != nil && (m.pending.Old == id || m.pending.New == id)
}

func (m *ctlModel) add(a string, role core.Role) core.Member {
	m.lastID++
	m.lastInc++
	mem := core.Member{NodeID: m.lastID, Incarnation: m.lastInc, Address: a, Role: role}
	m.members[mem.NodeID] = mem
	return mem
}

func (m *ctlModel) remove(id uint64) {
	m.retired[id] = m.members[id].Incarnation
	delete(m.members, id)
}

func (m *ctlModel) apply(r core.ControlRequest) core.Result {
	ok := func(k core.ResultKind, mem core.Member) core.Result {
		return core.Result{Kind: k, NodeID: mem.NodeID, Incarnation: mem.Incarnation}
	}
	switch r.Op {
	case core.ControlSetClusterVersion:
		if r.Version <= max(1, m.version) {
			return m.reject(core.ReasonVersionNotNewer)
		}
		m.version = r.Version
		return core.Result{Kind: core.ResultControlApplied}
	case core.ControlSetFenceKey:
		switch {
		case m.version < 3:
			return noop
		case slices.Contains(m.fence, r.FenceSeed):
			return m.reject(core.ReasonFenceKeyExists)
		}
		m.fence = append(m.fence, r.FenceSeed)
		if len(m.fence) > core.MaxFenceKeys {
			m.fence = m.fence[1:]
		}
		return core.Result{Kind: core.ResultControlApplied}
	case core.ControlBootstrap:
		if m.bootstrapped {
			return m.reject(core.ReasonAlreadyBootstrapped)
		}
		m.bootstrapped, m.boot = true, r.CredentialHash
		return ok(core.ResultBootstrapRecorded, m.add(r.Address, core.RoleVoter))
	case core.ControlMintJoin:
		_, known := m.creds[r.CredentialHash]
		switch {
		case !m.bootstrapped:
			return m.reject(core.ReasonNotBootstrapped)
		case known || r.CredentialHash == m.boot:
			return m.reject(core.ReasonCredentialReused)
		}
		m.creds[r.CredentialHash] = false
		return core.Result{Kind: core.ResultControlApplied}
	case core.ControlAdmit:
		consumed, known := m.creds[r.CredentialHash]
		switch {
		case m.bootstrapped && r.CredentialHash == m.boot, consumed:
			return m.reject(core.ReasonCredentialReused)
		case !known:
			return m.reject(core.ReasonCredentialUnknown)
		case m.addrTaken(r.Address, 0):
			return m.reject(core.ReasonAddressInUse)
		}
		m.creds[r.CredentialHash] = true
		return ok(core.ResultAdmissionAccepted, m.add(r.Address, core.RoleLearner))
	case core.ControlPromote:
		mem, why := m.lookup(r.NodeID, r.Incarnation, false)
		switch {
		case why != "":
			return m.reject(why)
		case mem.Role == core.RoleVoter:
			return m.reject(core.ReasonNotALearner)
		case m.busy(mem.NodeID):
			return m.reject(core.ReasonInReplacement)
		}
		mem.Role = core.RoleVoter
		m.members[mem.NodeID] = mem
		return ok(core.ResultControlApplied, mem)
	case core.ControlPrepareReplacement:
		if p := m.pending; p != nil {
			if p.Old == r.OldNodeID && p.Address == r.Address {
				return core.Result{Kind: core.ResultReplacementPrepared, NodeID: p.New, Incarnation: p.NewIncarnation}
			}
			return m.reject(core.ReasonReplacementPending)
		}
		old, why := m.lookup(r.OldNodeID, 0, true)
		switch {
		case why != "":
			return m.reject(why)
		case old.Role != core.RoleVoter:
			return m.reject(core.ReasonNotAVoter)
		case m.addrTaken(r.Address, old.NodeID):
			return m.reject(core.ReasonAddressInUse)
		}
		nw := m.add(r.Address, core.RoleLearner)
		m.pending = &core.Replacement{Old: old.NodeID, New: nw.NodeID, NewIncarnation: nw.Incarnation, Address: r.Address}
		return ok(core.ResultReplacementPrepared, nw)
	case core.ControlCompleteReplacement, core.ControlAbortReplacement:
		p := m.pending
		if p == nil {
			return m.reject(core.ReasonNoReplacement)
		}
		if *p != (core.Replacement{Old: r.OldNodeID, New: r.NewNodeID, NewIncarnation: r.NewIncarnation, Address: p.Address}) {
			return m.reject(core.ReasonReplacementMismatch)
		}
		m.pending = nil
		nw := m.members[p.New]
		if r.Op == core.ControlAbortReplacement {
			m.remove(p.New)
		} else {
			nw.Role = core.RoleVoter
			m.members[p.New] = nw
			m.remove(p.Old)
		}
		return ok(core.ResultControlApplied, nw)
	case core.ControlRetire:
		mem, why := m.lookup(r.NodeID, r.Incarnation, false)
		if why != "" {
			return m.reject(why)
		}
		if m.busy(mem.NodeID) {
			return m.reject(core.ReasonInReplacement)
		}
		voters := 0
		for _, x := range m.members {
			if x.Role == core.RoleVoter {
				voters++
			}
		}
		if mem.Role == core.RoleVoter && voters < 2 {
			return m.reject(core.ReasonLastVoter)
		}
		m.remove(mem.NodeID)
		return ok(core.ResultControlApplied, mem)
	}
	panic("ctlModel: unexpected op " + r.Op.String())
}

// check compares a machine's control state with the model.
func (m *ctlModel) check(t *testing.T, mach *core.Machine) {
	t.Helper()
	cs := mach.ControlState()
	if cs.Bootstrapped != m.bootstrapped || cs.BootstrapHash != m.boot || cs.LastNodeID != m.lastID || cs.LastIncarnation != m.lastInc {
		t.Fatalf("control header %+v, model bootstrapped=%t last=%d/%d", cs, m.bootstrapped, m.lastID, m.lastInc)
	}
	if cs.ClusterVersion != m.version || mach.ClusterVersion() != max(1, m.version) {
		t.Fatalf("cluster version %d (effective %d), model %d", cs.ClusterVersion, mach.ClusterVersion(), m.version)
	}
	if !slices.Equal(cs.FenceKeys, m.fence) {
		t.Fatalf("%d fence keys, model %d", len(cs.FenceKeys), len(m.fence))
	}
	if len(cs.Members) != len(m.members) || len(cs.Retired) != len(m.retired) || len(cs.JoinCredentials) != len(m.creds) {
		t.Fatalf("control sizes: %d members, %d retired, %d credentials; model %d, %d, %d",
			len(cs.Members), len(cs.Retired), len(cs.JoinCredentials), len(m.members), len(m.retired), len(m.creds))
	}
	for _, mem := range cs.Members {
		if m.members[mem.NodeID] != mem {
			t.Fatalf("member %+v, model %+v", mem, m.members[mem.NodeID])
		}
	}
	for _, x := range cs.Retired {
		if inc, ok := m.retired[x.NodeID]; !ok || inc != x.Incarnation {
			t.Fatalf("retired %+v, model %d %t", x, inc, ok)
		}
		if err := mach.CheckIdentity(x.NodeID, x.Incarnation); !errors.Is(err, core.ErrNodeRetired) {
			t.Fatalf("CheckIdentity(retired %+v) = %v", x, err)
		}
	}
	for _, jc := range cs.JoinCredentials {
		if consumed, ok := m.creds[jc.Hash]; !ok || consumed != (jc.State == core.CredentialConsumed) {
			t.Fatalf("credential %x is %v, model %t %t", jc.Hash[:4], jc.State, ok, consumed)
		}
	}
	if (cs.Pending == nil) != (m.pending == nil) || (cs.Pending != nil && *cs.Pending != *m.pending) {
		t.Fatalf("pending %+v, model %+v", cs.Pending, m.pending)
	}
}

// cmdGen produces random commands over a small key space so that grants
// collide, and picks tokens that are current, stale, random or absurd.
// Control commands come from small pools of credentials and addresses so
// that reuse and address collisions happen, and name current, retired and
// unknown nodes with right and wrong incarnations.
type cmdGen struct {
	r      *rand.Rand
	keys   []string
	issued []uint64            // every token issued so far
	byKey  map[string][]uint64 // tokens issued per key, including stale ones
	nodes  []uint64            // every NodeID issued so far, in order
	now    uint64              // the leaders' wall clock, as Grants carry it
	// sessionShare is the percentage of lock commands that are session
	// and lock-delay commands.
	sessionShare int
}

// Request ids and identities come from small pools, so that repeats,
// mismatches and the same id under two identities happen.
var (
	propertyIdentities = []string{"", "account-0", "account-1", "account-2"}
	propertyRequestIDs = []string{"req-0", "req-1", "req-2", "req-3"}
)

// grantTime is the time a Grant carries: mostly a little after the last,
// sometimes a jump past the retention, sometimes an older leader's time,
// rarely anything at all (which stops the clock for the rest).
func (g *cmdGen) grantTime() uint64 {
	switch p := g.r.IntN(100); {
	case p < 70:
		g.now += g.r.Uint64N(core.MinRequestRetentionMS)
	case p < 85:
		g.now += core.RequestRetentionMS/2 + g.r.Uint64N(2*core.RequestRetentionMS)
	case p < 99:
		return g.now - min(g.now, g.r.Uint64N(core.RequestRetentionMS))
	default:
		return g.r.Uint64()
	}
	return g.now
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

// node picks a NodeID: mostly one issued so far, sometimes 0 or just
// beyond the last.
func (g *cmdGen) node(ctl *ctlModel) uint64 {
	if len(g.nodes) > 0 && g.r.IntN(10) < 8 {
		return g.nodes[g.r.IntN(len(g.nodes))]
	}
	return g.r.Uint64N(ctl.lastID + 3)
}

// incarnation picks the right incarnation for id most of the time.
func (g *cmdGen) incarnation(ctl *ctlModel, id uint64) uint64 {
	if mem, ok := ctl.members[id]; ok && g.r.IntN(10) < 8 {
		return mem.Incarnation
	}
	if inc, ok := ctl.retired[id]; ok && g.r.IntN(2) == 0 {
		return inc
	}
	return 1 + g.r.Uint64N(ctl.lastInc+2)
}

// credPool is the number of distinct credentials the generator uses.
const credPool = 6

// control returns a control command and whether it is valid.
func (g *cmdGen) control(ctl *ctlModel) (core.Command, bool) {
	r := g.r
	h := cred(r.IntN(credPool))
	a := addr(1 + r.IntN(5))
	if r.IntN(100) < 6 {
		invalid := []core.Command{
			core.Bootstrap([32]byte{}, a),
			core.Admit(h, "no-port"),
			core.Admit(h, ""),
			core.Promote(0, 1),
			core.Retire(1, 0),
			core.CompleteReplacement(2, 2, 2),
			core.PrepareReplacement(1, strings.Repeat("h", core.MaxAddressLen)+":1"),
			{Kind: core.KindControl, Key: "a", Control: core.MintJoin(h).Control},
			{Kind: core.KindControl, Control: core.ControlRequest{Op: core.ControlOp(11 + r.IntN(245))}},
			core.SetClusterVersion(core.MaxClusterVersion + 1),
			core.SetFenceKey(core.FenceSeed{}),
			{Kind: core.KindControl, Control: core.ControlRequest{Op: core.ControlSetFenceKey, FenceSeed: seed(1), Version: 3}},
			core.SetClusterVersion(1),
			{Kind: core.KindControl, Control: core.ControlRequest{Op: core.ControlPromote, NodeID: 1, Incarnation: 1, Address: a}},
		}
		return invalid[r.IntN(len(invalid))], false
	}
	if r.IntN(12) == 0 {
		// Up to 6 (Settle); version 5 changes nothing this model generates.
		return core.SetClusterVersion(uint64(2 + r.IntN(5))), true
	}
	// Rarer than the rest: every restore derives each kept key again, and
	// Ed25519 under the race detector is slow.
	if r.IntN(40) == 0 {
		return core.SetFenceKey(seed(1 + r.IntN(6))), true
	}
	op := r.IntN(8)
	if op == 0 && ctl.bootstrapped && r.IntN(3) > 0 {
		op = 1 + r.IntN(2) // a repeated bootstrap is rarely worth a step
	}
	switch op {
	case 0:
		return core.Bootstrap(h, a), true
	case 1:
		return core.MintJoin(h), true
	case 2:
		// Mostly a credential that is minted and not yet consumed.
		// (Walk the pool, not the map, so that the sequence depends on
		// the seed alone.)
		var fresh [][32]byte
		for i := range credPool {
			if consumed, ok := ctl.creds[cred(i)]; ok && !consumed {
				fresh = append(fresh, cred(i))
			}
		}
		if len(fresh) > 0 && r.IntN(3) > 0 {
			h = fresh[r.IntN(len(fresh))]
		}
		return core.Admit(h, a), true
	case 3:
		id := g.node(ctl)
		if id == 0 {
			id = 1
		}
		return core.Promote(id, g.incarnation(ctl, id)), true
	case 4:
		id := g.node(ctl)
		if id == 0 {
			id = 1
		}
		return core.PrepareReplacement(id, a), true
	case 5, 6:
		build := core.CompleteReplacement
		if r.IntN(2) == 0 {
			build = core.AbortReplacement
		}
		if p := ctl.pending; p != nil && r.IntN(10) < 7 {
			return build(p.Old, p.New, p.NewIncarnation), true
		}
		old := 1 + g.node(ctl)
		nw := old + 1 + r.Uint64N(3)
		return build(old, nw, g.incarnation(ctl, nw)), true
	}
	id := g.node(ctl)
	if id == 0 {
		id = 1
	}
	return core.Retire(id, g.incarnation(ctl, id)), true
}

// command returns the next command and whether it is valid.
func (g *cmdGen) command(mod *model, ctl *ctlModel) (core.Command, bool) {
	r := g.r
	if r.IntN(100) < 20 {
		return g.control(ctl)
	}
	if r.IntN(100) < g.sessionShare {
		return g.sessionCommand(mod)
	}
	switch p := r.IntN(100); {
	case p < 45:
		owner := ""
		if r.IntN(2) == 0 {
			owner = "owner-" + strconv.Itoa(r.IntN(5))
		}
		leaseMS := core.MinLeaseMS + r.Uint64N(core.MaxLeaseMS-core.MinLeaseMS+1)
		c := core.Grant(g.key(), owner, leaseMS, g.grantTime())
		if r.IntN(3) == 0 {
			c.Identity = "account-" + strconv.Itoa(r.IntN(3))
		}
		if r.IntN(5) < 2 {
			c = c.WithRequest(propertyIdentities[r.IntN(len(propertyIdentities))], propertyRequestIDs[r.IntN(len(propertyRequestIDs))])
		}
		return c, true
	case p < 52:
		k := g.key()
		var leaseMS uint64
		if r.IntN(3) > 0 {
			leaseMS = core.MinLeaseMS + r.Uint64N(core.MaxLeaseMS-core.MinLeaseMS+1)
		}
		return core.Renew(k, g.token(k, mod), leaseMS), true
	case p < 66:
		k := g.key()
		return core.Release(k, g.token(k, mod)), true
	case p < 70:
		return core.Settle(g.key(), propertyIdentities[r.IntN(len(propertyIdentities))], propertyRequestIDs[r.IntN(len(propertyRequestIDs))], g.grantTime()), true
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
		core.Renew(g.key(), 0, lease),
		core.Renew(g.key(), 1, core.MaxLeaseMS+1),
		{Kind: core.KindRenew, Key: g.key(), Token: 1, Owner: "o"},
		{Kind: core.KindGrant, Key: g.key(), LeaseMS: lease, Identity: strings.Repeat("i", core.MaxIdentityLen+1)},
		{Kind: core.KindRelease, Key: g.key(), Token: 1, Identity: "a"},
		core.Grant(g.key(), "", lease, 0).WithRequest("a", strings.Repeat("r", core.MaxRequestIDLen+1)),
		core.Grant(g.key(), "", lease, 0).WithRequest("a", "r\x00"),
		core.Grant(g.key(), "", lease, 0).WithRequest("", "\xff"),
		{Kind: core.KindRelease, Key: g.key(), Token: 1, RequestID: "r"},
		{Kind: core.KindRenew, Key: g.key(), Token: 1, RequestID: "r"},
		{Kind: core.KindSettle, Key: g.key(), Identity: "a"},
		{Kind: core.KindSettle, Key: g.key(), Identity: "a", RequestID: "r", Token: 1},
	}
	return invalid[r.IntN(len(invalid))], false
}

// observe records what a result issued. It reports an identity issued
// twice or out of order.
func (g *cmdGen) observe(c core.Command, res core.Result) error {
	switch res.Kind {
	case core.ResultGranted:
		g.issued = append(g.issued, res.Token)
		g.byKey[c.Key] = append(g.byKey[c.Key], res.Token)
	case core.ResultBootstrapRecorded, core.ResultAdmissionAccepted, core.ResultReplacementPrepared:
		if res.Kind == core.ResultReplacementPrepared && slices.Contains(g.nodes, res.NodeID) {
			return nil // a retried prepare tells the pending replacement's identity again (the model checks which)
		}
		if n := len(g.nodes); n > 0 && res.NodeID <= g.nodes[n-1] || res.NodeID == 0 || res.Incarnation == 0 {
			return fmt.Errorf("%v issued after node %v", res, g.nodes)
		}
		g.nodes = append(g.nodes, res.NodeID)
	}
	return nil
}

// replicas are the machines of one sequence, each fed a different way.
type replicas struct {
	direct  *core.Machine // (a) Apply directly
	viaLog  *core.Machine // (b) through EncodeEntry -> DecodeEntry
	viaSnap *core.Machine // (c) replaced by Snapshot -> Restore at random points
	viaRecs *core.Machine // (d) rebuilt from lock records + Load at random points
}

// setLimit gives every replica the request records' and the sessions'
// limits of the sequence.
func (ms replicas) setLimit(n int, s [3]int) {
	for _, m := range []*core.Machine{ms.direct, ms.viaLog, ms.viaSnap, ms.viaRecs} {
		m.SetRequestLimitForTest(n)
		m.SetSessionLimitsForTest(s[0], s[1], s[2])
	}
}

func newReplicas(lastToken uint64) replicas {
	ms := replicas{core.NewMachine(), core.NewMachine(), core.NewMachine(), new(core.Machine)}
	for _, m := range []*core.Machine{ms.direct, ms.viaLog, ms.viaSnap, ms.viaRecs} {
		m.Load(lastToken, nil)
	}
	return ms
}

func TestProperty(t *testing.T) {
	t.Parallel() // the longest test; it shares nothing mutable
	seed := propertySeed(t)
	sequences, maxLen := 2000, 200
	switch {
	case testing.Short():
		sequences = 200
	case raceEnabled:
		sequences = 1000 // the first half of the same sequences
	}
	for seq := range sequences {
		runSequence(t, seed, seq, maxLen)
		if t.Failed() {
			t.Fatalf("sequence %d failed (seed %d)", seq, seed)
		}
	}
}

func runSequence(t *testing.T, seed uint64, seq, maxLen int) {
	runSequenceFrom(t, seed, seq, maxLen, 1)
}

// runSequenceFrom runs one random sequence on replicas that start at
// cluster version startVersion (4: with small session limits and mostly
// session commands).
func runSequenceFrom(t *testing.T, seed uint64, seq, maxLen int, startVersion uint64) {
	r := rand.New(rand.NewPCG(seed, uint64(seq)))
	g := &cmdGen{r: r, keys: propertyKeys[:1+r.IntN(len(propertyKeys))], byKey: map[string][]uint64{}, sessionShare: 15}
	ctl := newCtlModel()
	mod := &model{held: map[string]uint64{}, leases: map[string]uint64{}, ctl: ctl,
		rids: map[string]reqID{}, byReq: map[reqID]string{}, limit: core.MaxRequestRecords, s: newSessModel()}
	// Half the sequences fill a small request table (the same limit on
	// every replica), so that exhaustion and early forgetting happen.
	if r.IntN(2) == 0 {
		mod.limit = 2 + r.IntN(5)
	}
	if startVersion >= 4 {
		g.sessionShare = 60
		mod.s.limits = [3]int{1 + r.IntN(3), 1 + r.IntN(3), 1 + r.IntN(4)}
	}
	// Most sequences start from a fresh counter; some start from a restored
	// high one, and a few right below the end of the token space.
	switch p := r.IntN(100); {
	case p < 10:
		mod.last = r.Uint64N(1 << 40)
	case p < 15:
		mod.last = math.MaxUint64 - r.Uint64N(40)
	}
	ms := newReplicas(mod.last)
	ms.setLimit(mod.limit, mod.s.limits)
	for v := uint64(2); v <= startVersion; v++ {
		c := core.SetClusterVersion(v)
		want := ctl.apply(c.Control)
		for _, m := range []*core.Machine{ms.direct, ms.viaLog, ms.viaSnap, ms.viaRecs} {
			if got := m.Apply(c); got != want {
				t.Fatalf("SetClusterVersion(%d) = %v, model %v", v, got, want)
			}
		}
	}
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
			ms.setLimit(mod.limit, mod.s.limits)
		}
		if r.IntN(16) == 0 {
			ms.viaRecs = rebuildFromRecords(t, r, ms.viaRecs)
			ms.setLimit(mod.limit, mod.s.limits)
		}
		c, valid := g.command(mod, ctl)
		history = append(history, c)
		lastBefore := ms.direct.LastToken()

		var want core.Result
		if valid && c.Kind == core.KindControl {
			want = ctl.apply(c.Control)
		} else {
			want = mod.apply(c, valid)
		}
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
		if err := g.observe(c, ra); err != nil {
			fail("%v", err)
			return
		}

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
		if n := len(mod.byReq) + len(mod.ended); ms.direct.RequestRecords() != n || ms.direct.DataClockMS() != mod.clock {
			fail("%d request records, data clock %d; model %d, %d", ms.direct.RequestRecords(), ms.direct.DataClockMS(), n, mod.clock)
			return
		}
		if ms.direct.SessionCount() != len(mod.s.sessions) || ms.direct.DelayCount() != len(mod.s.delays) {
			fail("%d sessions, %d delays; model %d, %d", ms.direct.SessionCount(), ms.direct.DelayCount(), len(mod.s.sessions), len(mod.s.delays))
			return
		}
	}
	for _, id := range propertyIdentities {
		for _, rid := range propertyRequestIDs {
			if got, want := ms.direct.LookupRequest(id, rid), mod.lookup(reqID{id, rid}); got != want {
				fail("LookupRequest(%q, %q) = %+v, model %+v", id, rid, got, want)
			}
		}
	}

	checkTable(t, ms.direct, mod)
	mod.s.check(t, ms.direct)
	ctl.check(t, ms.direct)
	checkControlInvariants(t, ms.direct)
	want := ms.direct.Snapshot()
	for name, m := range map[string]*core.Machine{"via log": ms.viaLog, "via snapshot": ms.viaSnap, "via records": ms.viaRecs} {
		if m.Digest() != ms.direct.Digest() || !bytes.Equal(m.Snapshot(), want) || !bytes.Equal(m.ControlSnapshot(), ms.direct.ControlSnapshot()) {
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

// rebuildFromRecords mimics a restart from storage rows: every lock is
// written as a record, read back in storage order (any order), and loaded
// with the persisted counter; the control state comes back from its own
// record through LoadControl, the request records from theirs through
// LoadRequests, the sessions and delayed keys from theirs through
// LoadSessions. A nil r keeps key order.
func rebuildFromRecords(t testing.TB, r *rand.Rand, m *core.Machine) *core.Machine {
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
	if err := fresh.LoadControl(m.ControlSnapshot()); err != nil {
		t.Fatalf("LoadControl(own control record): %v", err)
	}
	// The request records come back from their own rows, one per record.
	rs := m.RequestState()
	for i, e := range rs.Ended {
		got, err := core.DecodeEndedRequest(core.EncodeEndedRequest(e))
		if err != nil || got != e {
			t.Fatalf("ended request record round trip of %+v: %+v, %v", e, got, err)
		}
		rs.Ended[i] = got
	}
	if err := fresh.LoadRequests(rs); err != nil {
		t.Fatalf("LoadRequests(own request state): %v", err)
	}
	// So do the sessions and the delayed keys, one row each.
	ss := m.SessionState()
	for i, x := range ss.Sessions {
		got, err := core.DecodeSessionRecord(core.EncodeSessionRecord(x))
		if err != nil || got != x {
			t.Fatalf("session record round trip of %+v: %+v, %v", x, got, err)
		}
		ss.Sessions[i] = got
	}
	for i, d := range ss.Delays {
		got, err := core.DecodeDelayRecord(core.EncodeDelayRecord(d))
		if err != nil || got != d {
			t.Fatalf("delay record round trip of %+v: %+v, %v", d, got, err)
		}
		ss.Delays[i] = got
	}
	if err := fresh.LoadSessions(ss); err != nil {
		t.Fatalf("LoadSessions(own session state): %v", err)
	}
	// And the multi-holder keys, one holder record per key, in any order.
	var ks []core.KeyHolders
	for _, kh := range m.MultiKeys() {
		got, err := core.DecodeHolderRecord(core.EncodeHolderRecord(kh))
		if err != nil || !reflect.DeepEqual(got, kh) {
			t.Fatalf("holder record round trip of %+v: %+v, %v", kh, got, err)
		}
		ks = append(ks, got)
	}
	if r != nil {
		r.Shuffle(len(ks), func(i, j int) { ks[i], ks[j] = ks[j], ks[i] })
	}
	if err := fresh.LoadHolders(slices.Clone(ks)); err != nil {
		t.Fatalf("LoadHolders(own holder records): %v", err)
	}
	// The same rows through the Loader (raftstore's restart) give the same
	// state; that machine is the one the caller goes on with.
	ld := core.NewLoader(m.LastToken(), len(locks)/2)
	for _, l := range locks {
		if err := ld.AddRecord([]byte(l.Key), core.EncodeLockRecord(l)); err != nil {
			t.Fatalf("Loader.AddRecord(%+v): %v", l, err)
		}
	}
	loaded, err := ld.Machine()
	if err != nil {
		t.Fatalf("Loader.Machine: %v", err)
	}
	if err := loaded.LoadControl(m.ControlSnapshot()); err != nil {
		t.Fatalf("LoadControl(own control record): %v", err)
	}
	if err := loaded.LoadRequests(rs); err != nil {
		t.Fatalf("LoadRequests after the Loader: %v", err)
	}
	if err := loaded.LoadSessions(ss); err != nil {
		t.Fatalf("LoadSessions after the Loader: %v", err)
	}
	if err := loaded.LoadHolders(ks); err != nil {
		t.Fatalf("LoadHolders after the Loader: %v", err)
	}
	if loaded.Digest() != fresh.Digest() || loaded.Digest() != m.Digest() || !slices.Equal(loaded.Locks(), m.Locks()) ||
		!reflect.DeepEqual(loaded.MultiKeys(), m.MultiKeys()) {
		t.Fatal("the Loader's machine differs from Load's")
	}
	return loaded
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
		if mod.held[l.Key] != l.Token || mod.leases[l.Key] != l.LeaseMS {
			t.Fatalf("lock %+v, model has token %d lease %dms", l, mod.held[l.Key], mod.leases[l.Key])
		}
		if id := mod.rids[l.Key]; l.RequestID != id.rid || l.RequestID != "" && l.Identity != id.identity {
			t.Fatalf("lock %+v, model has request %+v", l, id)
		}
		if got, ok := m.Get(l.Key); !ok || got != l {
			t.Fatalf("Get(%q) = %+v, %t; Locks has %+v", l.Key, got, ok, l)
		}
	}
	if len(locks) != len(mod.held) || m.Len() != len(locks) || m.LastToken() != mod.last {
		t.Fatalf("table %d locks (Len %d), last %d; model %d locks, last %d", len(locks), m.Len(), m.LastToken(), len(mod.held), mod.last)
	}
}
