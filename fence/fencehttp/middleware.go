package fencehttp

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"

	"github.com/ticketd/ticketd/fence"
)

// Header carries a request's fence.
const Header = "Ticketd-Fence"

// KeyFunc returns the lock key that protects what r touches; an error
// refuses r with 400 fence_invalid_argument and the error's text.
type KeyFunc func(r *http.Request) (string, error)

// Option configures Middleware.
type Option func(*config)

type config struct {
	allowUnfenced bool
	keyOf         KeyFunc
	log           *slog.Logger
}

// AllowUnfenced lets requests without the header through to the handler,
// with no fence in their context (for routes that read, or a migration
// while clients start sending fences). By default they get 428.
func AllowUnfenced() Option { return func(c *config) { c.allowUnfenced = true } }

// WithKey makes the middleware refuse (403 fence_wrong_key) a fence for
// another lock key than keyOf(r): without it, the holder of any lock of
// the cluster could write anything the middleware guards.
func WithKey(keyOf KeyFunc) Option { return func(c *config) { c.keyOf = keyOf } }

// WithLogger sets where failures of the Store are logged (at error
// level; refusals are the client's business and are not logged). The
// default is slog.Default().
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.log = l } }

type ctxKey struct{}

// FromContext returns the verified fence of the request whose context
// ctx is, and false if the request carried none (AllowUnfenced).
func FromContext(ctx context.Context) (fence.Fence, bool) {
	f, ok := ctx.Value(ctxKey{}).(fence.Fence)
	return f, ok
}

// Middleware verifies each request's fence with v and, when store is not
// nil, advances store with its key and token before the handler runs,
// holding the key's lock until the handler returns. With a nil store it
// only verifies: the handler must advance in the transaction of its
// write (fencepg.Advance) and answer a refusal with WriteError.
func Middleware(v *fence.Verifier, store fence.Store, opts ...Option) func(http.Handler) http.Handler {
	if v == nil {
		panic("fencehttp: Middleware needs a Verifier")
	}
	cfg := config{log: slog.Default()}
	for _, o := range opts {
		o(&cfg)
	}
	locks := newKeyLocks()
	return func(next http.Handler) http.Handler {
		return &handler{v: v, store: store, cfg: cfg, locks: locks, next: next}
	}
}

type handler struct {
	v     *fence.Verifier
	store fence.Store // nil: verify only
	cfg   config
	locks *keyLocks
	next  http.Handler
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	values := r.Header.Values(Header)
	switch {
	case len(values) == 0 && h.cfg.allowUnfenced:
		h.next.ServeHTTP(w, r)
		return
	case len(values) == 0:
		WriteError(w, &fence.Error{Code: fence.CodeMissing, Msg: "this request must carry its lock holder's fence in the " + Header + " header"})
		return
	case len(values) > 1:
		WriteError(w, &fence.Error{Code: fence.CodeMalformed, Msg: "the request carries more than one " + Header + " header"})
		return
	}
	f, err := h.v.Verify(values[0])
	if err != nil {
		WriteError(w, err)
		return
	}
	if h.cfg.keyOf != nil {
		want, err := h.cfg.keyOf(r)
		if err != nil {
			WriteError(w, &fence.Error{Code: fence.CodeInvalidArgument, Msg: err.Error()})
			return
		}
		if f.Key != want {
			WriteError(w, &fence.Error{Code: fence.CodeWrongKey, Msg: "the fence is for key " + quote(f.Key) + ", this request needs one for key " + quote(want)})
			return
		}
	}
	ctx := context.WithValue(r.Context(), ctxKey{}, f)
	if h.store != nil {
		unlock, err := h.locks.lock(ctx, f.Key)
		if err != nil {
			WriteError(w, &fence.Error{Code: fence.CodeUnavailable, Msg: "the request ended while waiting for an earlier request of key " + quote(f.Key) + ": " + err.Error()})
			return
		}
		defer unlock()
		if err := h.store.Advance(ctx, f.Key, f.Token); err != nil {
			if fence.CodeOf(err) == "" && ctx.Err() == nil {
				h.cfg.log.ErrorContext(ctx, "fencehttp: the token store failed", "key", f.Key, "token", f.Token, "err", err)
			}
			WriteError(w, err)
			return
		}
	}
	h.next.ServeHTTP(w, r.WithContext(ctx))
}

// body is the JSON of every refusal.
type body struct {
	Code    fence.Code `json:"code"`
	Message string     `json:"message"`
	Key     string     `json:"key,omitempty"`
	Token   uint64     `json:"token,omitempty"`
	Current uint64     `json:"current,omitempty"`
}

// Status is the HTTP status of a fence error's code.
func Status(code fence.Code) int {
	switch code {
	case fence.CodeMalformed, fence.CodeUnsupportedVersion, fence.CodeInvalidArgument:
		return http.StatusBadRequest
	case fence.CodeUnknownKey, fence.CodeForged, fence.CodeWrongCluster, fence.CodeWrongKey:
		return http.StatusForbidden
	case fence.CodeStale:
		return http.StatusConflict
	case fence.CodeMissing:
		return http.StatusPreconditionRequired
	default: // CodeStoreFull, CodeUnavailable, and errors without a code
		return http.StatusServiceUnavailable
	}
}

// WriteError answers a refused request: the status of err's code (503
// fence_unavailable for an error without one, whose text is not shown:
// it may describe the store's internals) and a JSON body.
func WriteError(w http.ResponseWriter, err error) {
	b := body{Code: fence.CodeUnavailable, Message: "the fence check could not be made; retry later"}
	var fe *fence.Error
	if errors.As(err, &fe) {
		b = body{Code: fe.Code, Message: fe.Msg, Key: fe.Key, Token: fe.Token, Current: fe.Current}
	} else if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		b.Message = "the request ended before the fence check: " + err.Error()
	}
	out, _ := json.Marshal(b)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(Status(b.Code))
	w.Write(append(out, '\n'))
}

func quote(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}
