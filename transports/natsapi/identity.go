package natsapi

import (
	"encoding/json"

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
// A request published inside ticketd's own account crosses no import: a
// header on it is whatever its publisher wrote. The deployment rule that
// makes this safe is that ticketd's account holds nobody but ticketd's own
// NATS user (examples/secure). On an open NATS (no accounts) any client can
// write the header, which is why an access list needs a secured NATS.
//
// A follower forwards the identity it read to the leader in
// HeaderIdentity on the forward subject, which only ticketd's user can
// publish to; the leader reads the identity there from HeaderIdentity only,
// and on the client subjects from Nats-Request-Info only, so a client
// writing HeaderIdentity itself changes nothing.
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

// requestInfo is the part of nats-server's ClientInfo that names the
// requester.
type requestInfo struct {
	Account string `json:"acc"`
	User    string `json:"user"`
}

// identityOf reads the identity nats-server attached to a client request
// ("" when there is none, or it does not parse: anonymous).
func identityOf(h nats.Header) string {
	v := h.Get(HeaderRequestInfo)
	if v == "" {
		return ""
	}
	var ri requestInfo
	if err := json.Unmarshal([]byte(v), &ri); err != nil || ri.Account == "" {
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
