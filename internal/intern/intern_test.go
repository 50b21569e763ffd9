package intern

import "testing"

func TestTable(t *testing.T) {
	tb := New()
	a := tb.Add("alice")
	if b := tb.AddBytes([]byte("alice")); b != a || tb.Refs("alice") != 2 || tb.Name(a) != "alice" {
		t.Fatalf("alice: ids %d %d, refs %d", a, b, tb.Refs("alice"))
	}
	if id := tb.AddBytes(nil); id != 0 || tb.Refs("") != 1 {
		t.Fatalf("empty: id %d refs %d", id, tb.Refs(""))
	}
	tb.Release(a)
	tb.Release(a)
	if tb.Refs("alice") != 0 {
		t.Fatalf("alice still held %d times", tb.Refs("alice"))
	}
	if b := tb.Add("bob"); b != a {
		t.Fatalf("bob got %d, want the freed id %d", b, a)
	}
	tb.Release(0)
	if tb.Refs("") != 0 || tb.Name(0) != "" {
		t.Fatal("the empty string's entry changed")
	}
	if id := tb.Add(""); id != 0 {
		t.Fatalf("empty string re-added as %d", id)
	}
}
