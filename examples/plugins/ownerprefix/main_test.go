package main

import (
	"testing"

	"github.com/ticketd/ticketd/sdk/plugin"
)

var cases = []struct {
	key, owner string
	allow      bool
	reason     string
}{
	{"payments/invoice-7", "svc-payments-api-1", true, ""},
	{"payments/invoice-7", "svc-orders-1", false, `keys under "payments/" need an owner starting with "svc-payments-"`},
	{"payments/refunds/42", "svc-refunds-worker", true, ""},
	{"payments/refunds/42", "svc-payments-api-1", false, `keys under "payments/refunds/" need an owner starting with "svc-refunds-"`},
	{"inventory/sku-1", "", false, `keys under "inventory/" need an owner starting with "svc-inventory-"`},
	{"misc/anything", "", true, ""},
}

// The policy, run natively.
func TestRules(t *testing.T) {
	for _, c := range cases {
		v := validate(plugin.GrantRequest{Key: c.key, Owner: c.owner, LeaseMS: 1000})
		if v.Allow != c.allow || v.Reason != c.reason {
			t.Errorf("validate(%q, %q) = %+v, want allow=%v reason=%q", c.key, c.owner, v, c.allow, c.reason)
		}
	}
}

func TestCheckRulesRefusesBadTables(t *testing.T) {
	for _, in := range [][]rule{
		{{KeyPrefix: "a/", OwnerPrefix: ""}},
		{{KeyPrefix: "", OwnerPrefix: "x"}},
		{{KeyPrefix: "a/", OwnerPrefix: "x"}, {KeyPrefix: "a/", OwnerPrefix: "y"}},
	} {
		if _, err := checkRules(in); err == nil {
			t.Errorf("checkRules(%+v) succeeded", in)
		}
	}
	rs, err := checkRules(config)
	if err != nil || rs[0].KeyPrefix != "payments/refunds/" {
		t.Fatalf("checkRules(config) = %+v, %v; want the longest prefix first", rs, err)
	}
}
