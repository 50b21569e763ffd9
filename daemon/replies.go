package daemon

import (
	"strings"
	"time"

	"github.com/nats-io/jwt/v2"
	natsserver "github.com/nats-io/nats-server/v2/server"

	"github.com/ticketd/ticketd/transports/natsapi"
	"github.com/ticketd/ticketd/transports/protocol"
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

// importResponseThreshold is the least response_threshold the node's lock
// exports need: nats-server drops the response mapping of an imported
// request that has had no reply for that long, and a request may wait
// protocol.MaxTimeout (with a margin for the reply to travel, as
// examples/secure's allow_responses).
const importResponseThreshold = protocol.MaxTimeout + time.Minute

// coverWaitsInImports raises the response_threshold of the embedded
// server's exports of the lock subjects to importResponseThreshold where
// it is lower (nats-server's default is 2 minutes): below it, a request
// that crossed the import and waited longer could never be answered, its
// grant sent to a mapping that is gone, and the park sweep would end the
// wait as a vanished client's. An external server's exports are the
// operator's to set (docs/protocol.md §10).
func (d *Daemon) coverWaitsInImports() {
	if d.ns == nil {
		return
	}
	acc, err := d.ownAccount()
	if err != nil {
		d.log.Warn("cannot check the lock exports' response threshold", "err", err)
		return
	}
	az, err := d.ns.Accountz(&natsserver.AccountzOptions{Account: acc.GetName()})
	if err != nil || az.Account == nil {
		return
	}
	lock := d.lockSubjects()
	for _, e := range az.Account.Exports {
		subj := string(e.Subject)
		if e.Type != jwt.Service || !coversAny(subj, lock) {
			continue
		}
		was, err := acc.ServiceExportResponseThreshold(subj)
		if err != nil || was >= importResponseThreshold {
			continue
		}
		if err := acc.SetServiceExportResponseThreshold(subj, importResponseThreshold); err != nil {
			d.log.Warn("waits through the lock export end at its response_threshold: set response_threshold on the export",
				"export", subj, "response_threshold", was, "need", importResponseThreshold, "err", err)
			continue
		}
		d.log.Info("raised the lock export's response_threshold to cover the longest wait",
			"export", subj, "was", was, "now", importResponseThreshold)
	}
}
