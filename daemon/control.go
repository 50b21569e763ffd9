package daemon

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"go.etcd.io/raft/v3/raftpb"
	"go.etcd.io/raft/v3/tracker"

	"github.com/ticketd/ticketd/core"
	"github.com/ticketd/ticketd/raftstore"
)

// Control plane limits and defaults.
const (
	// MaxControlBody bounds a control request body.
	MaxControlBody = 4 << 10
	// ControlTimeoutDefault bounds one control request on the leader.
	ControlTimeoutDefault = 10 * time.Second
	// PromoteLagDefault: a learner within this many entries of the commit
	// index counts as caught up (promotion, replacement completion).
	PromoteLagDefault = 64
	// ReconcileIntervalDefault is how often the leader aligns the raft
	// membership with the replicated control state.
	ReconcileIntervalDefault = 100 * time.Millisecond
	identityFile             = "identity.json"
)

// Identity is this node's issued NodeID and incarnation, kept in the data
// directory beside the store.
type Identity struct {
	NodeID      uint64   `json:"node_id"`
	Incarnation uint64   `json:"incarnation"`
	ControlURLs []string `json:"control_urls,omitempty"`
}

func readIdentity(dataDir string) (Identity, bool, error) {
	b, err := os.ReadFile(filepath.Join(dataDir, identityFile))
	if errors.Is(err, os.ErrNotExist) {
		return Identity{}, false, nil
	}
	if err != nil {
		return Identity{}, false, fmt.Errorf("daemon: read identity: %w", err)
	}
	var id Identity
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&id); err != nil || id.NodeID == 0 || id.Incarnation == 0 {
		return Identity{}, false, fmt.Errorf("daemon: identity file is corrupt: %v", err)
	}
	return id, true, nil
}

func writeIdentity(dataDir string, id Identity) error {
	b, _ := json.MarshalIndent(id, "", "  ")
	tmp := filepath.Join(dataDir, identityFile+".tmp")
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("daemon: write identity: %w", err)
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return fmt.Errorf("daemon: write identity: %w", err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("daemon: write identity: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("daemon: write identity: %w", err)
	}
	return os.Rename(tmp, filepath.Join(dataDir, identityFile))
}

// ControlError is the error body of the control API.
type ControlError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	Reason  string `json:"reason,omitempty"`
	Leader  uint64 `json:"leader,omitempty"`
}

func (e *ControlError) Error() string {
	if e.Reason != "" {
		return fmt.Sprintf("%s (%s): %s", e.Code, e.Reason, e.Message)
	}
	return fmt.Sprintf("%s: %s", e.Code, e.Message)
}

// Control API error codes.
const (
	ControlCodeUnauthorized = "unauthorized"
	ControlCodeNotLeader    = "not_leader"
	ControlCodeRejected     = "control_rejected"
	ControlCodeInvalid      = "invalid_argument"
	ControlCodeNotCaughtUp  = "not_caught_up"
	ControlCodeUnavailable  = "unavailable"
	// ControlCodeIndeterminate: the transition may have been applied; it is
	// never retried automatically (a retry of a consumed credential would
	// be refused and hide the first outcome). Check `ticketd admin members`.
	ControlCodeIndeterminate = "indeterminate"
)

// ControlMember is one member in control replies.
type ControlMember struct {
	NodeID      uint64 `json:"node_id"`
	Incarnation uint64 `json:"incarnation"`
	Address     string `json:"address"`
	Role        string `json:"role"`
}

// ControlReply is the body of a successful control request.
type ControlReply struct {
	Result      string          `json:"result"`
	NodeID      uint64          `json:"node_id,omitempty"`
	Incarnation uint64          `json:"incarnation,omitempty"`
	Credential  string          `json:"credential,omitempty"`
	Members     []ControlMember `json:"members,omitempty"`
}

// ControlRequest is the union of control request bodies; each endpoint
// reads the fields it needs and unknown fields are refused.
type ControlRequest struct {
	Credential  string `json:"credential,omitempty"`
	Address     string `json:"address,omitempty"`
	OldNodeID   uint64 `json:"old_node_id,omitempty"`
	NodeID      uint64 `json:"node_id,omitempty"`
	Incarnation uint64 `json:"incarnation,omitempty"`
}

