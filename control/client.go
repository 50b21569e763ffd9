package control

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/ticketd/ticketd/core"
)

// Error is the error body of the control API.
type Error struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	Reason  string `json:"reason,omitempty"`
	Leader  uint64 `json:"leader,omitempty"`
	// Err is the transport error behind an indeterminate outcome (a
	// deadline, a dropped connection); it never travels on the wire.
	Err error `json:"-"`
}

// Unwrap returns the transport error, so errors.Is(err,
// context.DeadlineExceeded) holds for a call whose time ran out.
func (e *Error) Unwrap() error { return e.Err }

func (e *Error) Error() string {
	if e.Reason != "" {
		return fmt.Sprintf("%s (%s): %s", e.Code, e.Reason, e.Message)
	}
	return fmt.Sprintf("%s: %s", e.Code, e.Message)
}

// Control API error codes.
const (
	CodeUnauthorized = "unauthorized"
	CodeNotLeader    = "not_leader"
	CodeRejected     = "control_rejected"
	CodeInvalid      = "invalid_argument"
	CodeNotCaughtUp  = "not_caught_up"
	CodeUnavailable  = "unavailable"
	// CodeIndeterminate: the transition may have been applied; it is
	// never retried automatically (a retry of a consumed credential would
	// be refused and hide the first outcome). Check `ticketd admin members`.
	CodeIndeterminate = "indeterminate"
	// CodeTooManyAttempts: this source address failed to authenticate too
	// often; it is refused (HTTP 429) until it has waited.
	CodeTooManyAttempts = "too_many_attempts"
)

// failedAttempt reports whether e answers a wrong credential: what the
// per-source failure limit counts.
func (e *Error) failedAttempt() bool {
	return e.Code == CodeUnauthorized ||
		e.Code == CodeRejected && (e.Reason == string(core.ReasonCredentialUnknown) || e.Reason == string(core.ReasonCredentialReused))
}

// Member is one member in control replies.
type Member struct {
	NodeID      uint64 `json:"node_id"`
	Incarnation uint64 `json:"incarnation"`
	Address     string `json:"address"`
	Role        string `json:"role"`
}

// Reply is the body of a successful control request.
type Reply struct {
	Result      string   `json:"result"`
	NodeID      uint64   `json:"node_id,omitempty"`
	Incarnation uint64   `json:"incarnation,omitempty"`
	Credential  string   `json:"credential,omitempty"`
	Members     []Member `json:"members,omitempty"`
	// ClusterID is the cluster's ID (admission and replacement replies):
	// a joining node records it and binds its peer handshakes to it. 0
	// from a node of a cluster created before cluster IDs.
	ClusterID uint64 `json:"cluster_id,omitempty"`
	// FenceKey and FenceKeys (fence rotation): the current fence signing
	// public key and all those kept, oldest first, in the text form
	// fence.ParsePublicKey reads ("tfk1.…").
	FenceKey  string   `json:"fence_key,omitempty"`
	FenceKeys []string `json:"fence_keys,omitempty"`
}

// Request is the union of control request bodies; each endpoint reads the
// fields it needs and unknown fields are refused.
type Request struct {
	Credential  string `json:"credential,omitempty"`
	Address     string `json:"address,omitempty"`
	OldNodeID   uint64 `json:"old_node_id,omitempty"`
	NodeID      uint64 `json:"node_id,omitempty"`
	Incarnation uint64 `json:"incarnation,omitempty"`
}

// CallOption changes how Call reaches the control API.
type CallOption func(*http.Client)

// WithTLS makes Call verify https control URLs with cfg (RootCAs: the CA
// of the nodes' control certificates; Certificates: this client's, for a
// control API that requires mutual TLS).
func WithTLS(cfg *tls.Config) CallOption {
	return func(c *http.Client) {
		c.Transport = &http.Transport{TLSClientConfig: cfg, ForceAttemptHTTP2: false}
	}
}

