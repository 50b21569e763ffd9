package raftstore

import "go.etcd.io/raft/v3/raftpb"

// Bounds of the in-memory tail of the log (logTail). Raft reads every
// entry back once it is durable (committed entries to apply, appends to a
// follower that fell a little behind, terms to match), nearly always
// among the newest; from Pebble each read costs an iterator and a decode
// (about 5% of a node's CPU under load). Beyond these bounds reads go to
// Pebble as before.
const (
	// maxTailEntries bounds the entries kept.
	maxTailEntries = 4096
	// maxTailBytes bounds their data (plus tailEntryOverhead each).
	maxTailBytes = 8 << 20
	// tailEntryOverhead is what one cached entry costs beyond its Data.
	tailEntryOverhead = 48
)

// logTail is the newest part of the persisted log, in memory: entries
// ents[0].Index .. ents[0].Index+len(ents)-1, the last of which is the
// store's last index whenever ents is not empty.
//
// It is published with storeState and read under Store.mu without copying,
// so the entries a published slice header covers are never written again:
// a plain append writes only past every published length (or into a new
// array), and a truncation (a new leader overwriting an uncommitted suffix)
// copies the kept prefix into a new array. The entries' Data is shared with
// raft and the callers of Entries, who never modify it (raft's own
// MemoryStorage shares it the same way).
type logTail struct {
	ents  []raftpb.Entry
	bytes int
}

func tailCost(e *raftpb.Entry) int { return len(e.Data) + tailEntryOverhead }

// first is the index of the oldest cached entry (0 when empty).
func (t logTail) first() uint64 {
	if len(t.ents) == 0 {
		return 0
	}
	return t.ents[0].Index
}

// covers says whether index i is cached.
func (t logTail) covers(i uint64) bool {
	return len(t.ents) > 0 && i >= t.ents[0].Index && i < t.ents[0].Index+uint64(len(t.ents))
}

// appended is t after ents (contiguous, not empty) were written at
// ents[0].Index, dropping what they replace, as stageEntries writes them.
func (t logTail) appended(ents []raftpb.Entry) logTail {
	at := ents[0].Index
	if len(t.ents) > 0 {
		first := t.ents[0].Index
		next := first + uint64(len(t.ents))
		switch {
		case at == next:
			// A plain append: past every published length.
		case at > first && at < next:
			// A truncation: readers may hold the old array.
			kept := int(at - first)
			n := logTail{ents: make([]raftpb.Entry, kept, kept+len(ents))}
			copy(n.ents, t.ents[:kept])
			for i := range n.ents {
				n.bytes += tailCost(&n.ents[i])
			}
			t = n
		default:
			t = logTail{}
		}
	}
	t.ents = append(t.ents, ents...)
	for i := len(t.ents) - len(ents); i < len(t.ents); i++ {
		t.bytes += tailCost(&t.ents[i])
	}
	drop := 0
	for len(t.ents)-drop > maxTailEntries || (t.bytes > maxTailBytes && len(t.ents)-drop > 1) {
		t.bytes -= tailCost(&t.ents[drop])
		drop++
	}
	t.ents = t.ents[drop:]
	return t
}

// compacted is t without the entries at or below index.
func (t logTail) compacted(index uint64) logTail {
	for len(t.ents) > 0 && t.ents[0].Index <= index {
		t.bytes -= tailCost(&t.ents[0])
		t.ents = t.ents[1:]
	}
	return t
}

// slice returns the cached entries [lo, hi) (both covered) limited to
// maxSize bytes beyond the first, as Store.Entries does. The full slice
// expression keeps a caller's append from writing into the cache.
func (t logTail) slice(lo, hi, maxSize uint64) []raftpb.Entry {
	first := t.ents[0].Index
	i, j := int(lo-first), int(hi-first)
	var size uint64
	for k := i; k < j; k++ {
		size += uint64(t.ents[k].Size())
		if k > i && size > maxSize {
			j = k
			break
		}
	}
	return t.ents[i:j:j]
}
