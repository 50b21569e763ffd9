package core

import (
	"maps"
	"slices"
	"sort"
)

// Loading and checking the multi-holder keys (kinds.go): from storage's
// holder rows (LoadHolders), from a snapshot (RestoreState, Restore), and
// the checks both make against the rest of the state.

// loadKinds replaces the multi-holder keys with ks (validated), keeping
// the request and session indexes in step.
func (m *Machine) loadKinds(ks []KeyHolders) {
	m.kinds = kinds{maxHolders: m.kinds.maxHolders}
	for _, kh := range ks {
		mk := m.kinds.newKey(kh.Key, kh.Limit, kh.Mode)
		for _, l := range kh.Holders {
			var h [32]byte
			if l.RequestID != "" {
				h = RequestKey(l.Identity, l.RequestID)
			}
			m.grantHolder(l, &h)
		}
		for _, d := range kh.Delays {
			d.Key = mk.key
			m.kinds.addDelay(mk, d)
		}
	}
}

// LoadHolders replaces the multi-holder keys with ks, as read back from
// storage (one row per key), after Load, LoadControl, LoadRequests and
// LoadSessions: it is checked against all of them. ks is sorted by key in
// place. On error the machine is unchanged.
func (m *Machine) LoadHolders(ks []KeyHolders) error {
	sort.Slice(ks, func(i, j int) bool { return ks[i].Key < ks[j].Key })
	ss := m.sess.state()
	perSession := make(map[uint64]int, len(m.sess.locksOf))
	for id, keys := range m.sess.locksOf {
		perSession[id] = len(keys)
	}
	v := kindsCheck{
		clusterVersion: m.ClusterVersion(), lastToken: m.lastToken, sessions: &ss, ended: m.req.state().Ended, requests: m.req.count(),
		perSession: perSession,
		plainKey:   func(key string) bool { _, ok := m.Get(key); return ok },
		plainRequest: func(h [32]byte) bool {
			_, ok := m.req.held[h]
			return ok
		},
	}
	tokens, err := v.validate(ks)
	if err != nil {
		return err
	}
	if len(tokens) > 0 {
		var dup uint64
		m.ForEachLock(func(l Lock) {
			if _, ok := tokens[l.Token]; ok && dup == 0 {
				dup = l.Token
			}
		})
		if dup != 0 {
			return malformedf("token %d held twice", dup)
		}
	}
	m.loadKinds(ks)
	return nil
}

// kindsCheck checks the multi-holder keys against the rest of a state.
type kindsCheck struct {
	clusterVersion, lastToken uint64
	sessions                  *SessionState
	ended                     []EndedRequest
	perSession                map[uint64]int      // plain session locks per session
	plainKey                  func(string) bool   // key has a plain lock
	plainRequest              func([32]byte) bool // request held by a plain lock
	requests                  int                 // request records besides the holders' (plain held + ended)
}

