package lockservice

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/ticketd/ticketd/core"
)

// Op is an operation an access list grants on a key prefix.
type Op string

// The operations of an access list. Renewing a lock counts as OpAcquire:
// it extends what acquiring gave.
const (
	OpAcquire Op = "acquire"
	OpRelease Op = "release"
	OpGet     Op = "get"
	OpList    Op = "list"
)

var knownOps = []Op{OpAcquire, OpRelease, OpGet, OpList}

// Limits of an access list file: it is read once at start, but it is
// still input, and a huge one would slow every request.
const (
	// MaxACLBytes bounds the file.
	MaxACLBytes = 1 << 20
	// MaxACLRules bounds the prefix rules of all identities together.
	MaxACLRules = 10000
)

// Identities with a meaning of their own in an access list.
const (
	// ACLAnyone is the entry for every authenticated identity that has no
	// entry of its own (neither "ACCOUNT/user" nor "ACCOUNT").
	ACLAnyone = "*"
	// ACLAnonymous ("") is the entry for requests that carry no
	// authenticated identity; "*" does not cover them.
	ACLAnonymous = ""
)

// ACL is an access list: for each identity, the key prefixes it may
// touch and the operations it may perform under each. The zero of
// everything is deny: an identity without an entry, a key under no
// listed prefix, an operation not listed. An ACL is immutable and safe for
// concurrent use.
//
// The file form (YAML) maps identity → key prefix → operations:
//
//	TENANT_A:                     # every user of account TENANT_A ...
//	  "orders/": [acquire, release, get, list]
//	TENANT_A/bob:                 # ... except bob, who has his own entry
//	  "orders/bob/": [acquire, release, get]
//	OBSERVER:
//	  "": [get, list]             # "" is every key
//	"*":                          # any other authenticated identity
//	  "public/": [get]
//
// The entry that applies is the most specific one: the identity itself
// ("ACCOUNT/user"), else its account ("ACCOUNT"), else "*". Entries never
// combine, so a user's entry can narrow its account's. Requests without
// an identity use only the entry "" (quoted empty key), never "*".
type ACL struct {
	entries map[string][]aclRule
}

type aclRule struct {
	prefix string
	ops    []Op
}

// ErrACL marks every error of an access list file.
var ErrACL = errors.New("lockservice: invalid access list")

// LoadACL reads and parses the access list file at path.
func LoadACL(path string) (*ACL, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrACL, err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxACLBytes+1))
	if err != nil {
		return nil, fmt.Errorf("%w: read %s: %w", ErrACL, path, err)
	}
	a, err := ParseACL(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return a, nil
}

// ParseACL parses the YAML form documented on ACL. Unknown operations,
// identities or prefixes over the core limits, more than one document and
// anything but the identity → prefix → list shape are errors.
func ParseACL(data []byte) (*ACL, error) {
	if len(data) > MaxACLBytes {
		return nil, fmt.Errorf("%w: %d bytes, the limit is %d", ErrACL, len(data), MaxACLBytes)
	}
	var raw map[string]map[string][]string
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&raw); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%w: %w", ErrACL, err)
	}
	var extra any
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%w: more than one YAML document", ErrACL)
	}
	a := &ACL{entries: make(map[string][]aclRule, len(raw))}
	n := 0
	for id, prefixes := range raw {
		if err := core.ValidateIdentity(id); err != nil {
			return nil, fmt.Errorf("%w: identity %q: %w", ErrACL, id, err)
		}
		rules := make([]aclRule, 0, len(prefixes))
		for prefix, ops := range prefixes {
			if n++; n > MaxACLRules {
				return nil, fmt.Errorf("%w: more than %d rules", ErrACL, MaxACLRules)
			}
			if len(prefix) > core.MaxKeyLen {
				return nil, fmt.Errorf("%w: %s: prefix of %d bytes, keys have at most %d", ErrACL, id, len(prefix), core.MaxKeyLen)
			}
			r := aclRule{prefix: prefix}
			for _, op := range ops {
				if !slices.Contains(knownOps, Op(op)) {
					return nil, fmt.Errorf("%w: %s %q: unknown operation %q (want acquire, release, get or list)", ErrACL, id, prefix, op)
				}
				r.ops = append(r.ops, Op(op))
			}
			rules = append(rules, r)
		}
		a.entries[id] = rules
	}
	return a, nil
}

// entry is the rule list that applies to identity, or nil.
func (a *ACL) entry(identity string) []aclRule {
	if rules, ok := a.entries[identity]; ok || identity == ACLAnonymous {
		return rules
	}
	if account, _, ok := strings.Cut(identity, "/"); ok {
		if rules, ok := a.entries[account]; ok {
			return rules
		}
	}
	return a.entries[ACLAnyone]
}

// Allows reports whether identity may perform op on key. For OpList, key
// is the listed prefix: listing is allowed under a prefix the rule covers.
func (a *ACL) Allows(identity string, op Op, key string) bool {
	for _, r := range a.entry(identity) {
		if strings.HasPrefix(key, r.prefix) && slices.Contains(r.ops, op) {
			return true
		}
	}
	return false
}

// allowsSome reports whether identity may perform op on some key.
func (a *ACL) allowsSome(identity string, op Op) bool {
	for _, r := range a.entry(identity) {
		if slices.Contains(r.ops, op) {
			return true
		}
	}
	return false
}

// authorize is the one access check of the lock service: every operation
// calls it first, with its own Op and key. Without an access list
// (Config.ACL nil) everything is allowed, as in development; requests a
// transport marked with WithNodeAuthority are the cluster's own and skip
// it.
func (s *Service) authorize(ctx context.Context, op Op, key string) error {
	if s.cfg.ACL == nil || nodeAuthority(ctx) {
		return nil
	}
	id := IdentityFrom(ctx)
	if s.cfg.ACL.Allows(id, op, key) {
		return nil
	}
	s.cfg.Metrics.PermissionDenied.WithLabelValues(string(op)).Inc()
	return &PermissionError{Identity: id, Op: op, Key: key}
}
