package control

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/ticketd/ticketd/core"
	"github.com/ticketd/ticketd/raftstore"
)

func hashCredential(s string) [32]byte { return sha256.Sum256([]byte(s)) }

// handlerFunc serves one endpoint with the decoded request.
type handlerFunc func(*http.Request, Request) (Reply, *Error)

// routes is the control API.
func (p *Plane) routes() *http.ServeMux {
	mux := http.NewServeMux()
	admin := func(h handlerFunc) http.HandlerFunc { return p.handler(true, true, h) }
	open := func(h handlerFunc) http.HandlerFunc { return p.handler(false, true, h) }
	mux.HandleFunc("POST /v1/bootstrap", admin(p.bootstrap))
	// Endpoints about members first record a static cluster's members
	// in the control state (static.go).
	mux.HandleFunc("POST /v1/join-credentials", admin(p.adopting(p.mintJoin)))
	mux.HandleFunc("POST /v1/join", open(p.join)) // authenticated by the join credential
	mux.HandleFunc("POST /v1/replacements", admin(p.adopting(p.prepareReplacement)))
	mux.HandleFunc("POST /v1/replacements/complete", admin(p.completeReplacement))
	mux.HandleFunc("POST /v1/replacements/abort", admin(p.abortReplacement))
	mux.HandleFunc("POST /v1/retire", admin(p.adopting(p.retire)))
	mux.HandleFunc("POST /v1/members", admin(p.adopting(p.members)))
	mux.HandleFunc("POST /v1/fence/rotate", admin(p.rotateFenceKey))
	// Answers only valid/invalid and checks no credential, so it is never
	// paced: a starting node always learns at once whether it was retired.
	mux.HandleFunc("POST /v1/identity", p.handler(false, false, p.identity))
	mux.HandleFunc("POST /v1/snapshot", p.snapshot) // admin; answers a backup file
	return mux
}

// ErrInsecureListen: a control listener off loopback without TLS.
var ErrInsecureListen = errors.New("control: a control API off loopback needs TLS")

// listen serves the control API on its own listener: over TLS when
// configured, with connections bounded per source and in all from accept
// on (limitListener), and timeouts on each; the TLS handshake must end
// within HandshakeTimeout (the server's shortest timeout).
func (p *Plane) listen() error {
	if p.cfg.TLS == nil && !IsLoopback(p.cfg.Listen) {
		return fmt.Errorf("%w: %s", ErrInsecureListen, p.cfg.Listen)
	}
	raw, err := net.Listen("tcp", p.cfg.Listen)
	if err != nil {
		return fmt.Errorf("control: listen: %w", err)
	}
	var ln net.Listener = &limitListener{Listener: raw, conns: p.conns}
	if p.cfg.TLS != nil {
		ln = tls.NewListener(ln, p.cfg.TLS)
	}
	p.ln = ln
	p.srv = &http.Server{
		Handler:           p.routes(),
		ReadHeaderTimeout: orDefault(p.cfg.HandshakeTimeout, HandshakeTimeoutDefault),
		ReadTimeout:       readTimeout,
		WriteTimeout:      writeTimeout,
		IdleTimeout:       idleTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
		ConnState:         trackState,
		ConnContext:       withConn,
		ErrorLog:          slog.NewLogLogger(p.log.Handler(), slog.LevelDebug),
	}
	go func() { _ = p.srv.Serve(ln) }()
	return nil
}

// IsLoopback reports whether a listen address binds loopback only
// ("localhost" or a loopback IP; an empty host is every interface).
func IsLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// writeJSON answers v with status.
func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// writeError answers e with the HTTP status its code maps to.
func writeError(w http.ResponseWriter, e *Error) {
	status := http.StatusConflict
	switch e.Code {
	case CodeTooManyAttempts:
		w.Header().Set("Retry-After", "1")
		status = http.StatusTooManyRequests
	case CodeUnauthorized:
		status = http.StatusUnauthorized
	case CodeNotLeader:
		status = http.StatusMisdirectedRequest
	case CodeInvalid:
		status = http.StatusBadRequest
	case CodeUnavailable:
		status = http.StatusServiceUnavailable
	}
	writeJSON(w, status, map[string]any{"error": e})
}

// admitted checks the control credential of an admin request in constant
// time; with no credential configured nothing is admitted.
func (p *Plane) admitted(r *http.Request) *Error {
	got := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
	want := hashCredential(p.cfg.Credential)
	have := hashCredential(got)
	if p.cfg.Credential == "" || subtle.ConstantTimeCompare(want[:], have[:]) != 1 {
		return &Error{Code: CodeUnauthorized, Message: "a valid control credential is required"}
	}
	return nil
}

