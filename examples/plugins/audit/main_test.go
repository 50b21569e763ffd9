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
	{core.Release("k", 8), core.Result{Kind: core.ResultNotFound}, "lock.release_unknown", `{"key":"k","token":8}`},
	{core.Expire("k", 9), core.Result{Kind: core.ResultExpired, Existed: true}, "lock.expired", `{"key":"k","token":9}`},
	{core.Expire("k", 9), core.Result{Kind: core.ResultExpired}, "lock.expire_stale", `{"key":"k","token":9}`},
	{core.Command{Kind: core.KindControl}, core.Result{Kind: core.ResultNoop}, "command.applied", `{"kind":"control","result":"noop"}`},
}

// The mapping, run natively.
func TestEvents(t *testing.T) {
	for _, c := range cases {
		evs := events(plugin.Applied{
			Index: 1,
			Command: plugin.Command{Kind: c.cmd.Kind.String(), Key: c.cmd.Key, Owner: c.cmd.Owner,
				LeaseMS: c.cmd.LeaseMS, GrantedAtMS: c.cmd.GrantedAtMS, Token: c.cmd.Token},
			Result: plugin.Result{Kind: c.res.Kind.String(), Token: c.res.Token, Existed: c.res.Existed},
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
