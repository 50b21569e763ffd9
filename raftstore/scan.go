package raftstore

import (
	"bytes"
	"errors"
	"fmt"
	"slices"

	"github.com/cockroachdb/pebble/v2"

	"github.com/ticketd/ticketd/core"
)

// LockPage is one page of held locks in key byte order (ScanLocks).
type LockPage struct {
	Locks []core.Lock
	// More reports that locks after the last one returned exist.
	More bool
	// Applied is the applied index the page was read at.
	Applied uint64
}

// ScanLocks reads up to limit held locks whose keys start with prefix and
// sort strictly after `after`, in byte order, from the store's latest
// durable view (the k/ rows, and the h/ rows of multi-holder keys, which
// Pebble keeps sorted: no index of our own, and machineMu is never
// taken). The holders of a semaphore or of a key held shared come
// together, in token order (a key of delayed slots only has none): a page
// never splits a key, so it may hold fewer than limit locks, or more when
// one key alone has more holders than limit.
//
// afterToken, when not 0, resumes inside key `after` instead: its holders
// with a token above afterToken come first (a transport cuts a page
// between a key's holders when they do not fit one message; the client
// passes back the last key and token it got). 0 keeps the whole of
// `after` out, as before.
//
// Cost: one seek in each namespace and at most limit+1 row reads and
// decodes, O(log n + limit), under the store's read lock; the raft loop's
// next write waits for that lock only to swap its view in, so a page of
// 1000 locks delays it by well under a millisecond. A node that has
// applied index i (see Node.AppliedIndex) reads a view at or after i.
func (s *Store) ScanLocks(prefix, after string, afterToken uint64, limit int) (LockPage, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return LockPage{}, ErrStoreClosed
	}
	page := LockPage{Applied: s.st.applied}
	lower := prefix
	if after >= lower {
		lower = after
		if afterToken == 0 {
			lower += "\x00" // the smallest key after `after`
		}
	}
	upper, bounded := prefixEnd(prefix)
	if bounded && lower >= upper {
		return page, nil
	}
	bounds := func(ns, end []byte) *pebble.IterOptions {
		o := &pebble.IterOptions{LowerBound: append(slices.Clip(ns), lower...), UpperBound: end}
		if bounded {
			o.UpperBound = append(slices.Clip(ns), upper...)
		}
		return o
	}
	locks, err := s.view.NewIter(bounds(prefixLock, endLock))
	if err != nil {
		return LockPage{}, fmt.Errorf("raftstore: scan locks: %w", err)
	}
	multi, err := s.view.NewIter(bounds(prefixHolder, endHolder))
	if err != nil {
		_ = locks.Close()
		return LockPage{}, fmt.Errorf("raftstore: scan locks: %w", err)
	}
	resume := cursor{key: after, token: afterToken}
	err = mergeLockRows(locks, multi, s.st.lastToken, resume, limit, &page)
	if err = errors.Join(err, locks.Error(), locks.Close(), multi.Error(), multi.Close()); err != nil {
		return LockPage{}, fmt.Errorf("raftstore: scan locks: %w", err)
	}
	return page, nil
}

// cursor is where a scan resumes inside a key: its holders with a token
// above token (token 0: none, the key was read whole).
type cursor struct {
	key   string
	token uint64
}

// rest is the part of a key's holders (in token order) after c.
func (c cursor) rest(holders []core.Lock) []core.Lock {
	if c.token == 0 || len(holders) == 0 || holders[0].Key != c.key {
		return holders
	}
	i := 0
	for i < len(holders) && holders[i].Token <= c.token {
		i++
	}
	return holders[i:]
}

// mergeLockRows fills page from the lock rows and the holder rows in key
// order (a key is in one or the other), stopping at a key boundary once
// limit locks are in it; the key of resume gives only its holders after
// resume.token.
func mergeLockRows(locks, multi *pebble.Iterator, lastToken uint64, resume cursor, limit int, page *LockPage) error {
	okL, okM := locks.First(), multi.First()
	for okL || okM {
		useLock := okL && (!okM || bytes.Compare(locks.Key()[len(prefixLock):], multi.Key()[len(prefixHolder):]) < 0)
		var add []core.Lock
		if useLock {
			l, err := iterLock(locks, lastToken)
			if err != nil {
				return err
			}
			add = []core.Lock{l}
		} else {
			kh, err := iterHolders(multi, lastToken)
			if err != nil {
				return err
			}
			add = kh.Holders
		}
		add = resume.rest(add)
		if len(add) > 0 && len(page.Locks) > 0 && len(page.Locks)+len(add) > limit || len(page.Locks) >= limit && len(add) > 0 {
			page.More = true
			return nil
		}
		page.Locks = append(page.Locks, add...)
		if useLock {
			okL = locks.Next()
		} else {
			okM = multi.Next()
		}
	}
	return nil
}

// prefixEnd is the smallest string above every string that starts with
// prefix; ok is false when there is none (prefix empty or all 0xff).
func prefixEnd(prefix string) (string, bool) {
	b := []byte(prefix)
	for i := len(b) - 1; i >= 0; i-- {
		if b[i] < 0xff {
			b[i]++
			return string(b[:i+1]), true
		}
	}
	return "", false
}

// ScanLocks reads a page of held locks from the node's store
// (Store.ScanLocks). It is not linearizable by itself: call ReadIndex
// first.
func (n *Node) ScanLocks(prefix, after string, afterToken uint64, limit int) (LockPage, error) {
	return n.cfg.Store.ScanLocks(prefix, after, afterToken, limit)
}

// iterHolders decodes and validates the holder row under it.
func iterHolders(it *pebble.Iterator, lastToken uint64) (core.KeyHolders, error) {
	key := string(it.Key()[len(prefixHolder):])
	v, err := it.ValueAndErr()
	if err != nil {
		return core.KeyHolders{}, fmt.Errorf("read holder row %q: %w", key, err)
	}
	kh, err := core.DecodeHolderRecord(v)
	if err != nil {
		return core.KeyHolders{}, fmt.Errorf("%w: holder row %q: %w", ErrCorrupt, key, err)
	}
	if kh.Key != key {
		return core.KeyHolders{}, fmt.Errorf("%w: holder row %q holds key %q", ErrCorrupt, key, kh.Key)
	}
	if n := len(kh.Holders); n > 0 && kh.Holders[n-1].Token > lastToken {
		return core.KeyHolders{}, fmt.Errorf("%w: holder row %q token %d above last token %d", ErrCorrupt, key, kh.Holders[n-1].Token, lastToken)
	}
	return kh, nil
}

// iterLock decodes and validates the lock row under it.
func iterLock(it *pebble.Iterator, lastToken uint64) (core.Lock, error) {
	key := string(it.Key()[len(prefixLock):])
	v, err := it.ValueAndErr()
	if err != nil {
		return core.Lock{}, fmt.Errorf("read lock row %q: %w", key, err)
	}
	l, err := core.DecodeLockRecord(v)
	if err != nil {
		return core.Lock{}, fmt.Errorf("%w: lock row %q: %w", ErrCorrupt, key, err)
	}
	if l.Key != key {
		return core.Lock{}, fmt.Errorf("%w: lock row %q holds key %q", ErrCorrupt, key, l.Key)
	}
	if l.Token > lastToken {
		return core.Lock{}, fmt.Errorf("%w: lock row %q token %d above last token %d", ErrCorrupt, key, l.Token, lastToken)
	}
	return l, nil
}
