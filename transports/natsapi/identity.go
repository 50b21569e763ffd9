package natsapi

import (
	"encoding/json"
	"strings"

	"github.com/nats-io/nats.go"
)

// Who is asking (docs/protocol.md §10).
//
// nats-server writes the Nats-Request-Info header on a request that
// crosses a service import: the requester's account, and its user when
// the import shares it (`share: true`). It replaces any header of that
// name the client wrote, so on a request that came through an import the
// identity is the server's word. The identity is "ACCOUNT", or
// "ACCOUNT/user" when the user is known.
//
// Anywhere else nats-server passes the header on as the client wrote it
// (server/client.go, processServiceImport is the only place that sets it
// for a client): on an open NATS, in an account without imports, or from a
// client inside ticketd's own account, `{"acc":"TENANT_A"}` is whatever its
// publisher claims. So a header counts only where the node was told it can
// (IdentityTrust.Trusted: the daemon checked the embedded server's accounts
// at start, or the operator vouched for an external server), and only on a
// request that shows it crossed an import: its reply subject is the one
// nats-server gives every imported request (_R_.…, behind a gateway's
// _GR_.… prefix), and the account it names is not ticketd's own (no import
// leads from an account into itself). Everything else is anonymous.
//
// A follower forwards the identity it read to the leader in
// HeaderIdentity on the forward subject, which only ticketd's user can
// publish to (the daemon refuses to start with an identity check when
// ticketd's account exports it); the leader reads the identity there from
// HeaderIdentity only, and on the client subjects from Nats-Request-Info
// only, so a client writing HeaderIdentity itself changes nothing.
const (
	// HeaderRequestInfo is nats-server's ClientInfoHdr.
	HeaderRequestInfo = "Nats-Request-Info"
	// HeaderIdentity carries the identity from a follower to the leader.
	HeaderIdentity = "Ticketd-Identity"
	// HeaderLostReply marks a follower's release of a grant whose reply it
	// could not relay: the cluster's own request, not a client's, so the
	// access list does not apply (lockservice.WithNodeAuthority).
	HeaderLostReply = "Ticketd-Lost-Reply"
)

// Reply subject prefixes nats-server writes: every request that crosses a
// service import gets a reply subject of the exporting account's own
// (server/accounts.go, newServiceReply), and one that crosses a gateway
// carries "_GR_.<cluster hash>.<server hash>." before it.
const (
	importReplyPrefix  = "_R_."
	gatewayReplyPrefix = "_GR_."
	gatewayHashLen     = 6
)

// IdentityTrust says whether the Nats-Request-Info header of a client
// request can name who is asking.
type IdentityTrust struct {
	// Trusted: nobody but ticketd can publish inside ticketd's account, so
	// a header on a request that crossed an import was written by the
	// server. False: every client request is anonymous.
	Trusted bool
	// OwnAccount is ticketd's own NATS account when known ("" for an
	// external server): a header naming it did not cross an import.
	OwnAccount string
}

// requestInfo is the part of nats-server's ClientInfo that names the
// requester.
type requestInfo struct {
	Account string `json:"acc"`
	User    string `json:"user"`
}

// clientIdentity is the identity of a request on a client subject with
// header h and reply subject reply ("" when anonymous). ok is false when
// the request must be refused: it crossed an import, where nats-server
// always writes one Nats-Request-Info, yet no single readable one is
// there. The requester's header block hid it (an empty line, a line
// nats.go cannot parse, or a bare CR before the server's line: nats.go
// stops or skips there, nats-server does not), and serving such a request
// as anonymous would let a tenant shed its identity, leaving its
// per-identity limits for the anonymous share and taking what an access
// list grants "".
func (t IdentityTrust) clientIdentity(h nats.Header, reply string) (id string, ok bool) {
	if !t.Trusted || !crossedImport(reply) {
		return "", true
	}
	id = identityOf(h)
	if id == "" {
		return "", false
	}
	if t.OwnAccount != "" && (id == t.OwnAccount || strings.HasPrefix(id, t.OwnAccount+"/")) {
		return "", true
	}
	return id, true
}

// forwardedIdentity is the identity a follower passed on the forward
// subject ("" when anonymous, or when identities are not trusted: then
// anyone who can publish there could have written it).
func (t IdentityTrust) forwardedIdentity(h nats.Header) string {
	if !t.Trusted {
		return ""
	}
	return h.Get(HeaderIdentity)
}

// crossedImport tells whether reply is a reply subject nats-server wrote
// for a request that crossed a service import.
func crossedImport(reply string) bool {
	if rest, ok := strings.CutPrefix(reply, gatewayReplyPrefix); ok {
		// _GR_.<cluster hash>.<server hash>.<reply>
		skip := 2 * (gatewayHashLen + 1)
		if len(rest) <= skip {
			return false
		}
		reply = rest[skip:]
	}
	return strings.HasPrefix(reply, importReplyPrefix)
}

// identityOf reads the identity in a Nats-Request-Info header ("" when
// there is none, or it does not parse: anonymous). It does not say whether
// the header can be believed: clientIdentity does.
//
// More than one such header is none: nats-server leaves exactly one, its
// own, on a request that crossed an import; a second one is a client's
// that got past it (headerguard.go).
func identityOf(h nats.Header) string {
	vs := h.Values(HeaderRequestInfo)
	if len(vs) != 1 || vs[0] == "" {
		return ""
	}
	var ri requestInfo
	if err := json.Unmarshal([]byte(vs[0]), &ri); err != nil || ri.Account == "" {
		return ""
	}
	if ri.User != "" {
		return ri.Account + "/" + ri.User
	}
	return ri.Account
}

// forwardHeader is the header a follower sends with a forwarded request:
// the client's headers, with HeaderIdentity set to the identity the
// follower read (never the one a client may have written) and
// HeaderLostReply removed.
func forwardHeader(h nats.Header, identity string) nats.Header {
	out := make(nats.Header, len(h)+1)
	for k, v := range h {
		out[k] = append([]string(nil), v...)
	}
	out.Del(HeaderLostReply)
	if identity == "" {
		out.Del(HeaderIdentity)
	} else {
		out.Set(HeaderIdentity, identity)
	}
	return out
}
