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
