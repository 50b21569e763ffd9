package intern

// Table holds reference-counted string IDs. Use New; the zero value is
// not usable.
type Table struct {
	entries []entry // entries[0] is the empty string, never freed
	ids     map[string]uint32
	free    []uint32
}

type entry struct {
	name string
	refs int
}

// New returns a table holding only the empty string (ID 0, no
// references).
func New() Table {
	return Table{entries: []entry{{}}, ids: map[string]uint32{"": 0}}
}

// Add returns s's ID and counts one more reference to it.
func (t *Table) Add(s string) uint32 {
	id, ok := t.ids[s]
	if !ok {
		if k := len(t.free); k > 0 {
			id, t.free = t.free[k-1], t.free[:k-1]
			t.entries[id] = entry{name: s}
		} else {
			id = uint32(len(t.entries))
			t.entries = append(t.entries, entry{name: s})
		}
		t.ids[s] = id
	}
	t.entries[id].refs++
	return id
}

// AddBytes is Add for b, without allocating a string when b is already
// known (or empty).
func (t *Table) AddBytes(b []byte) uint32 {
	if len(b) == 0 {
		t.entries[0].refs++
		return 0
	}
	if id, ok := t.ids[string(b)]; ok {
		t.entries[id].refs++
		return id
	}
	return t.Add(string(b))
}

// Release drops one reference to id; at zero the ID may be reused (never
// the empty string's).
func (t *Table) Release(id uint32) {
	e := &t.entries[id]
	if e.refs--; e.refs == 0 && id != 0 {
		delete(t.ids, e.name)
		*e = entry{}
		t.free = append(t.free, id)
	}
}

// Name is the string of id.
func (t *Table) Name(id uint32) string { return t.entries[id].name }

// Refs is how many references s has (0 if it is not held).
func (t *Table) Refs(s string) int {
	if id, ok := t.ids[s]; ok {
		return t.entries[id].refs
	}
	return 0
}

// Each calls f for every ID slot in ID order, free ones included (name
// "", refs 0).
func (t *Table) Each(f func(id uint32, name string, refs int)) {
	for i, e := range t.entries {
		f(uint32(i), e.name, e.refs)
	}
}
