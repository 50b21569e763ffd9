package daemon

import (
	"fmt"
	"slices"
	"strings"

	"github.com/nats-io/jwt/v2"
	natsserver "github.com/nats-io/nats-server/v2/server"

	"github.com/ticketd/ticketd/transports/natsapi"
	"github.com/ticketd/ticketd/transports/protocol"
)

// Who is asking comes from the Nats-Request-Info header, which nats-server
// writes only on a request that crosses a service import and otherwise
// passes on as the client wrote it (transports/natsapi/identity.go). It
// names the requester only if nobody but ticketd can publish inside
// ticketd's account: then a request there either crossed an import or is
// ticketd's own. identityTrust decides, once the NATS connection is up,
// whether that holds; the identity settings (Config.IdentitySettings)
// start only where it does.

// identityTrust decides whether requests' Nats-Request-Info can be
// trusted. With the embedded server it inspects the server's own
// configuration; an external one it cannot inspect, and trusts it only on
// the operator's word (NATSTrustRequestInfo, which Validate requires
// there for the identity settings). It returns an error when an identity
// setting is in use and the header could be forged, saying what to
// configure.
func (d *Daemon) identityTrust() (natsapi.IdentityTrust, error) {
	uses := d.cfg.IdentitySettings()
	if d.ns == nil {
		if !d.cfg.NATSTrustRequestInfo {
			d.warnSharedShares("nats-url without nats-trust-request-info")
		}
		return natsapi.IdentityTrust{Trusted: d.cfg.NATSTrustRequestInfo}, nil
	}
	acc, err := d.ownAccount()
	if err != nil {
		return natsapi.IdentityTrust{}, fmt.Errorf("daemon: identities: %w", err)
	}
	var opts *natsserver.Options
	if d.cfg.NATSConfig != "" {
		if opts, err = d.embeddedNATSOptions(); err != nil {
			return natsapi.IdentityTrust{}, err
		}
	}
	problems := d.identityProblems(acc.GetName(), opts)
	if len(problems) == 0 {
		return natsapi.IdentityTrust{Trusted: true, OwnAccount: acc.GetName()}, nil
	}
	if len(uses) > 0 {
		return natsapi.IdentityTrust{}, configErr("%s %s, but in the embedded NATS server any client can write the Nats-Request-Info header: %s "+
			"(ticketd's account must hold only ticketd's user and export the lock subjects, ticketd.v1.lock.>, as a service that tenant accounts import: examples/secure)",
			strings.Join(uses, ", "), needIdentities(len(uses)), strings.Join(problems, "; "))
	}
	d.log.Debug("requests are anonymous: identities could be forged", "why", strings.Join(problems, "; "))
	d.warnSharedShares(strings.Join(problems, "; "))
	return natsapi.IdentityTrust{}, nil
}

// warnSharedShares says, once at start, that the fair shares the operator
// set are one share for all clients together: identities are not believed
// here (why).
func (d *Daemon) warnSharedShares(why string) {
	if tuned := d.cfg.TunedShares(); len(tuned) > 0 {
		d.log.Warn("every request is anonymous here, so the per-identity shares are one share for all clients together",
			"settings", strings.Join(tuned, ","), "why", why)
	}
}

// identityProblems lists what lets a client other than ticketd publish
// inside account own of the embedded server (configured by opts; nil for
// the open server of the nats-* settings), or leaves the lock subjects
// unreachable through an import. None: a Nats-Request-Info header on a
// request that crossed an import was written by the server.
func (d *Daemon) identityProblems(own string, opts *natsserver.Options) []string {
	if opts == nil || own == natsserver.DEFAULT_GLOBAL_ACCOUNT {
		return []string{"it has no accounts, so every client shares ticketd's"}
	}
	var out []string
	if len(opts.TrustedOperators) > 0 || len(opts.TrustedKeys) > 0 {
		out = append(out, "its accounts come from JWTs (operator mode), so ticketd cannot see who else is in its account")
	}
	if opts.AuthCallout != nil {
		out = append(out, "an auth callout decides which account a client lands in")
	}
	users := usersIn(opts, own)
	if len(users) > 1 {
		out = append(out, fmt.Sprintf("account %s holds %d users (%s): any but ticketd's own could write the header", own, len(users), strings.Join(users, ", ")))
	}
	for _, nu := range []struct{ setting, user string }{
		{"no_auth_user", opts.NoAuthUser}, {"websocket no_auth_user", opts.Websocket.NoAuthUser}, {"mqtt no_auth_user", opts.MQTT.NoAuthUser},
	} {
		if nu.user != "" && slices.Contains(users, nu.user) {
			out = append(out, fmt.Sprintf("%s %s puts clients without credentials in account %s", nu.setting, nu.user, own))
		}
	}
	if opts.LeafNode.Account == own || len(usersOf(opts.LeafNode.Users, nil, own)) > 0 {
		out = append(out, fmt.Sprintf("leaf node connections land in account %s", own))
	}
	for _, r := range opts.LeafNode.Remotes {
		if r.LocalAccount == own {
			out = append(out, fmt.Sprintf("a leaf node remote binds account %s", own))
			break
		}
	}
	return append(out, d.exportProblems(own)...)
}