// fail answers e. A wrong credential spends one of its source's
// attempts; once they are spent, it is answered too_many_attempts and
// the connection closed, so each further guess costs a new connection
// (and, over TLS, a handshake) besides FailureDelay.
func (p *Plane) fail(w http.ResponseWriter, r *http.Request, e *Error) {
	if e.failedAttempt() {
		source := sourceOf(r)
		if !p.failures.failed(source) {
			_, wait := p.failures.allowed(source)
			e = &Error{Code: CodeTooManyAttempts, Message: fmt.Sprintf("too many failed attempts from %s; retry in %v", source, wait.Round(time.Millisecond))}
			w.Header().Set("Connection", "close")
		}
	}
	writeError(w, e)
}

// decodeRequest reads a bounded body holding one Request (or nothing).
func decodeRequest(r *http.Request) (Request, *Error) {
	var req Request
	body, err := io.ReadAll(io.LimitReader(r.Body, MaxBody+1))
	if err != nil || len(body) > MaxBody {
		return req, &Error{Code: CodeInvalid, Message: "unreadable or oversize body"}
	}
	if len(bytes.TrimSpace(body)) > 0 {
		dec := json.NewDecoder(bytes.NewReader(body))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil {
			return req, &Error{Code: CodeInvalid, Message: fmt.Sprintf("bad JSON: %v", err)}
		}
	}
	return req, nil
}

// handler paces a source that has spent its failed attempts (endpoints
// that check a credential), authenticates (admin endpoints), decodes the
// body, refuses anything but the ready leader and maps an *Error to its
// HTTP status.
func (p *Plane) handler(needAdmin, paced bool, h handlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		// Such a source waits before its credential is looked at, right or
		// wrong; it is never refused for its past failures, so a guesser
		// cannot lock out whoever shares its address, and a correct
		// credential is always accepted.
		if paced && !p.pace(r) {
			return
		}
		if needAdmin {
			if e := p.admitted(r); e != nil {
				p.fail(w, r, e)
				return
			}
		}
		req, e := decodeRequest(r)
		if e != nil {
			writeError(w, e)
			return
		}
		serving(r)
		if !p.cfg.Leadership.IsLeader() {
			writeError(w, &Error{Code: CodeNotLeader, Message: "ask the leader", Leader: p.cfg.Node.Leader()})
			return
		}
		reply, cerr := h(r, req)
		if cerr != nil {
			p.fail(w, r, cerr)
			return
		}
		writeJSON(w, http.StatusOK, reply)
	}
}

// propose proposes a validated control command and maps its result.
func (p *Plane) propose(r *http.Request, cmd core.Command) (core.Result, *Error) {
	return p.proposeCtx(r.Context(), cmd)
}

// proposeCtx is propose within ctx.
func (p *Plane) proposeCtx(ctx context.Context, cmd core.Command) (core.Result, *Error) {
	if err := cmd.Validate(); err != nil {
		return core.Result{}, &Error{Code: CodeInvalid, Message: err.Error()}
	}
	ctx, cancel := context.WithTimeout(ctx, TimeoutDefault)
	defer cancel()
	a, err := p.cfg.Node.Propose(ctx, cmd)
	switch {
	case errors.Is(err, raftstore.ErrNotLeader):
		return core.Result{}, &Error{Code: CodeNotLeader, Message: err.Error(), Leader: p.cfg.Node.Leader()}
	case errors.Is(err, raftstore.ErrIndeterminate):
		return core.Result{}, &Error{Code: CodeIndeterminate, Message: err.Error()}
	case err != nil:
		// Rejected before raft took it (invalid, or the context was done).
		return core.Result{}, &Error{Code: CodeUnavailable, Message: err.Error()}
	}
	if a.Result.Kind == core.ResultControlRejected {
		return a.Result, &Error{Code: CodeRejected, Reason: string(a.Result.Reason), Message: "the replicated control state refused the transition"}
	}
	return a.Result, nil
}

// transition proposes cmd and answers with its result and the members.
func (p *Plane) transition(r *http.Request, cmd core.Command) (Reply, *Error) {
	res, cerr := p.propose(r, cmd)
	if cerr != nil {
		return Reply{}, cerr
	}
	return Reply{Result: res.Kind.String(), NodeID: res.NodeID, Incarnation: res.Incarnation, Members: p.Members(), ClusterID: p.cfg.ClusterID}, nil
}

