package daemon

import (
	"strings"

	natsserver "github.com/nats-io/nats-server/v2/server"

	"github.com/ticketd/ticketd/transports/natsapi"
)

// responsePrefix starts every reply subject nats-server makes for a
// request that crossed a service import (its "_R_." response mapping).
const responsePrefix = "_R_."

// replyInterest tells the client service whether the requesters of parked
// waits are still there (natsapi fair.go), from the embedded server's own
// view, as watchInterest does for watch events. It is nil where that view
// is not the whole truth: an external server, gateways, subject mappings
// (or opts.KeepLeftWaits).
//
// A reply subject of the node's own account (a client in that account,
// or a follower forwarding) is alive while the account has interest in
// it. A request from another account crossed a service import: its reply
// subject is a response mapping "_R_.<server prefix>.<id>" in the node's
// account, which nats-server removes as soon as the requester's interest
// in its own reply subject goes (it unsubscribed, or its connection
// closed). Such a subject is alive while its mapping exists and the
// requester's account still has interest in the subject it maps to. A
// mapping this server does not hold (the requester connected to another
// server of the NATS cluster) cannot be judged here: it counts as alive.
func (d *Daemon) replyInterest(opts Options) natsapi.ReplyInterest {
	if d.ns == nil || d.ns.GatewayAddr() != nil || opts.KeepLeftWaits {
		return nil
	}
	acc, err := d.ownAccount()
	if err != nil {
		d.log.Warn("waits of vanished clients last until their wait_ms: no reply interest check", "err", err)
		return nil
	}
	// A subject mapping of the account may rewrite a reply subject.
	az, err := d.ns.Accountz(&natsserver.AccountzOptions{Account: acc.GetName()})
	if err != nil || az.Account == nil || len(az.Account.Mappings) > 0 {
		d.log.Info("waits of vanished clients last until their wait_ms: the NATS account maps subjects")
		return nil
	}
	r := &replyCheck{ns: d.ns, acc: acc}
	return r.alive
}

// replyCheck judges reply subjects for one account of the embedded
// server. Its alive is called from one goroutine at a time (natsapi's
// sweep), which alone uses local.
type replyCheck struct {
	ns  *natsserver.Server
	acc *natsserver.Account
	// local is this server's response prefix in acc ("_R_.xxxxx."), once
	// seen: it never changes for the life of the account.
	local string
}

func (r *replyCheck) alive(replies []string) []bool {
	out := make([]bool, len(replies))
	var responses map[string]natsserver.ExtImport
	for i, reply := range replies {
		if !strings.HasPrefix(reply, responsePrefix) {
			out[i] = r.acc.SubscriptionInterest(reply)
			continue
		}
		if responses == nil {
			responses = r.responses()
		}
		imp, ok := responses[reply]
		if !ok {
			out[i] = !r.isLocal(reply)
			continue
		}
		requester, err := r.ns.LookupAccount(imp.Account)
		out[i] = err != nil || requester.SubscriptionInterest(string(imp.Subject))
	}
	return out
}

// responses reads the account's response mappings (reply subject → the
// requester's account and reply subject) and learns the local prefix.
func (r *replyCheck) responses() map[string]natsserver.ExtImport {
	az, err := r.ns.Accountz(&natsserver.AccountzOptions{Account: r.acc.GetName()})
	if err != nil || az.Account == nil {
		return map[string]natsserver.ExtImport{}
	}
	for reply := range az.Account.Responses {
		if p := prefixOf(reply); p != "" {
			r.local = p
			break
		}
	}
	if az.Account.Responses == nil {
		return map[string]natsserver.ExtImport{}
	}
	return az.Account.Responses
}

// isLocal reports whether reply is a response mapping this server made
// (so its absence means it was removed). Without routes every one is.
func (r *replyCheck) isLocal(reply string) bool {
	if r.ns.NumRoutes() == 0 {
		return true
	}
	return r.local != "" && strings.HasPrefix(reply, r.local)
}

// prefixOf is "_R_.xxxxx." of a response reply subject "_R_.xxxxx.yyy".
func prefixOf(reply string) string {
	rest := strings.TrimPrefix(reply, responsePrefix)
	i := strings.IndexByte(rest, '.')
	if i <= 0 {
		return ""
	}
	return reply[:len(responsePrefix)+i+1]
}
