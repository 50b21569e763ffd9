package control

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"
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
)

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

// Call posts body to path on the first of urls that is the leader,
// retrying not_leader and unavailable answers until ctx ends. Other
// refusals come back as *Error.
func Call(ctx context.Context, urls []string, path, credential string, body any) (Reply, error) {
	b, _ := json.Marshal(body)
	var last error = errors.New("no control URL given")
	deadline := time.Now().Add(TimeoutDefault * 3)
	for attempt := 0; time.Now().Before(deadline); attempt++ {
		for _, u := range urls {
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(u, "/")+path, bytes.NewReader(b))
			if err != nil {
				return Reply{}, fmt.Errorf("control: request: %w", err)
			}
			if credential != "" {
				req.Header.Set("Authorization", "Bearer "+credential)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				var op *net.OpError
				if errors.As(err, &op) && op.Op == "dial" {
					last = err // never reached the node: safe to try the next
					continue
				}
				// The request may have reached the leader and taken effect.
				return Reply{}, &Error{Code: CodeIndeterminate, Message: fmt.Sprintf("%s: %v", u, err), Err: err}
			}
			data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				var rep Reply
				if err := json.Unmarshal(data, &rep); err != nil {
					return Reply{}, fmt.Errorf("control: reply: %w", err)
				}
				return rep, nil
			}
			var eb struct {
				Error *Error `json:"error"`
			}
			if json.Unmarshal(data, &eb) != nil || eb.Error == nil {
				last = fmt.Errorf("control %s: HTTP %d", u, resp.StatusCode)
				continue
			}
			if eb.Error.Code != CodeNotLeader && eb.Error.Code != CodeUnavailable {
				return Reply{}, eb.Error
			}
			last = eb.Error
		}
		select {
		case <-ctx.Done():
			return Reply{}, ctx.Err()
		case <-time.After(min(time.Duration(attempt+1)*100*time.Millisecond, time.Second)):
		}
	}
	return Reply{}, fmt.Errorf("control: no leader answered the control request: %w", last)
}
