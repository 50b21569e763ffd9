package main

import (
	"encoding/json"
	"testing"

	"github.com/ticketd/ticketd/core"
	"github.com/ticketd/ticketd/sdk/plugin"
)

var cases = []struct {
	cmd  core.Command
	res  core.Result
	typ  string
	data string
}{
	{core.Grant("k", "o", 1500, 77), core.Result{Kind: core.ResultGranted, Token: 9},
		"lock.granted", `{"key":"k","owner":"o","token":9,"lease_ms":1500,"granted_at_ms":77}`},
	{core.Grant("k", "o2", 1500, 78), core.Result{Kind: core.ResultGrantRejected, Token: 9},
		"lock.grant_rejected", `{"key":"k","owner":"o2","held_token":9}`},
	{core.Release("k", 9), core.Result{Kind: core.ResultReleased}, "lock.released", `{"key":"k","token":9}`},
	{core.Settle("k", "id", "r1", 5), core.Result{Kind: core.ResultReleased, Token: 9}, "lock.released", `{"key":"k","token":9}`},
	{core.Release("k", 8), core.Result{Kind: core.ResultNotFound}, "lock.release_unknown", `{"key":"k","token":8}`},
	{core.Expire("k", 9), core.Result{Kind: core.ResultExpired, Existed: true}, "lock.expired", `{"key":"k","token":9}`},
	{core.Expire("k", 9), core.Result{Kind: core.ResultExpired}, "lock.expire_stale", `{"key":"k","token":9}`},
	{core.Command{Kind: core.KindControl}, core.Result{Kind: core.ResultNoop}, "command.applied", `{"kind":"control","result":"noop"}`},
	{core.Grant("k", "o", 1500, 77).WithKind(4, core.ModeExclusive), core.Result{Kind: core.ResultGranted, Token: 9},
		"lock.granted", `{"key":"k","owner":"o","token":9,"lease_ms":1500,"granted_at_ms":77,"limit":4}`},
	{core.Grant("k", "o", 1500, 77).WithKind(0, core.ModeShared), core.Result{Kind: core.ResultGrantRejected, Token: 9},
		"lock.grant_rejected", `{"key":"k","owner":"o","held_token":9,"mode":"shared"}`},
	{core.Grant("k", "o", 1500, 77).WithKind(4, core.ModeExclusive), core.Result{Kind: core.ResultLimitMismatch, Limit: 1, Token: 9},
		"lock.limit_mismatch", `{"key":"k","owner":"o","limit":4,"held_limit":1}`},
	{holderKind(core.Release("k", 9), 4, core.ModeExclusive), core.Result{Kind: core.ResultReleased}, "lock.released", `{"key":"k","token":9,"limit":4}`},
	{holderKind(core.Expire("k", 9), 0, core.ModeShared), core.Result{Kind: core.ResultExpired, Existed: true}, "lock.expired", `{"key":"k","token":9,"mode":"shared"}`},
	{holderKind(core.Settle("k", "id", "r1", 5), 4, core.ModeExclusive), core.Result{Kind: core.ResultReleased, Token: 9}, "lock.released", `{"key":"k","token":9,"limit":4}`},
	{holderKind(core.Release("k", 9), 0, core.ModeShared), core.Result{Kind: core.ResultReleased}, "lock.released", `{"key":"k","token":9,"mode":"shared"}`},
	{holderKind(core.Settle("k", "id", "r1", 5), 0, core.ModeShared), core.Result{Kind: core.ResultReleased, Token: 9}, "lock.released", `{"key":"k","token":9,"mode":"shared"}`},
}

// holderKind is c as the audit publisher shows it to plugins: a release's
// or expiry's holder kind filled in.
func holderKind(c core.Command, limit uint32, mode core.Mode) core.Command {
	c.Limit, c.Mode = limit, mode
	return c
}

// The mapping, run natively.
func TestEvents(t *testing.T) {
	for _, c := range cases {
		evs := events(plugin.Applied{
			Index: 1,
			Command: plugin.Command{Kind: c.cmd.Kind.String(), Key: c.cmd.Key, Owner: c.cmd.Owner,
				LeaseMS: c.cmd.LeaseMS, GrantedAtMS: c.cmd.GrantedAtMS, Token: c.cmd.Token, Limit: c.cmd.Limit, Mode: c.cmd.Mode.String()},
			Result: plugin.Result{Kind: c.res.Kind.String(), Token: c.res.Token, Existed: c.res.Existed, Limit: c.res.Limit},
		})
		if len(evs) != 1 {
			t.Fatalf("%v/%v: %d events", c.cmd.Kind, c.res, len(evs))
		}
		data, err := json.Marshal(evs[0].Data)
		if err != nil || evs[0].Type != c.typ || string(data) != c.data {
			t.Errorf("%v/%v: %s %s %v; want %s %s", c.cmd.Kind, c.res, evs[0].Type, data, err, c.typ, c.data)
		}
	}
}
