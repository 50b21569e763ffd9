package lockservice

import "context"

// identityKey is the context key of the caller's identity.
type identityKey struct{}

// WithIdentity returns ctx carrying the identity the transport
// authenticated for the request (for NATS, the requester's account and
// user from the Nats-Request-Info header nats-server attaches). Nothing a
// client writes in a request body may set it.
func WithIdentity(ctx context.Context, identity string) context.Context {
	return context.WithValue(ctx, identityKey{}, identity)
}

// IdentityFrom returns the identity WithIdentity put in ctx ("" when the
// transport authenticated none: anonymous).
func IdentityFrom(ctx context.Context) string {
	id, _ := ctx.Value(identityKey{}).(string)
	return id
}

// nodeAuthorityKey is the context key of WithNodeAuthority.
type nodeAuthorityKey struct{}

// WithNodeAuthority marks ctx as a request of the cluster itself, not of
// a client: a follower releasing a grant whose reply it could not relay.
// The access list does not apply to it. Only a transport that has
// authenticated the sender as a ticketd node may set it (natsapi: on the
// forward subject, which only ticketd's own NATS user may publish to).
func WithNodeAuthority(ctx context.Context) context.Context {
	return context.WithValue(ctx, nodeAuthorityKey{}, true)
}

func nodeAuthority(ctx context.Context) bool {
	v, _ := ctx.Value(nodeAuthorityKey{}).(bool)
	return v
}
