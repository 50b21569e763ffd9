package lockservice

import (
	"context"
	"errors"
	"strings"
	"testing"
)

const testACL = `
TENANT_A:
  "orders/": [acquire, release, get, list]
TENANT_A/bob:
  "orders/bob/": [acquire, release, get]
OBSERVER:
  "": [get, list]
"*":
  "public/": [get]
"":
  "anon/": [get]
`

func TestACLAllows(t *testing.T) {
	a, err := ParseACL([]byte(testACL))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		id   string
		op   Op
		key  string
		want bool
	}{
		{"TENANT_A", OpAcquire, "orders/42", true},
		{"TENANT_A/alice", OpRelease, "orders/42", true}, // the account's entry
		{"TENANT_A/alice", OpAcquire, "payments/1", false},
		{"TENANT_A/bob", OpAcquire, "orders/bob/1", true},
		{"TENANT_A/bob", OpAcquire, "orders/42", false}, // his entry narrows the account's
		{"TENANT_A/bob", OpList, "orders/bob/", false},
		{"TENANT_A", OpList, "orders/x", true},
		{"TENANT_A", OpList, "", false}, // listing everything is not listing orders/
		{"OBSERVER", OpGet, "anything", true},
		{"OBSERVER/eve", OpGet, "anything", true},
		{"OBSERVER", OpRelease, "anything", false},
		{"STRANGER", OpGet, "public/x", true}, // "*"
		{"STRANGER/u", OpAcquire, "public/x", false},
		{"STRANGER", OpGet, "orders/42", false},
		{"", OpGet, "anon/x", true}, // anonymous: only the "" entry
		{"", OpGet, "public/x", false},
		{"TENANT_AB", OpGet, "orders/42", false}, // no prefix match on identities
	} {
		if got := a.Allows(tc.id, tc.op, tc.key); got != tc.want {
			t.Errorf("Allows(%q, %s, %q) = %v, want %v", tc.id, tc.op, tc.key, got, tc.want)
		}
	}
}

func TestParseACLRefuses(t *testing.T) {
	for name, in := range map[string]string{
		"unknown op":      "A:\n  \"x/\": [acquire, delete]\n",
		"not a map":       "- A\n",
		"ops not a list":  "A:\n  \"x/\": acquire\n",
		"duplicate id":    "A:\n  \"x/\": [get]\nA:\n  \"y/\": [get]\n",
		"two documents":   "A:\n  \"x/\": [get]\n---\nB: {}\n",
		"long identity":   strings.Repeat("I", 300) + ":\n  \"x/\": [get]\n",
		"long prefix":     "A:\n  \"" + strings.Repeat("k", 600) + "\": [get]\n",
		"identity NUL":    "\"A\\0\":\n  \"x/\": [get]\n",
		"too large":       "A:\n  \"x/\": [get]\n#" + strings.Repeat("x", MaxACLBytes),
		"not yaml at all": "A: [\n",
	} {
		if _, err := ParseACL([]byte(in)); !errors.Is(err, ErrACL) {
			t.Errorf("%s: ParseACL = %v, want ErrACL", name, err)
		}
	}
	if a, err := ParseACL(nil); err != nil || a.Allows("A", OpGet, "k") {
		t.Errorf("empty ACL: %v, want one that denies everything", err)
	}
}

// authorize runs before anything touches the node: a refused request
// never reaches the leader checks, the policy or raft.
func TestAuthorizeBeforeAnything(t *testing.T) {
	a, err := ParseACL([]byte(testACL))
	if err != nil {
		t.Fatal(err)
	}
	s := New(Config{ACL: a}) // no node attached: reaching it would panic
	defer s.cancel()
	ctx := WithIdentity(context.Background(), "TENANT_A/bob")
	err = s.Release(ctx, "orders/42", 7)
	var pe *PermissionError
	if !errors.Is(err, ErrPermissionDenied) || !errors.As(err, &pe) || pe.Op != OpRelease || pe.Key != "orders/42" {
		t.Fatalf("Release by bob outside his prefix = %v, want a PermissionError", err)
	}
	if _, err := s.Get(ctx, "orders/42"); !errors.Is(err, ErrPermissionDenied) {
		t.Fatalf("Get = %v, want ErrPermissionDenied", err)
	}
	if err := s.authorize(WithNodeAuthority(context.Background()), OpRelease, "orders/42"); err != nil {
		t.Fatalf("a node's own request was refused: %v", err)
	}
	if err := s.authorize(context.Background(), OpGet, "orders/42"); !errors.Is(err, ErrPermissionDenied) ||
		!strings.Contains(err.Error(), "unauthenticated") {
		t.Fatalf("anonymous get = %v, want denied", err)
	}
	if err := New(Config{}).authorize(ctx, OpRelease, "orders/42"); err != nil {
		t.Fatalf("no ACL must allow everything, got %v", err)
	}
}
