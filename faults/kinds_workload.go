package faults

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/ticketd/ticketd/sdk"
)

// The workload on semaphore and read/write keys (issue 25): Config.
// SemaphoreLimit > 0 adds, beside the mutex keys, one semaphore key of
// that limit and one read/write key; the cycles, renewals, gets and
// releases on them are the mutex ones, with the acquire naming the kind
// (two shared acquires in three on the read/write key, so shared holders
// meet and exclusive ones wait behind them) and the resource used as
// kindsResource says.

// kindsMaxLimit bounds the workload's semaphore limit, well below the
// holders one state of the kinds model carries (maxModelHolders). A limit
// of 1 is a mutex (sdk.WithLimit), so a semaphore has at least 2.
const kindsMaxLimit = 8

// keySpec is the kind of a workload key.
type keySpec struct {
	Lock  LockKind
	Limit int // LockSemaphore
}

// kindKeys returns the names and kinds of the semaphore and read/write
// keys of a run (none when limit is 0).
func kindKeys(name string, limit int) ([]string, map[string]keySpec) {
	specs := map[string]keySpec{}
	if limit <= 0 {
		return nil, specs
	}
	sem, rwk := fmt.Sprintf("faults/%s/sem%d", name, limit), fmt.Sprintf("faults/%s/rw", name)
	specs[sem] = keySpec{Lock: LockSemaphore, Limit: limit}
	specs[rwk] = keySpec{Lock: LockRW}
	return []string{sem, rwk}, specs
}

// pickShared tells whether a cycle's acquire of key is a shared hold:
// two in three on a read/write key, so shared holders meet and exclusive
// ones wait behind them.
func (wk *worker) pickShared(key string) bool {
	return wk.w.kinds[key].Lock == LockRW && wk.rng.IntN(3) > 0
}

// kindOptions are the acquire options of key's kind (shared: a shared
// hold of a read/write key), and records the kind in o.
func (wk *worker) kindOptions(key string, shared bool, o *Op) []sdk.AcquireOption {
	spec, ok := wk.w.kinds[key]
	if !ok {
		return nil
	}
	o.Lock = spec.Lock
	switch spec.Lock {
	case LockSemaphore:
		o.Limit = spec.Limit
		return []sdk.AcquireOption{sdk.WithLimit(spec.Limit)}
	case LockRW:
		if shared {
			o.Shared = true
			return []sdk.AcquireOption{sdk.WithShared()}
		}
	}
	return nil
}

// recordHolders copies a get's holders of a multi-holder key into o. A
// reply that left holders out (HoldersMore) cannot be checked: a failed
// get.
func recordHolders(o *Op, hd sdk.Holder) {
	if hd.HoldersMore {
		o.Result, o.Code = OutFail, "holders_more"
		return
	}
	o.Shared = hd.Shared
	for _, x := range hd.Holders {
		o.Holders = append(o.Holders, x.Token)
	}
	sort.Slice(o.Holders, func(i, j int) bool { return o.Holders[i] < o.Holders[j] })
}

// kindUser is a holder using the resource of a multi-holder key.
type kindUser struct {
	l      *sdk.Lock
	shared bool
}

// use is resource.write for a semaphore or read/write key, called with
// r.mu held: the resource is used by holders from their first write until
// they leave (before their release) or their lock stops being valid by
// its SDK deadline, and it refuses a use that would make more users than
// the key admits (a semaphore's limit; an exclusive user beside any
// other). A refusal of a valid holder means the cluster granted more
// holders than the key admits (checkUses). The write records the users in
// the way (Blocking).
func (r *resource) use(client int, l *sdk.Lock, spec keySpec) (attempted, accepted bool) {
	if !l.Valid() {
		return false, false
	}
	users := r.users[l.Key]
	if users == nil {
		users = map[uint64]kindUser{}
		r.users[l.Key] = users
	}
	var in []uint64 // other users still valid
	for tok, u := range users {
		if !u.l.Valid() {
			delete(users, tok)
		} else if tok != l.Token {
			in = append(in, tok)
		}
	}
	sort.Slice(in, func(i, j int) bool { return in[i] < in[j] })
	var blocking []uint64
	switch spec.Lock {
	case LockSemaphore:
		if len(in)+1 > spec.Limit {
			blocking = in
		}
	default:
		for _, tok := range in {
			if !l.Shared || !users[tok].shared {
				blocking = append(blocking, tok)
			}
		}
	}
	accepted = len(blocking) == 0
	w := Write{Client: client, Key: l.Key, Token: l.Token, At: r.h.Now(), Accepted: accepted}
	if accepted {
		users[l.Token] = kindUser{l: l, shared: l.Shared}
	} else {
		w.Highest, w.Blocking = blocking[0], blocking
	}
	r.h.addWrite(w)
	return true, accepted
}

// leave ends l's use of the resource (a no-op for a mutex key).
func (r *resource) leave(l *sdk.Lock) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.users[l.Key], l.Token)
}

// waitKinds polls, with unrecorded try-acquires of a key of its own,
// until the cluster serves semaphores (a new cluster answers unsupported
// until its leader has raised the cluster version), so that the first
// round's acquires are not refused for it. It returns the last error.
func waitKinds(cl *sdk.Client, name string, within time.Duration) error {
	key := fmt.Sprintf("faults/%s/kinds-probe", name)
	deadline := time.Now().Add(within)
	var err error
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		var l *sdk.Lock
		l, err = cl.Acquire(ctx, key, sdk.WithLimit(2), sdk.WithLease(time.Second))
		if err == nil {
			err = l.Release(ctx)
		}
		cancel()
		if err == nil {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return err
}
