package core

import (
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// Lock kinds (cluster version 5): counting semaphores and read/write
// locks, beside the mutex.
//
// A Grant says which kind it asks for with Limit and Mode:
//
//	Limit 0 (or 1, written 0), ModeExclusive   a mutex, or the exclusive side
//	                                           of a read/write lock: the same kind
//	Limit 0, ModeShared                        a shared hold of a read/write lock
//	Limit 2..MaxSemaphoreLimit, ModeExclusive  a slot of a counting semaphore
//
// A semaphore has no shared mode (Validate refuses limit > 1 with
// ModeShared): a shared semaphore slot would mean nothing a plain slot
// does not.
//
// A key has one kind at a time, set by its holders and delayed slots: a
// Grant of a key held (or delayed) as another kind applies as
// ResultLimitMismatch with the key's current limit (1 for a mutex or a
// read/write lock), whatever the waiters want: the leader answers
// invalid_argument naming it. A key with neither holder nor delayed slot
// takes the kind of the next Grant.
//
// Rules, each a Grant that cannot be granted now applying as
// ResultGrantRejected exactly as a held mutex (core has no queue: waiters
// and their FIFO order are the leader's):
//
//   - semaphore of limit N: up to N holders, each with its own token from
//     the global counter; ResultGrantRejected at N holders, ResultDelayed
//     when holders and delayed slots together fill the N;
//   - read/write: shared holders coexist; an exclusive holder excludes
//     everyone (an exclusive Grant meets ResultGrantRejected while any
//     shared holder holds, a shared Grant while the exclusive one does);
//     at most MaxHoldersPerKey shared holders and delayed shared slots
//     (ResultHoldersExhausted beyond: a bound, not a wait).
//
// Because the token counter is global and only rises, an exclusive grant's
// token is above every shared token granted before it, and every holder's
// token is above those of the holders before it: fences stay ordered per
// key whatever the kind.
//
// # Memory
//
// A mutex lock, and the exclusive holder of a read/write lock (which is
// one), stays in the 40-byte record table (table.go), untouched. A
// multi-holder key (a semaphore, or a read/write key with shared holders
// or shared delayed slots) lives here instead, in a map from key to its
// holders in token order and its delayed slots in sequence order: its
// records need the kind, and there are few such keys next to the
// million plain locks the table is built for. Nothing here reaches a
// result, snapshot, digest or list in map order: KeyHolders and Holders
// return token order, MultiKeys and snapshots key order, the digest is a
// sum.
//
// # Per holder
//
// Release, Renew and Expire carry a token and act on that holder only;
// Holder(key, token) is the fence and check path's lookup, which accepts
// any current holder of a multi-holder key. A holder may be in a session
// (a session may hold several slots of one semaphore, and a shared hold
// beside them); CloseSession and ExpireSession end each, in key then
// token order. A held request id names its holder: a retried acquire gets
// ResultGrantRepeated with that holder's token.
//
// # Lock-delay per slot
//
// A holder freed by a failure (an Expire with a LockDelayMS, an
// ExpireSession of a session with one) leaves a delayed slot: {key,
// delay, seq} with the seq from the same counter as every delay,
// cleared by the same ClearDelay(key, seq). The rule:
//
//   - semaphore: the slot counts as occupied until cleared (N minus the
//     delayed slots may be held);
//   - read/write, a failed exclusive holder: the whole key is delayed, as
//     a mutex (it is one: a plain delay, sessions.go);
//   - read/write, a failed shared holder: its slot delays exclusive Grants
//     only. A lock-delay protects what the failed holder may still be
//     doing to the resource; a reader's late reads conflict with a writer,
//     not with other readers, so new shared holders are granted beside it
//     (as they would have been beside the reader alive).
//
// A delayed slot counts towards MaxDelayedKeys like a delayed key.

// Mode is how a read/write lock is held. Values are part of the log
// encoding and must never change.
type Mode uint8

// Modes.
const (
	ModeExclusive Mode = 0
	ModeShared    Mode = 1
)

func (m Mode) String() string {
	switch m {
	case ModeExclusive:
		return "exclusive"
	case ModeShared:
		return "shared"
	}
	return "mode(" + strconv.Itoa(int(m)) + ")"
}

// ValidateKind checks a Grant's Limit and Mode: a known mode, limit 0 or
// 2..MaxSemaphoreLimit (1 is the mutex, written 0, so that each command
// has one encoding), and no shared mode on a semaphore.
func ValidateKind(limit uint32, mode Mode) error {
	switch {
	case mode > ModeShared:
		return invalidf("unknown mode %d", uint8(mode))
	case limit == 1:
		return invalidf("limit 1 is a mutex, written 0")
	case limit > MaxSemaphoreLimit:
		return invalidf("limit %d is above %d", limit, MaxSemaphoreLimit)
	case limit > 1 && mode == ModeShared:
		return invalidf("a semaphore (limit %d) has no shared mode", limit)
	}
	return nil
}

// isMulti reports whether a lock of this kind lives among the multi-holder
// keys (kinds.go) rather than in the record table.
func isMulti(limit uint32, mode Mode) bool { return limit > 1 || mode == ModeShared }

// KeyHolders is one multi-holder key: its kind, its holders in token order
// and its delayed slots in sequence order (at least one of either). Each
// holder carries Key, Limit and Mode of the key; each delay its Key.
type KeyHolders struct {
	Key     string
	Limit   uint32
	Mode    Mode
	Holders []Lock
	Delays  []Delay
}

// multiKey is a multi-holder key in memory.
type multiKey struct {
	key     string // shared by its holders and slots: one copy of the bytes
	limit   uint32
	mode    Mode
	holders []Lock  // token order: every grant's token is the newest
	delays  []Delay // sequence order, likewise
}

// holderRef names one holder.
type holderRef struct {
	key   string
	token uint64
}

// kinds is the machine's multi-holder keys. The zero value is empty.
type kinds struct {
	keys     map[string]*multiKey
	nHolders int
	nDelays  int
	// holdersOf indexes the holders by session (not replicated on its
	// own: built from the holders).
	holdersOf map[uint64]map[holderRef]struct{}
	// sum is Σ holderTerm + Σ slotTerm, for the digest.
	sum sum256
	// maxHolders replaces MaxHoldersPerKey when not zero; only tests set
	// it (export_test.go).
	maxHolders int
}

func (k *kinds) maxPerKey() int { return cmp0(k.maxHolders, MaxHoldersPerKey) }

func (k *kinds) get(key string) *multiKey { return k.keys[key] }

// capacity is how many holders and delayed slots mk may have.
func (k *kinds) capacity(mk *multiKey) int {
	if mk.limit > 1 {
		return int(mk.limit)
	}
	return k.maxPerKey()
}

func (k *kinds) addHolder(mk *multiKey, l Lock) {
	mk.holders = append(mk.holders, l)
	k.nHolders++
	k.sum.add(holderTerm(&l))
	if l.SessionID != 0 {
		if k.holdersOf == nil {
			k.holdersOf = make(map[uint64]map[holderRef]struct{})
		}
		refs := k.holdersOf[l.SessionID]
		if refs == nil {
			refs = make(map[holderRef]struct{})
			k.holdersOf[l.SessionID] = refs
		}
		refs[holderRef{l.Key, l.Token}] = struct{}{}
	}
}

func (k *kinds) removeHolder(mk *multiKey, i int) Lock {
	l := mk.holders[i]
	mk.holders = slices.Delete(mk.holders, i, i+1)
	k.nHolders--
	k.sum.sub(holderTerm(&l))
	if l.SessionID != 0 {
		refs := k.holdersOf[l.SessionID]
		delete(refs, holderRef{l.Key, l.Token})
		if len(refs) == 0 {
			delete(k.holdersOf, l.SessionID)
		}
	}
	return l
}

func (k *kinds) addDelay(mk *multiKey, d Delay) {
	mk.delays = append(mk.delays, d)
	k.nDelays++
	k.sum.add(slotTerm(mk.limit, mk.mode, &d))
}

// newKey returns the multi-holder key for key, made with the kind given
// if it is new.
func (k *kinds) newKey(key string, limit uint32, mode Mode) *multiKey {
	if mk := k.keys[key]; mk != nil {
		return mk
	}
	if k.keys == nil {
		k.keys = make(map[string]*multiKey)
	}
	mk := &multiKey{key: key, limit: limit, mode: mode}
	k.keys[key] = mk
	return mk
}

// tidy forgets key once it has neither holder nor delayed slot: its kind
// is free for the next Grant.
func (k *kinds) tidy(key string, mk *multiKey) {
	if len(mk.holders) == 0 && len(mk.delays) == 0 {
		delete(k.keys, key)
	}
}

// find returns the index of the holder with token in mk, or -1.
func (mk *multiKey) find(token uint64) int {
	i, ok := slices.BinarySearchFunc(mk.holders, token, func(l Lock, t uint64) int {
		switch {
		case l.Token < t:
			return -1
		case l.Token > t:
			return 1
		}
		return 0
	})
	if !ok {
		return -1
	}
	return i
}

// oldest is the token of mk's oldest holder (0: none, only delayed slots).
func (mk *multiKey) oldest() uint64 {
	if len(mk.holders) == 0 {
		return 0
	}
	return mk.holders[0].Token
}

// refuseMulti is the part of a Grant of key, held as multi-holder key mk,
// that may refuse it (see the rules at the top); ok false when it may be
// granted.
func (m *Machine) refuseMulti(mk *multiKey, c *Command) (res Result, ok bool) {
	if c.Limit != mk.limit {
		return Result{Kind: ResultLimitMismatch, Limit: max(1, mk.limit), Token: mk.oldest()}, true
	}
	used := len(mk.holders) + len(mk.delays)
	switch {
	case mk.limit > 1 && len(mk.holders) >= int(mk.limit):
		return Result{Kind: ResultGrantRejected, Token: mk.oldest()}, true
	case mk.limit > 1 && used >= int(mk.limit):
		return Result{Kind: ResultDelayed}, true
	case mk.limit > 1:
		return Result{}, false
	case c.Mode == ModeExclusive && len(mk.holders) > 0:
		return Result{Kind: ResultGrantRejected, Token: mk.oldest()}, true
	case c.Mode == ModeExclusive:
		return Result{Kind: ResultDelayed}, true // shared slots delayed: no writer yet
	case used >= m.kinds.maxPerKey():
		return Result{Kind: ResultHoldersExhausted}, true
	}
	return Result{}, false
}

// grantHolder adds the new holder l (granted) of a multi-holder key, made
// by the request h (zero: none).
func (m *Machine) grantHolder(l Lock, h *[32]byte) {
	mk := m.kinds.newKey(l.Key, l.Limit, l.Mode)
	l.Key = mk.key
	m.kinds.addHolder(mk, l)
	if l.RequestID != "" {
		if m.req.held == nil {
			m.req.held = make(map[[32]byte]string)
		}
		m.req.held[*h] = l.Key
	}
}

// endHolder removes holder i of key's mk and records its request's end.
// The caller tidies the key.
func (m *Machine) endHolder(mk *multiKey, i int) Lock {
	l := m.kinds.removeHolder(mk, i)
	m.endRequest(&l)
	return l
}

// applyMulti applies a Renew, Release or Expire of multi-holder key mk.
func (m *Machine) applyMulti(mk *multiKey, c *Command) Result {
	i := mk.find(c.Token)
	switch c.Kind {
	case KindRenew:
		if i < 0 {
			return Result{Kind: ResultNotFound}
		}
		l := mk.holders[i]
		if l.SessionID != 0 {
			return Result{Kind: ResultNoop}
		}
		if c.LeaseMS > l.LeaseMS { // never shorter (see Apply)
			m.kinds.sum.sub(holderTerm(&l))
			l.LeaseMS = c.LeaseMS
			m.kinds.sum.add(holderTerm(&l))
			mk.holders[i] = l
		}
		return Result{Kind: ResultRenewed, Token: l.Token}
	case KindRelease:
		if i < 0 {
			return Result{Kind: ResultNotFound}
		}
		m.endHolder(mk, i)
		m.kinds.tidy(c.Key, mk)
		return Result{Kind: ResultReleased}
	case KindExpire:
		if i < 0 {
			return Result{Kind: ResultExpired}
		}
		l := mk.holders[i]
		switch {
		case l.SessionID != 0:
			return Result{Kind: ResultExpired}
		case l.LockDelayMS > 0 && m.delayCount() >= m.sess.maxDelays():
			return Result{Kind: ResultDelaysExhausted}
		}
		m.endHolder(mk, i)
		if l.LockDelayMS > 0 {
			m.delaySlot(mk, l.Key, l.LockDelayMS)
		}
		m.kinds.tidy(c.Key, mk)
		return Result{Kind: ResultExpired, Existed: true}
	}
	return Result{Kind: ResultNoop}
}

// delaySlot starts the lock-delay of a slot of key (its holder just freed
// by a failure): a shared slot delays exclusive Grants, a semaphore slot
// stays occupied.
func (m *Machine) delaySlot(mk *multiKey, key string, delayMS uint64) {
	m.sess.lastSeq++
	m.kinds.addDelay(mk, Delay{Key: mk.key, DelayMS: delayMS, Seq: m.sess.lastSeq})
}

// clearSlot is ClearDelay of a delayed slot: ok false when key has no
// delayed slot with seq.
func (m *Machine) clearSlot(key string, seq uint64) bool {
	mk := m.kinds.get(key)
	if mk == nil {
		return false
	}
	for i := range mk.delays {
		if d := mk.delays[i]; d.Seq == seq {
			m.kinds.sum.sub(slotTerm(mk.limit, mk.mode, &d))
			mk.delays = slices.Delete(mk.delays, i, i+1)
			m.kinds.nDelays--
			m.kinds.tidy(key, mk)
			return true
		}
	}
	return false
}

// delayCount is every delay: delayed keys and delayed slots, which
// MaxDelayedKeys bounds together.
func (m *Machine) delayCount() int { return len(m.sess.delays) + m.kinds.nDelays }

// heldRequestToken is the token of the holder of key made by request
// (identity, requestID), which the request index names (0: none).
func (m *Machine) heldRequestToken(key, identity, requestID string) uint64 {
	if mk := m.kinds.get(key); mk != nil {
		for i := range mk.holders {
			if l := &mk.holders[i]; l.RequestID == requestID && l.Identity == identity {
				return l.Token
			}
		}
		return 0
	}
	return m.lockToken(key)
}

// Holder returns the holder of key with token, whatever the key's kind:
// the lookup of the fence and check paths, which must accept any current
// holder of a multi-holder key.
func (m *Machine) Holder(key string, token uint64) (Lock, bool) {
	if mk := m.kinds.get(key); mk != nil {
		if i := mk.find(token); i >= 0 {
			return mk.holders[i], true
		}
		return Lock{}, false
	}
	l, ok := m.Get(key)
	if !ok || l.Token != token {
		return Lock{}, false
	}
	return l, true
}

// Holders returns every holder of key in token order: the mutex (or
// exclusive) lock alone, or a multi-holder key's holders; nil when none.
// Get returns only a mutex or exclusive lock.
func (m *Machine) Holders(key string) []Lock {
	if mk := m.kinds.get(key); mk != nil {
		return slices.Clone(mk.holders)
	}
	if l, ok := m.Get(key); ok {
		return []Lock{l}
	}
	return nil
}

// IsMulti reports whether key is a multi-holder key now: a semaphore, or a
// read/write key with shared holders or delayed shared slots. Its holders
// are not in Get, ForEachLock or Locks (they are in Holders, KeyHolders,
// ForEachHolder and MultiKeys).
func (m *Machine) IsMulti(key string) bool { return m.kinds.get(key) != nil }

// KeyKind returns multi-holder key key's limit and mode (ok false when
// key is not one: a mutex or exclusive lock, or no lock), without copying
// its holders.
func (m *Machine) KeyKind(key string) (limit uint32, mode Mode, ok bool) {
	if mk := m.kinds.get(key); mk != nil {
		return mk.limit, mk.mode, true
	}
	return 0, ModeExclusive, false
}

// KeyHolders returns multi-holder key key: its kind, holders and delayed
// slots (copies).
func (m *Machine) KeyHolders(key string) (KeyHolders, bool) {
	mk := m.kinds.get(key)
	if mk == nil {
		return KeyHolders{}, false
	}
	return mk.state(key), true
}

func (mk *multiKey) state(key string) KeyHolders {
	kh := KeyHolders{Key: key, Limit: mk.limit, Mode: mk.mode}
	if len(mk.holders) > 0 { // nil when empty, as decoded
		kh.Holders = slices.Clone(mk.holders)
	}
	if len(mk.delays) > 0 {
		kh.Delays = slices.Clone(mk.delays)
	}
	return kh
}

// MultiKeys returns every multi-holder key in key order.
func (m *Machine) MultiKeys() []KeyHolders {
	if len(m.kinds.keys) == 0 {
		return nil
	}
	out := make([]KeyHolders, 0, len(m.kinds.keys))
	for _, key := range slices.Sorted(maps.Keys(m.kinds.keys)) {
		out = append(out, m.kinds.keys[key].state(key))
	}
	return out
}

// ForEachHolder calls f for every holder of every multi-holder key, in no
// particular order (a new leader re-arms their leases as it does
// ForEachLock's). Callers must not let the order reach anything
// replicated or compared.
func (m *Machine) ForEachHolder(f func(Lock)) {
	for _, mk := range m.kinds.keys {
		for _, l := range mk.holders {
			f(l)
		}
	}
}

// HolderCount is the number of holders of multi-holder keys (Len counts
// them too).
func (m *Machine) HolderCount() int { return m.kinds.nHolders }

// SlotDelayCount is the number of delayed slots of multi-holder keys
// (DelayCount counts delayed keys; both count towards MaxDelayedKeys).
func (m *Machine) SlotDelayCount() int { return m.kinds.nDelays }

// sessionHolders returns session id's holders of multi-holder keys.
func (m *Machine) sessionHolders(id uint64) []Lock {
	refs := m.kinds.holdersOf[id]
	out := make([]Lock, 0, len(refs))
	for r := range refs {
		mk := m.kinds.get(r.key)
		out = append(out, mk.holders[mk.find(r.token)])
	}
	return out
}

// sortLocks sorts locks by key, then token: the order a command that
// ends several ends them in.
func sortLocks(locks []Lock) {
	sort.Slice(locks, func(i, j int) bool {
		if c := strings.Compare(locks[i].Key, locks[j].Key); c != 0 {
			return c < 0
		}
		return locks[i].Token < locks[j].Token
	})
}

// Delays returns every delay of key in sequence order: its delay as a key
// (a failed mutex or exclusive holder's) or its delayed slots (a failed
// semaphore or shared holder's); nil when none. What a leader arms after
// an Expire or ExpireSession that freed a holder, and clears with
// ClearDelay(key, seq).
func (m *Machine) Delays(key string) []Delay {
	if mk := m.kinds.get(key); mk != nil {
		if len(mk.delays) == 0 {
			return nil
		}
		return slices.Clone(mk.delays)
	}
	if d, ok := m.sess.delays[key]; ok {
		return []Delay{d}
	}
	return nil
}