// ErrInsecureURL: a plain http:// control URL that is not loopback; the
// credential would cross the network in clear.
var ErrInsecureURL = errors.New("control: plain http off loopback")

// checkURL accepts https URLs, and http URLs whose host is loopback (a
// control API off loopback serves only TLS anyway).
func checkURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return fmt.Errorf("control: %q is not a control URL: want https://host:port, or http:// to loopback", raw)
	}
	if u.Scheme == "https" {
		return nil
	}
	host := u.Hostname()
	if ip := net.ParseIP(host); host == "localhost" || (ip != nil && ip.IsLoopback()) {
		return nil
	}
	return fmt.Errorf("%w: %s would send the credential in clear: use https://%s with --control-tls-ca (the CA of the nodes' control certificates)",
		ErrInsecureURL, raw, u.Host)
}

// Call posts body to path on the first of urls that is the leader,
// retrying not_leader and unavailable answers until ctx ends. Other
// refusals come back as *Error.
func Call(ctx context.Context, urls []string, path, credential string, body any, opts ...CallOption) (Reply, error) {
	data, err := roundTrip(ctx, urls, path, credential, body, 1<<20, opts)
	if err != nil {
		return Reply{}, err
	}
	var rep Reply
	if err := json.Unmarshal(data, &rep); err != nil {
		return Reply{}, fmt.Errorf("control: reply: %w", err)
	}
	return rep, nil
}

// roundTrip posts body to path on the first of urls that is the leader
// and returns the body of its 200 answer, read up to limit bytes (more is
// an error). not_leader and unavailable answers and nodes it cannot dial
// are retried until ctx ends; other refusals come back as *Error, and a
// request that may have reached a node without an answer as
// indeterminate.
func roundTrip(ctx context.Context, urls []string, path, credential string, body any, limit int64, opts []CallOption) ([]byte, error) {
	for _, u := range urls {
		if err := checkURL(u); err != nil {
			return nil, err
		}
	}
	client := &http.Client{}
	for _, o := range opts {
		o(client)
	}
	b, _ := json.Marshal(body)
	var last error = errors.New("no control URL given")
	deadline := time.Now().Add(TimeoutDefault * 3)
	for attempt := 0; time.Now().Before(deadline); attempt++ {
		for _, u := range urls {
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(u, "/")+path, bytes.NewReader(b))
			if err != nil {
				return nil, fmt.Errorf("control: request: %w", err)
			}
			if credential != "" {
				req.Header.Set("Authorization", "Bearer "+credential)
			}
			resp, err := client.Do(req)
			if err != nil {
				var op *net.OpError
				if errors.As(err, &op) && op.Op == "dial" {
					last = err // never reached the node: safe to try the next
					continue
				}
				// The request may have reached the leader and taken effect.
				return nil, &Error{Code: CodeIndeterminate, Message: fmt.Sprintf("%s: %v", u, err), Err: err}
			}
			data, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				switch {
				case err != nil:
					return nil, fmt.Errorf("control: read reply from %s: %w", u, err)
				case int64(len(data)) > limit:
					return nil, fmt.Errorf("control: reply from %s is above %d bytes", u, limit)
				}
				return data, nil
			}
			var eb struct {
				Error *Error `json:"error"`
			}
			if json.Unmarshal(data, &eb) != nil || eb.Error == nil {
				last = fmt.Errorf("control %s: HTTP %d", u, resp.StatusCode)
				continue
			}
			if eb.Error.Code != CodeNotLeader && eb.Error.Code != CodeUnavailable {
				return nil, eb.Error
			}
			last = eb.Error
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("control: %w; last: %w", ctx.Err(), last)
		case <-time.After(min(time.Duration(attempt+1)*100*time.Millisecond, time.Second)):
		}
	}
	return nil, fmt.Errorf("control: no leader answered the control request: %w", last)
}