func (p *Plane) bootstrap(r *http.Request, req Request) (Reply, *Error) {
	if p.cfg.BootstrapCredential == "" {
		return Reply{}, &Error{Code: CodeInvalid, Message: "this node was not started with a bootstrap credential"}
	}
	want, got := hashCredential(p.cfg.BootstrapCredential), hashCredential(req.Credential)
	if subtle.ConstantTimeCompare(want[:], got[:]) != 1 {
		return Reply{}, &Error{Code: CodeUnauthorized, Message: "wrong bootstrap credential"}
	}
	if p.cfg.ID != 1 || p.cfg.PeerAddr == "" {
		return Reply{}, &Error{Code: CodeInvalid, Message: "bootstrap runs on node 1 with a peer listener"}
	}
	var bootstrapped bool
	p.cfg.Node.View(func(m *core.Machine) { bootstrapped = m.Bootstrapped() })
	// Once bootstrapped, the replicated state itself refuses (and says so).
	if cs := p.cfg.Node.ConfState(); !bootstrapped && (len(cs.Voters) != 1 || cs.Voters[0] != 1 || len(cs.Learners) != 0) {
		// A store with other members (e.g. started from a static member
		// list) must not be taken over: reconcile would remove them.
		return Reply{}, &Error{Code: CodeInvalid, Message: fmt.Sprintf("bootstrap needs a fresh single-voter node; membership is %v", cs.Voters)}
	}
	res, cerr := p.propose(r, core.Bootstrap(got, p.advertisedPeer()))
	if cerr != nil {
		return Reply{}, cerr
	}
	if err := WriteIdentity(p.cfg.DataDir, Identity{NodeID: res.NodeID, Incarnation: res.Incarnation}); err != nil {
		return Reply{}, &Error{Code: CodeUnavailable, Message: err.Error()}
	}
	return Reply{Result: res.Kind.String(), NodeID: res.NodeID, Incarnation: res.Incarnation, Members: p.Members()}, nil
}

// advertisedPeer is the peer address bootstrap records for node 1: the
// configured one, or the bound one when the configuration asked for any
// free port.
func (p *Plane) advertisedPeer() string {
	if p.cfg.PeerListen != "" {
		if _, port, err := net.SplitHostPort(p.cfg.PeerListen); err == nil && port != "0" {
			return p.cfg.PeerListen
		}
	}
	return p.cfg.PeerAddr
}

func (p *Plane) mintJoin(r *http.Request, _ Request) (Reply, *Error) {
	var raw [32]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return Reply{}, &Error{Code: CodeUnavailable, Message: err.Error()}
	}
	cred := hex.EncodeToString(raw[:])
	res, cerr := p.propose(r, core.MintJoin(hashCredential(cred)))
	if cerr != nil {
		return Reply{}, cerr
	}
	return Reply{Result: res.Kind.String(), Credential: cred}, nil
}

// join admits a new member. Its credential is checked against the
// applied control state before anything is proposed, so a request with an
// unknown or used credential appends nothing to the log (Apply checks it
// again, in log order, for the request that races its own reuse).
func (p *Plane) join(r *http.Request, req Request) (Reply, *Error) {
	if req.Credential == "" {
		return Reply{}, &Error{Code: CodeUnauthorized, Message: "a join credential is required"}
	}
	hash := hashCredential(req.Credential)
	var st core.CredentialState
	p.cfg.Node.View(func(m *core.Machine) { st = m.JoinCredentialState(hash) })
	switch st {
	case core.CredentialMinted:
	case core.CredentialConsumed:
		return Reply{}, &Error{Code: CodeRejected, Reason: string(core.ReasonCredentialReused), Message: "the join credential was used already"}
	default:
		return Reply{}, &Error{Code: CodeRejected, Reason: string(core.ReasonCredentialUnknown), Message: "no such join credential"}
	}
	return p.transition(r, core.Admit(hash, req.Address))
}

func (p *Plane) prepareReplacement(r *http.Request, req Request) (Reply, *Error) {
	return p.transition(r, core.PrepareReplacement(req.OldNodeID, req.Address))
}

func (p *Plane) completeReplacement(r *http.Request, req Request) (Reply, *Error) {
	if !p.caughtUp(req.NodeID) {
		return Reply{}, &Error{Code: CodeNotCaughtUp, Message: fmt.Sprintf("node %d has not caught up with the log yet", req.NodeID)}
	}
	return p.transition(r, core.CompleteReplacement(req.OldNodeID, req.NodeID, req.Incarnation))
}

func (p *Plane) abortReplacement(r *http.Request, req Request) (Reply, *Error) {
	return p.transition(r, core.AbortReplacement(req.OldNodeID, req.NodeID, req.Incarnation))
}

func (p *Plane) retire(r *http.Request, req Request) (Reply, *Error) {
	return p.transition(r, core.Retire(req.NodeID, req.Incarnation))
}

func (p *Plane) members(*http.Request, Request) (Reply, *Error) {
	return Reply{Result: "members", Members: p.Members()}, nil
}

// identity tells a starting node whether its identity is current. It
// reveals nothing but valid or not.
func (p *Plane) identity(_ *http.Request, req Request) (Reply, *Error) {
	var err error
	p.cfg.Node.View(func(m *core.Machine) { err = m.CheckIdentity(req.NodeID, req.Incarnation) })
	if err != nil {
		return Reply{}, &Error{Code: CodeRejected, Reason: ReasonIdentityRefused, Message: err.Error()}
	}
	return Reply{Result: "identity_current", NodeID: req.NodeID, Incarnation: req.Incarnation}, nil
}