// validate checks ks: nothing before cluster version 5; keys ascending,
// neither held plainly nor delayed as a key; each key valid
// (validateKeyHolders); tokens not above the last token, unique among
// them and not an ended record's; delay sequence numbers unique among
// them and the delayed keys', not above the last; request ids unique
// (with the plain locks', and within MaxRequestRecords); sessions open and within MaxLocksPerSession
// with their plain locks; the delays within MaxDelayedKeys. It returns
// the holders' tokens, for the caller to check against the plain locks'.
func (v *kindsCheck) validate(ks []KeyHolders) (map[uint64]struct{}, error) {
	if len(ks) == 0 {
		return nil, nil
	}
	if v.clusterVersion < 5 {
		return nil, malformedf("multi-holder keys before cluster version 5")
	}
	ss := v.sessions
	open := make(map[uint64]struct{}, len(ss.Sessions))
	for _, x := range ss.Sessions {
		open[x.ID] = struct{}{}
	}
	seqs := make(map[uint64]struct{}, len(ss.Delays))
	delayed := make(map[string]struct{}, len(ss.Delays))
	for _, d := range ss.Delays {
		seqs[d.Seq] = struct{}{}
		delayed[d.Key] = struct{}{}
	}
	endedTokens := make(map[uint64]struct{}, len(v.ended))
	for _, e := range v.ended {
		endedTokens[e.Token] = struct{}{}
	}
	tokens := make(map[uint64]struct{})
	requests := make(map[[32]byte]struct{})
	perSession := maps.Clone(v.perSession)
	if perSession == nil {
		perSession = make(map[uint64]int)
	}
	holders, slots := 0, len(ss.Delays)
	for i := range ks {
		kh := &ks[i]
		if err := validateKeyHolders(kh); err != nil {
			return nil, err
		}
		_, isDelayed := delayed[kh.Key]
		switch {
		case i > 0 && kh.Key <= ks[i-1].Key:
			return nil, malformedf("multi-holder keys not strictly ascending at %q", kh.Key)
		case isDelayed || v.plainKey(kh.Key):
			return nil, malformedf("key %q is both a multi-holder key and held or delayed as a mutex", kh.Key)
		}
		for _, l := range kh.Holders {
			_, dup := tokens[l.Token]
			_, ended := endedTokens[l.Token]
			if l.Token > v.lastToken || dup || ended {
				return nil, malformedf("holder of %q has token %d (last %d, twice, or ended)", kh.Key, l.Token, v.lastToken)
			}
			tokens[l.Token] = struct{}{}
			if l.RequestID != "" {
				h := RequestKey(l.Identity, l.RequestID)
				_, dup := requests[h]
				if dup || v.plainRequest(h) {
					return nil, malformedf("holder of %q repeats the request of another lock", kh.Key)
				}
				requests[h] = struct{}{}
			}
			if l.SessionID != 0 {
				perSession[l.SessionID]++
			}
		}
		for _, d := range kh.Delays {
			if _, dup := seqs[d.Seq]; dup || d.Seq > ss.LastDelaySeq {
				return nil, malformedf("delayed slot of %q has sequence number %d (last %d, or twice)", kh.Key, d.Seq, ss.LastDelaySeq)
			}
			seqs[d.Seq] = struct{}{}
		}
		holders += len(kh.Holders)
		slots += len(kh.Delays)
	}
	if v.requests+len(requests) > MaxRequestRecords {
		return nil, malformedf("%d request records and %d held by holders, the limit is %d", v.requests, len(requests), MaxRequestRecords)
	}
	if holders > MaxSnapshotLocks || slots > MaxDelayedKeys {
		return nil, malformedf("%d holders and %d delays, the limits are %d and %d", holders, slots, MaxSnapshotLocks, MaxDelayedKeys)
	}
	for _, id := range slices.Sorted(maps.Keys(perSession)) {
		n := perSession[id]
		if _, ok := open[id]; !ok {
			return nil, malformedf("%d locks of session %d, which is not open", n, id)
		}
		if n > MaxLocksPerSession {
			return nil, malformedf("session %d holds %d locks, the limit is %d", id, n, MaxLocksPerSession)
		}
	}
	return tokens, nil
}

// validateKeyHolders checks one multi-holder key on its own: a valid key
// and kind that is one (a semaphore, or shared); at least one holder or
// delayed slot and no more than its capacity (the limit, or
// MaxHoldersPerKey); each holder a valid lock of the key with its kind,
// tokens strictly ascending; each delay valid, of the key, sequence
// numbers strictly ascending.
func validateKeyHolders(kh *KeyHolders) error {
	if err := ValidateKey(kh.Key); err != nil {
		return err
	}
	if err := ValidateKind(kh.Limit, kh.Mode); err != nil {
		return err
	}
	n := len(kh.Holders) + len(kh.Delays)
	capacity := MaxHoldersPerKey
	if kh.Limit > 1 {
		capacity = int(kh.Limit)
	}
	switch {
	case !isMulti(kh.Limit, kh.Mode):
		return malformedf("key %q: a mutex is not a multi-holder key", kh.Key)
	case n == 0 || n > capacity:
		return malformedf("key %q has %d holders and delayed slots, at most %d", kh.Key, n, capacity)
	}
	for i := range kh.Holders {
		l := &kh.Holders[i]
		if l.Key != kh.Key || l.Limit != kh.Limit || l.Mode != kh.Mode {
			return malformedf("holder %d of %q is of key %q, limit %d, mode %s", i, kh.Key, l.Key, l.Limit, l.Mode)
		}
		if err := validateLock(*l); err != nil {
			return err
		}
		if i > 0 && l.Token <= kh.Holders[i-1].Token {
			return malformedf("holders of %q not in ascending token order", kh.Key)
		}
	}
	for i := range kh.Delays {
		d := &kh.Delays[i]
		if d.Key != kh.Key {
			return malformedf("delayed slot %d of %q is of key %q", i, kh.Key, d.Key)
		}
		if err := validateDelay(d); err != nil {
			return err
		}
		if i > 0 && d.Seq <= kh.Delays[i-1].Seq {
			return malformedf("delayed slots of %q not in ascending sequence order", kh.Key)
		}
	}
	return nil
}