func hashCredential(s string) [32]byte { return sha256.Sum256([]byte(s)) }

// startControl serves the control API on its own listener. It is never
// reachable through the client NATS port.
func (d *Daemon) startControl() error {
	mux := http.NewServeMux()
	admin := func(h func(*http.Request, ControlRequest) (ControlReply, *ControlError)) http.HandlerFunc {
		return d.controlHandler(true, h)
	}
	open := func(h func(*http.Request, ControlRequest) (ControlReply, *ControlError)) http.HandlerFunc {
		return d.controlHandler(false, h)
	}
	mux.HandleFunc("POST /v1/bootstrap", admin(d.ctlBootstrap))
	mux.HandleFunc("POST /v1/join-credentials", admin(d.ctlMintJoin))
	mux.HandleFunc("POST /v1/join", open(d.ctlJoin)) // authenticated by the join credential
	mux.HandleFunc("POST /v1/replacements", admin(d.ctlPrepareReplacement))
	mux.HandleFunc("POST /v1/replacements/complete", admin(d.ctlCompleteReplacement))
	mux.HandleFunc("POST /v1/replacements/abort", admin(d.ctlAbortReplacement))
	mux.HandleFunc("POST /v1/retire", admin(d.ctlRetire))
	mux.HandleFunc("POST /v1/members", admin(d.ctlMembers))
	mux.HandleFunc("POST /v1/identity", open(d.ctlIdentity)) // answers only valid/invalid
	ln, err := net.Listen("tcp", d.cfg.ControlListen)
	if err != nil {
		return fmt.Errorf("daemon: control listen: %w", err)
	}
	d.controlLn = ln
	d.control = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = d.control.Serve(ln) }()
	return nil
}

// ControlAddr is the bound control listener address ("" if none).
func (d *Daemon) ControlAddr() string {
	if d.controlLn == nil {
		return ""
	}
	return d.controlLn.Addr().String()
}

func (d *Daemon) controlHandler(needAdmin bool, h func(*http.Request, ControlRequest) (ControlReply, *ControlError)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		write := func(status int, v any) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(status)
			_ = json.NewEncoder(w).Encode(v)
		}
		fail := func(e *ControlError) {
			status := http.StatusConflict
			switch e.Code {
			case ControlCodeUnauthorized:
				status = http.StatusUnauthorized
			case ControlCodeNotLeader:
				status = http.StatusMisdirectedRequest
			case ControlCodeInvalid:
				status = http.StatusBadRequest
			case ControlCodeUnavailable:
				status = http.StatusServiceUnavailable
			}
			write(status, map[string]any{"error": e})
		}
		if needAdmin {
			got := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
			want := hashCredential(d.cfg.ControlCredential)
			have := hashCredential(got)
			if d.cfg.ControlCredential == "" || subtle.ConstantTimeCompare(want[:], have[:]) != 1 {
				fail(&ControlError{Code: ControlCodeUnauthorized, Message: "a valid control credential is required"})
				return
			}
		}
		body, err := io.ReadAll(io.LimitReader(r.Body, MaxControlBody+1))
		if err != nil || len(body) > MaxControlBody {
			fail(&ControlError{Code: ControlCodeInvalid, Message: "unreadable or oversize body"})
			return
		}
		var req ControlRequest
		if len(bytes.TrimSpace(body)) > 0 {
			dec := json.NewDecoder(bytes.NewReader(body))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&req); err != nil {
				fail(&ControlError{Code: ControlCodeInvalid, Message: fmt.Sprintf("bad JSON: %v", err)})
				return
			}
		}
		if !d.locks.IsLeader() {
			fail(&ControlError{Code: ControlCodeNotLeader, Message: "ask the leader", Leader: d.node.Leader()})
			return
		}
		reply, cerr := h(r, req)
		if cerr != nil {
			fail(cerr)
			return
		}
		write(http.StatusOK, reply)
	}
}