// exportProblems checks account own's exports and imports: the lock
// subjects exported as a service that some account imports, the forward
// subjects not exported at all, and no other account's stream imported
// onto ticketd's subjects.
func (d *Daemon) exportProblems(own string) []string {
	az, err := d.ns.Accountz(&natsserver.AccountzOptions{Account: own})
	if err != nil {
		return []string{fmt.Sprintf("its exports cannot be read: %v", err)}
	}
	if az.Account == nil {
		return []string{fmt.Sprintf("account %s is not on the NATS server", own)}
	}
	lock := d.lockSubjects()
	var out []string
	// A stream imported from another account is published inside
	// ticketd's: onto the forward subjects, that account could write the
	// identity and the lost-reply mark a follower writes.
	for _, im := range az.Account.Imports {
		if im.Type != jwt.Stream {
			continue
		}
		local := string(im.LocalSubject.ToSubject())
		if local == "" {
			local = string(im.Subject)
		}
		if natsserver.SubjectsCollide(local, ticketdSubjects) {
			out = append(out, fmt.Sprintf("account %s imports the stream %s of account %s as %s, which reaches %s (that account would publish on the followers' forward subjects, %s): import it under other subjects",
				own, im.Subject, im.Account, local, ticketdSubjects, forwardSubjects))
		}
	}
	exported := false
	for _, e := range az.Account.Exports {
		subj := string(e.Subject)
		// An export reaching a forward subject (of any group) lets a tenant
		// write the identity a follower passes to the leader.
		if natsserver.SubjectsCollide(subj, forwardSubjects) {
			out = append(out, fmt.Sprintf("account %s exports %s, which holds the followers' forward subjects (%s): export %s instead", own, subj, forwardSubjects, lock[0]))
		}
		if e.Type == jwt.Service && coversAny(subj, lock) {
			exported = true
		}
	}
	switch {
	case !exported:
		out = append(out, fmt.Sprintf("account %s does not export the lock subjects (%s) as a service", own, strings.Join(lock, " or ")))
	case !d.lockServiceImported(own, lock):
		out = append(out, fmt.Sprintf("no account imports the lock subjects from account %s", own))
	}
	return out
}

// forwardSubjects holds every follower's forward subject
// (protocol.Partition.ForwardSubject), of every group.
const forwardSubjects = protocol.SubjectPrefix + ".fwd.>"

// ticketdSubjects holds every subject of ticketd's.
const ticketdSubjects = protocol.SubjectPrefix + ".>"

// lockSubjects are the subjects through which clients reach this node's
// lock service, as wildcards: its own (ticketd.v1.lock.> or, in a
// partitioned deployment, its group's), and there also the keyed subjects
// that the partition mapping of ticketd's account sends to the groups.
func (d *Daemon) lockSubjects() []string {
	p := d.cfg.Partition()
	own := strings.TrimSuffix(p.LockSubject("acquire"), "acquire") + ">"
	if !p.Partitioned() {
		return []string{own}
	}
	return []string{own, protocol.SubjectKeyedPrefix + ".*.lock.>"}
}

// coversAny tells whether the export or import subject subj reaches an
// acquire on one of lock's subjects.
func coversAny(subj string, lock []string) bool {
	for _, l := range lock {
		if natsserver.SubjectsCollide(subj, strings.TrimSuffix(l, ">")+"acquire") {
			return true
		}
	}
	return false
}

// lockServiceImported tells whether another account of the embedded server
// imports one of lock's acquire subjects from account own as a service.
func (d *Daemon) lockServiceImported(own string, lock []string) bool {
	all, err := d.ns.Accountz(&natsserver.AccountzOptions{})
	if err != nil {
		return false
	}
	for _, name := range all.Accounts {
		if name == own {
			continue
		}
		az, err := d.ns.Accountz(&natsserver.AccountzOptions{Account: name})
		if err != nil || az.Account == nil {
			continue
		}
		for _, im := range az.Account.Imports {
			if im.Type == jwt.Service && im.Account == own && !im.Invalid && coversAny(string(im.Subject), lock) {
				return true
			}
		}
	}
	return false
}

// usersIn names the users and nkeys of opts in account own.
func usersIn(opts *natsserver.Options, own string) []string {
	return usersOf(opts.Users, opts.Nkeys, own)
}

func usersOf(users []*natsserver.User, nkeys []*natsserver.NkeyUser, own string) []string {
	var out []string
	for _, u := range users {
		if u.Account != nil && u.Account.GetName() == own {
			out = append(out, u.Username)
		}
	}
	for _, u := range nkeys {
		if u.Account != nil && u.Account.GetName() == own {
			out = append(out, u.Nkey)
		}
	}
	return out
}
