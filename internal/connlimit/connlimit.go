package connlimit

import "sync"

// Limits of a Table.
type Limits struct {
	// Total bounds the connections from sources not admitted as reserved.
	Total int
	// PerSource bounds the connections from one source address.
	PerSource int
}

// Table tracks the connections of one listener. Its methods are safe for
// concurrent use.
type Table struct {
	lim Limits

	mu       sync.Mutex     // guards everything below
	bySource map[string]int // connections per source
	shared   int            // connections not reserved
	order    []*Entry       // evictable connections, oldest first
}

// Entry is one connection in a Table.
type Entry struct {
	source   string
	reserved bool
	close    func()
	held     bool // in service: never evicted
	gone     bool // evicted or done
}

// New returns an empty table. Limits below 1 count as 1.
func New(l Limits) *Table {
	return &Table{lim: Limits{Total: max(1, l.Total), PerSource: max(1, l.PerSource)}, bySource: make(map[string]int)}
}

// Admit records a new connection from source, evictable until Hold.
// close is called (outside the table's lock, at most once) if it is
// evicted later. To make room Admit evicts the oldest evictable
// connection of source when source is at its limit, and the oldest
// evictable connection from a source not reserved when the table is
// full, closing them before it returns; evicted counts them. A nil Entry
// means there was no room: the caller closes the new connection.
func (t *Table) Admit(source string, reserved bool, close func()) (e *Entry, evicted int) {
	t.mu.Lock()
	var victims []*Entry
	shared := t.shared
	if t.bySource[source] >= t.lim.PerSource {
		v := t.oldest(func(o *Entry) bool { return o.source == source })
		if v == nil {
			t.mu.Unlock()
			return nil, 0
		}
		victims = append(victims, v)
		if !v.reserved {
			shared--
		}
	}
	if !reserved && shared >= t.lim.Total {
		v := t.oldest(func(o *Entry) bool { return !o.reserved && (len(victims) == 0 || o != victims[0]) })
		if v == nil {
			t.mu.Unlock()
			return nil, 0
		}
		victims = append(victims, v)
	}
	for _, v := range victims {
		t.removeLocked(v)
	}
	e = &Entry{source: source, reserved: reserved, close: close}
	t.addLocked(e)
	t.mu.Unlock()
	for _, v := range victims {
		v.close()
	}
	return e, len(victims)
}

// Hold marks e in service: it is never evicted until Release.
func (t *Table) Hold(e *Entry) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if e.gone || e.held {
		return
	}
	e.held = true
	t.unorderLocked(e)
}

// Release makes e evictable again, as the newest connection (an idle
// keep-alive connection, say).
func (t *Table) Release(e *Entry) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if e.gone || !e.held {
		return
	}
	e.held = false
	t.order = append(t.order, e)
}

// Done removes e; it is a no-op if e was evicted or is done already.
func (t *Table) Done(e *Entry) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !e.gone {
		t.removeLocked(e)
	}
}

// Gone reports whether e was evicted or is done.
func (t *Table) Gone(e *Entry) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return e.gone
}

// Len is the number of connections in the table, and of those from
// source.
func (t *Table) Len(source string) (total, fromSource int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, n := range t.bySource {
		total += n
	}
	return total, t.bySource[source]
}

// oldest is the oldest evictable entry that match accepts. mu held.
func (t *Table) oldest(match func(*Entry) bool) *Entry {
	for _, o := range t.order {
		if match(o) {
			return o
		}
	}
	return nil
}

func (t *Table) addLocked(e *Entry) {
	t.bySource[e.source]++
	if !e.reserved {
		t.shared++
	}
	if !e.held {
		t.order = append(t.order, e)
	}
}

func (t *Table) removeLocked(e *Entry) {
	e.gone = true
	if t.bySource[e.source]--; t.bySource[e.source] <= 0 {
		delete(t.bySource, e.source)
	}
	if !e.reserved {
		t.shared--
	}
	if !e.held {
		t.unorderLocked(e)
	}
}

func (t *Table) unorderLocked(e *Entry) {
	for i, o := range t.order {
		if o == e {
			t.order = append(t.order[:i], t.order[i+1:]...)
			return
		}
	}
}
