// Command ownerprefix is a ticketd policy plugin: a Grant for a key under a
// configured key prefix is allowed only when its owner starts with the
// owner prefix configured for it. Keys under no configured prefix are
// allowed. When several key prefixes match, the longest one decides.
//
// The rules are the rules table below, compiled into the module, so they
// are covered by its SHA-256: every node that loads the same module
// enforces the same rules.
//
// Build:
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o ownerprefix.wasm .
package main

import (
	"sort"
	"strconv"
	"strings"

	"github.com/ticketd/ticketd/sdk/plugin"
)

// rule says: keys starting with KeyPrefix need owners starting with
// OwnerPrefix.
type rule struct {
	KeyPrefix   string
	OwnerPrefix string
}

// config is the policy. Edit and rebuild; the module's SHA-256 changes.
var config = []rule{
	{KeyPrefix: "payments/", OwnerPrefix: "svc-payments-"},
	{KeyPrefix: "payments/refunds/", OwnerPrefix: "svc-refunds-"},
	{KeyPrefix: "inventory/", OwnerPrefix: "svc-inventory-"},
}

// rules is config checked and sorted by descending key prefix length, so
// the first match is the longest.
var rules []rule

func main() {}

func init() {
	rs, err := checkRules(config)
	if err != nil {
		// A broken table must not become an allow-all policy: trap at
		// initialisation so the host refuses to load the module.
		panic(err)
	}
	rules = rs
	plugin.HandleValidateGrant(validate)
}

type ruleError string

func (e ruleError) Error() string { return "ownerprefix: " + string(e) }

func checkRules(in []rule) ([]rule, error) {
	rs := append([]rule(nil), in...)
	seen := make(map[string]bool, len(rs))
	for _, r := range rs {
		if r.KeyPrefix == "" || r.OwnerPrefix == "" {
			return nil, ruleError("empty prefix in rule for " + strconv.Quote(r.KeyPrefix))
		}
		if seen[r.KeyPrefix] {
			return nil, ruleError("key prefix " + strconv.Quote(r.KeyPrefix) + " twice")
		}
		seen[r.KeyPrefix] = true
	}
	sort.SliceStable(rs, func(i, j int) bool { return len(rs[i].KeyPrefix) > len(rs[j].KeyPrefix) })
	return rs, nil
}

func validate(r plugin.GrantRequest) plugin.Verdict {
	for _, rl := range rules {
		if !strings.HasPrefix(r.Key, rl.KeyPrefix) {
			continue
		}
		if strings.HasPrefix(r.Owner, rl.OwnerPrefix) {
			return plugin.Allow()
		}
		return plugin.Deny("keys under " + strconv.Quote(rl.KeyPrefix) + " need an owner starting with " + strconv.Quote(rl.OwnerPrefix))
	}
	return plugin.Allow()
}