// proposeControl proposes a validated control command and maps its result.
func (d *Daemon) proposeControl(r *http.Request, cmd core.Command) (core.Result, *ControlError) {
	if err := cmd.Validate(); err != nil {
		return core.Result{}, &ControlError{Code: ControlCodeInvalid, Message: err.Error()}
	}
	ctx, cancel := context.WithTimeout(r.Context(), ControlTimeoutDefault)
	defer cancel()
	a, err := d.node.Propose(ctx, cmd)
	switch {
	case errors.Is(err, raftstore.ErrNotLeader):
		return core.Result{}, &ControlError{Code: ControlCodeNotLeader, Message: err.Error(), Leader: d.node.Leader()}
	case errors.Is(err, raftstore.ErrIndeterminate):
		return core.Result{}, &ControlError{Code: ControlCodeIndeterminate, Message: err.Error()}
	case err != nil:
		// Rejected before raft took it (invalid, or the context was done).
		return core.Result{}, &ControlError{Code: ControlCodeUnavailable, Message: err.Error()}
	}
	if a.Result.Kind == core.ResultControlRejected {
		return a.Result, &ControlError{Code: ControlCodeRejected, Reason: string(a.Result.Reason), Message: "the replicated control state refused the transition"}
	}
	return a.Result, nil
}

func (d *Daemon) controlMembers() []ControlMember {
	var out []ControlMember
	d.node.View(func(m *core.Machine) {
		for _, mb := range m.Members() {
			out = append(out, ControlMember{NodeID: mb.NodeID, Incarnation: mb.Incarnation, Address: mb.Address, Role: mb.Role.String()})
		}
	})
	return out
}

func (d *Daemon) ctlBootstrap(r *http.Request, req ControlRequest) (ControlReply, *ControlError) {
	if d.cfg.BootstrapCredential == "" {
		return ControlReply{}, &ControlError{Code: ControlCodeInvalid, Message: "this node was not started with a bootstrap credential"}
	}
	want, got := hashCredential(d.cfg.BootstrapCredential), hashCredential(req.Credential)
	if subtle.ConstantTimeCompare(want[:], got[:]) != 1 {
		return ControlReply{}, &ControlError{Code: ControlCodeUnauthorized, Message: "wrong bootstrap credential"}
	}
	if d.cfg.ID != 1 || d.PeerAddr() == "" {
		return ControlReply{}, &ControlError{Code: ControlCodeInvalid, Message: "bootstrap runs on node 1 with a peer listener"}
	}
	var bootstrapped bool
	d.node.View(func(m *core.Machine) { bootstrapped = m.Bootstrapped() })
	// Once bootstrapped, the replicated state itself refuses (and says so).
	if cs := d.node.ConfState(); !bootstrapped && (len(cs.Voters) != 1 || cs.Voters[0] != 1 || len(cs.Learners) != 0) {
		// A store with other members (e.g. started from a static member
		// list) must not be taken over: reconcile would remove them.
		return ControlReply{}, &ControlError{Code: ControlCodeInvalid, Message: fmt.Sprintf("bootstrap needs a fresh single-voter node; membership is %v", cs.Voters)}
	}
	res, cerr := d.proposeControl(r, core.Bootstrap(got, d.advertisedPeer()))
	if cerr != nil {
		return ControlReply{}, cerr
	}
	if err := writeIdentity(d.cfg.Data, Identity{NodeID: res.NodeID, Incarnation: res.Incarnation}); err != nil {
		return ControlReply{}, &ControlError{Code: ControlCodeUnavailable, Message: err.Error()}
	}
	return ControlReply{Result: res.Kind.String(), NodeID: res.NodeID, Incarnation: res.Incarnation, Members: d.controlMembers()}, nil
}

func (d *Daemon) ctlMintJoin(r *http.Request, _ ControlRequest) (ControlReply, *ControlError) {
	var raw [32]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return ControlReply{}, &ControlError{Code: ControlCodeUnavailable, Message: err.Error()}
	}
	cred := hex.EncodeToString(raw[:])
	res, cerr := d.proposeControl(r, core.MintJoin(hashCredential(cred)))
	if cerr != nil {
		return ControlReply{}, cerr
	}
	return ControlReply{Result: res.Kind.String(), Credential: cred}, nil
}

