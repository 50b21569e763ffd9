// Command audit is a ticketd audit plugin: it turns every applied lock
// command into one event.
//
//	grant   + granted        lock.granted          {key, owner, token, lease_ms, granted_at_ms}
//	grant   + grant_rejected lock.grant_rejected   {key, owner, held_token}
//	release + released       lock.released         {key, token}
//	settle  + released       lock.released         {key, token}  (the result's token)
//	release + not_found      lock.release_unknown  {key, token}
//	expire  + expired        lock.expired          {key, token}   (a lock was removed)
//	expire  + expired        lock.expire_stale     {key, token}   (nothing was removed)
//	grant   + limit_mismatch lock.limit_mismatch   {key, owner, limit, held_limit}
//	anything else            command.applied       {kind, result}
//
// An event of a semaphore holder or a shared hold also names its kind:
// "limit" (2..1024) or "mode": "shared" after the fields above (ABI
// version 2; a mutex's events are as they always were): a release and a
// settle of one holder give the same event.
// The host stamps each event with the log index and the plugin name.
//
// Build:
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o audit.wasm .
package main

import "github.com/ticketd/ticketd/sdk/plugin"

func main() {}

func init() { plugin.HandleOnApplied(events) }

// events maps one applied command to its event. Data is plugin.Fields: an
// ordered object that the SDK encodes without reflection.
func events(a plugin.Applied) []plugin.Event {
	c, r := a.Command, a.Result
	keyToken := withKind(plugin.Fields{{Name: "key", Value: c.Key}, {Name: "token", Value: c.Token}}, c)
	var ev plugin.Event
	switch {
	case c.Kind == plugin.KindGrant && r.Kind == plugin.ResultGranted:
		ev = plugin.Event{Type: "lock.granted", Data: withKind(plugin.Fields{
			{Name: "key", Value: c.Key},
			{Name: "owner", Value: c.Owner},
			{Name: "token", Value: r.Token},
			{Name: "lease_ms", Value: c.LeaseMS},
			{Name: "granted_at_ms", Value: c.GrantedAtMS},
		}, c)}
	case c.Kind == plugin.KindGrant && r.Kind == plugin.ResultGrantRejected:
		ev = plugin.Event{Type: "lock.grant_rejected", Data: withKind(plugin.Fields{
			{Name: "key", Value: c.Key},
			{Name: "owner", Value: c.Owner},
			{Name: "held_token", Value: r.Token},
		}, c)}
	case c.Kind == plugin.KindGrant && r.Kind == plugin.ResultLimitMismatch:
		ev = plugin.Event{Type: "lock.limit_mismatch", Data: plugin.Fields{
			{Name: "key", Value: c.Key},
			{Name: "owner", Value: c.Owner},
			{Name: "limit", Value: c.Limit},
			{Name: "held_limit", Value: r.Limit},
		}}
	case c.Kind == plugin.KindRelease && r.Kind == plugin.ResultReleased:
		ev = plugin.Event{Type: "lock.released", Data: keyToken}
	case c.Kind == plugin.KindSettle && r.Kind == plugin.ResultReleased:
		// A settle carries no token; the released one is in the result.
		ev = plugin.Event{Type: "lock.released", Data: withKind(plugin.Fields{
			{Name: "key", Value: c.Key},
			{Name: "token", Value: r.Token},
		}, c)}
	case c.Kind == plugin.KindRelease && r.Kind == plugin.ResultNotFound:
		ev = plugin.Event{Type: "lock.release_unknown", Data: keyToken}
	case c.Kind == plugin.KindExpire && r.Kind == plugin.ResultExpired && r.Existed:
		ev = plugin.Event{Type: "lock.expired", Data: keyToken}
	case c.Kind == plugin.KindExpire && r.Kind == plugin.ResultExpired:
		ev = plugin.Event{Type: "lock.expire_stale", Data: keyToken}
	default:
		ev = plugin.Event{Type: "command.applied", Data: plugin.Fields{
			{Name: "kind", Value: c.Kind},
			{Name: "result", Value: r.Kind},
		}}
	}
	return []plugin.Event{ev}
}

// withKind adds the kind of a semaphore slot or a shared hold to f.
func withKind(f plugin.Fields, c plugin.Command) plugin.Fields {
	if c.Limit > 1 {
		f = append(f, plugin.Field{Name: "limit", Value: c.Limit})
	}
	if c.Mode == plugin.ModeShared {
		f = append(f, plugin.Field{Name: "mode", Value: c.Mode})
	}
	return f
}