func (d *Daemon) ctlJoin(r *http.Request, req ControlRequest) (ControlReply, *ControlError) {
	if req.Credential == "" {
		return ControlReply{}, &ControlError{Code: ControlCodeUnauthorized, Message: "a join credential is required"}
	}
	res, cerr := d.proposeControl(r, core.Admit(hashCredential(req.Credential), req.Address))
	if cerr != nil {
		return ControlReply{}, cerr
	}
	return ControlReply{Result: res.Kind.String(), NodeID: res.NodeID, Incarnation: res.Incarnation, Members: d.controlMembers()}, nil
}

func (d *Daemon) ctlPrepareReplacement(r *http.Request, req ControlRequest) (ControlReply, *ControlError) {
	res, cerr := d.proposeControl(r, core.PrepareReplacement(req.OldNodeID, req.Address))
	if cerr != nil {
		return ControlReply{}, cerr
	}
	return ControlReply{Result: res.Kind.String(), NodeID: res.NodeID, Incarnation: res.Incarnation, Members: d.controlMembers()}, nil
}

func (d *Daemon) ctlCompleteReplacement(r *http.Request, req ControlRequest) (ControlReply, *ControlError) {
	if !d.caughtUp(req.NodeID) {
		return ControlReply{}, &ControlError{Code: ControlCodeNotCaughtUp, Message: fmt.Sprintf("node %d has not caught up with the log yet", req.NodeID)}
	}
	res, cerr := d.proposeControl(r, core.CompleteReplacement(req.OldNodeID, req.NodeID, req.Incarnation))
	if cerr != nil {
		return ControlReply{}, cerr
	}
	return ControlReply{Result: res.Kind.String(), NodeID: res.NodeID, Incarnation: res.Incarnation, Members: d.controlMembers()}, nil
}

func (d *Daemon) ctlAbortReplacement(r *http.Request, req ControlRequest) (ControlReply, *ControlError) {
	res, cerr := d.proposeControl(r, core.AbortReplacement(req.OldNodeID, req.NodeID, req.Incarnation))
	if cerr != nil {
		return ControlReply{}, cerr
	}
	return ControlReply{Result: res.Kind.String(), NodeID: res.NodeID, Incarnation: res.Incarnation, Members: d.controlMembers()}, nil
}

func (d *Daemon) ctlRetire(r *http.Request, req ControlRequest) (ControlReply, *ControlError) {
	res, cerr := d.proposeControl(r, core.Retire(req.NodeID, req.Incarnation))
	if cerr != nil {
		return ControlReply{}, cerr
	}
	return ControlReply{Result: res.Kind.String(), NodeID: res.NodeID, Incarnation: res.Incarnation, Members: d.controlMembers()}, nil
}

func (d *Daemon) ctlMembers(*http.Request, ControlRequest) (ControlReply, *ControlError) {
	return ControlReply{Result: "members", Members: d.controlMembers()}, nil
}

// ctlIdentity tells a starting node whether its identity is current. It
// reveals nothing but valid or not.
func (d *Daemon) ctlIdentity(r *http.Request, req ControlRequest) (ControlReply, *ControlError) {
	var err error
	d.node.View(func(m *core.Machine) { err = m.CheckIdentity(req.NodeID, req.Incarnation) })
	if err != nil {
		return ControlReply{}, &ControlError{Code: ControlCodeRejected, Reason: "identity_refused", Message: err.Error()}
	}
	return ControlReply{Result: "identity_current", NodeID: req.NodeID, Incarnation: req.Incarnation}, nil
}

// caughtUp reports whether a learner is alive and replicating, with its
// log within PromoteLagDefault of the leader's commit index. Match > 0 and
// the replicate state matter: a learner that never answered has Match 0,
// which a young log's small commit index would otherwise count as caught
// up, and promoting a dead learner can cost the quorum.
func (d *Daemon) caughtUp(id uint64) bool {
	st := d.node.Status()
	pr, ok := st.Progress[id]
	return ok && pr.Match > 0 && pr.RecentActive && pr.State == tracker.StateReplicate &&
		pr.Match+PromoteLagDefault >= st.Commit
}

func (d *Daemon) advertisedPeer() string {
	if d.cfg.PeerListen != "" {
		if _, port, err := net.SplitHostPort(d.cfg.PeerListen); err == nil && port != "0" {
			return d.cfg.PeerListen
		}
	}
	return d.PeerAddr()
}

// reconcileLoop runs on every node; while this node is the ready leader of
// a bootstrapped cluster it makes the raft membership follow the
// replicated control state (the source of truth) and promotes learners
// that have caught up. Doing it from replicated state means a leader
// crash between a control command and its conf change loses nothing: the
// next leader finishes the job.
func (d *Daemon) reconcileLoop() {
	defer d.bg.Done()
	t := time.NewTicker(ReconcileIntervalDefault)
	defer t.Stop()
	lastPromote := map[uint64]time.Time{}
	var lastChange time.Time
	// Proposals end when the daemon closes, not after their own timeout.
	bgCtx, cancelBG := context.WithCancel(context.Background())
	defer cancelBG()
	go func() {
		<-d.stopBG
		cancelBG()
	}()
	for {
		select {
		case <-d.stopBG:
			return
		case <-t.C:
		}
		d.syncPeers()
		if !d.locks.IsLeader() {
			continue
		}
		var (
			bootstrapped bool
			members      []core.Member
			repl         core.Replacement
			pending      bool
		)
		d.node.View(func(m *core.Machine) {
			bootstrapped = m.Bootstrapped()
			members = m.Members()
			repl, pending = m.PendingReplacement()
		})
		if !bootstrapped {
			continue
		}
		cs := d.node.ConfState()
		if len(cs.VotersOutgoing) > 0 || time.Since(lastChange) < time.Second && lastChange != (time.Time{}) {
			// In a joint configuration (raft leaves it by itself), or a
			// change was just proposed: wait for it to apply.
			if len(cs.VotersOutgoing) == 0 && confMatches(cs, members) {
				lastChange = time.Time{}
			}
			continue
		}
		if cc, ok := confChangeFor(cs, members); ok {
			ctx, cancel := context.WithTimeout(bgCtx, time.Second)
			if err := d.node.ProposeConfChange(ctx, cc); err != nil {
				d.log.Warn("propose membership change", "err", err)
			} else {
				d.log.Info("membership change proposed", "changes", cc.String())
				lastChange = time.Now()
			}
			cancel()
			continue
		}
		for _, m := range members {
			if m.Role != core.RoleLearner || (pending && repl.New == m.NodeID) {
				continue
			}
			if !d.caughtUp(m.NodeID) || time.Since(lastPromote[m.NodeID]) < time.Second {
				continue
			}
			lastPromote[m.NodeID] = time.Now()
			ctx, cancel := context.WithTimeout(bgCtx, ControlTimeoutDefault)
			a, err := d.node.Propose(ctx, core.Promote(m.NodeID, m.Incarnation))
			cancel()
			if err != nil {
				d.log.Warn("promote learner", "node", m.NodeID, "err", err)
			} else {
				d.log.Info("learner caught up; promoted", "node", m.NodeID, "result", a.Result.String())
			}
			break // one promotion per round: the next one waits for its conf change
		}
	}
}

func confMatches(cs raftpb.ConfState, members []core.Member) bool {
	_, ok := confChangeFor(cs, members)
	return !ok
}

// confChangeFor returns the one ConfChangeV2 that moves cs to the
// membership of the control state (joint consensus when it changes more
// than one voter at a time), and false when they already agree.
func confChangeFor(cs raftpb.ConfState, members []core.Member) (raftpb.ConfChangeV2, bool) {
	in := func(ids []uint64, id uint64) bool {
		for _, x := range ids {
			if x == id {
				return true
			}
		}
		return false
	}
	var cc raftpb.ConfChangeV2
	want := map[uint64]bool{}
	for _, m := range members {
		want[m.NodeID] = true
		switch {
		case m.Role == core.RoleVoter && !in(cs.Voters, m.NodeID):
			cc.Changes = append(cc.Changes, raftpb.ConfChangeSingle{Type: raftpb.ConfChangeAddNode, NodeID: m.NodeID})
		case m.Role == core.RoleLearner && !in(cs.Learners, m.NodeID) && !in(cs.Voters, m.NodeID):
			cc.Changes = append(cc.Changes, raftpb.ConfChangeSingle{Type: raftpb.ConfChangeAddLearnerNode, NodeID: m.NodeID})
		}
	}
	for _, id := range append(append([]uint64(nil), cs.Voters...), cs.Learners...) {
		if !want[id] {
			cc.Changes = append(cc.Changes, raftpb.ConfChangeSingle{Type: raftpb.ConfChangeRemoveNode, NodeID: id})
		}
	}
	if len(cc.Changes) == 0 {
		return cc, false
	}
	if len(cc.Changes) > 1 {
		cc.Transition = raftpb.ConfChangeTransitionJointImplicit
	}
	return cc, true
}

// syncPeers makes the peer transport dial exactly the current members
// (control mode): retired or removed ids are dropped, so their
// connections are refused from then on.
func (d *Daemon) syncPeers() {
	if d.peers == nil {
		return
	}
	var members []core.Member
	var bootstrapped bool
	d.node.View(func(m *core.Machine) { members, bootstrapped = m.Members(), m.Bootstrapped() })
	if !bootstrapped {
		return
	}
	d.peerMu.Lock()
	defer d.peerMu.Unlock()
	want := map[uint64]string{}
	for _, m := range members {
		if m.NodeID != d.cfg.ID {
			want[m.NodeID] = m.Address
		}
	}
	for id := range d.members {
		if _, ok := want[id]; !ok && id != d.cfg.ID {
			d.peers.RemovePeer(id)
			delete(d.members, id)
		}
	}
	for id, addr := range want {
		if d.members[id] != addr {
			d.peers.AddPeer(id, addr)
			d.members[id] = addr
		}
	}
}

// CallControl posts body to path on the first of urls that is the leader,
// retrying not_leader and unavailable answers until ctx ends. Other
// refusals come back as *ControlError.
func CallControl(ctx context.Context, urls []string, path, credential string, body any) (ControlReply, error) {
	b, _ := json.Marshal(body)
	var last error = errors.New("no control URL given")
	deadline := time.Now().Add(ControlTimeoutDefault * 3)
	for attempt := 0; time.Now().Before(deadline); attempt++ {
		for _, u := range urls {
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(u, "/")+path, bytes.NewReader(b))
			if err != nil {
				return ControlReply{}, fmt.Errorf("daemon: control request: %w", err)
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
				return ControlReply{}, &ControlError{Code: ControlCodeIndeterminate, Message: fmt.Sprintf("%s: %v", u, err)}
			}
			data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				var rep ControlReply
				if err := json.Unmarshal(data, &rep); err != nil {
					return ControlReply{}, fmt.Errorf("daemon: control reply: %w", err)
				}
				return rep, nil
			}
			var eb struct {
				Error *ControlError `json:"error"`
			}
			if json.Unmarshal(data, &eb) != nil || eb.Error == nil {
				last = fmt.Errorf("control %s: HTTP %d", u, resp.StatusCode)
				continue
			}
			if eb.Error.Code != ControlCodeNotLeader && eb.Error.Code != ControlCodeUnavailable {
				return ControlReply{}, eb.Error
			}
			last = eb.Error
		}
		select {
		case <-ctx.Done():
			return ControlReply{}, ctx.Err()
		case <-time.After(min(time.Duration(attempt+1)*100*time.Millisecond, time.Second)):
		}
	}
	return ControlReply{}, fmt.Errorf("daemon: no leader answered the control request: %w", last)
}
