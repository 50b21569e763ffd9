package lockservice

import (
	"context"
	"fmt"
	"time"

	"github.com/ticketd/ticketd/core"
)

// Retry-safe acquires (issue 23): an acquire may carry a request id,
// chosen by its client and scoped to its identity. A retry of the same
// request (its first reply was lost, it reached a new leader) learns the
// first outcome instead of being granted a second time. The record of
// what a request id produced is replicated state (core/requests.go); what
// lives here is how the leader answers from it:
//
//   - Before the held/queue logic, the request id is looked up in the
//     applied state. Found, the leader confirms with a ReadIndex that it
//     still leads and that its state holds every earlier commit, and
//     looks again: a held grant of the same key is answered with that
//     grant (same token; the lock as it is, its lease not started again);
//     an ended one with ErrGrantEnded and its token; one of another key,
//     or a held grant of another kind (limit, mode), is refused with
//     RequestMismatchError (invalid_argument), and nothing changes. Not
//     found, the acquire goes on and its Grant
//     carries the request id, so Apply itself refuses to grant it twice
//     should a record turn up meanwhile. (A ReadIndex on every lookup
//     would confirm an absence that the proposal confirms anyway.)
//   - A request in progress on this leader (queued, or its Grant in
//     flight) is not started twice: a later attempt with the same request
//     id attaches to it and becomes its heir. If the first attempt is
//     granted, the grant goes to the heir (the first attempt's requester,
//     whose reply was what got lost, is answered indeterminate), and the
//     lost-reply rule (SPEC §4.4) applies to the heir's deadline, not the
//     first attempt's. If it ends without a grant, the heir starts afresh
//     with its own wait. A later attempt that asks for another key or
//     kind than the one in progress does not attach: it is refused with
//     RequestMismatchError, and the first attempt goes on as if it never
//     came. A heir that gives up before the first attempt
//     ends gets indeterminate (retry with the same request id).
//   - A repeated grant was made for an earlier attempt that may have
//     received it: it is never released on a lost reply.
//   - A held grant whose delivery to a requester that waited is watched,
//     or whose lost-reply release is in flight, is not repeated until that
//     settles (settle.go): a retry never gets a grant being taken away.
//     (A follower relaying a grant releases a lost one through the leader
//     with a plain release; that path is not covered: such grants are
//     relayed only while the client's subscription moves to a new leader.)
//   - The request records are bounded (core.MaxRequestRecords): the
//     leader refuses, before proposing, a new request id that would not
//     fit (ResourceRequestRecords).
//   - Only the key and the kind of a request are checked: a retry is
//     meant to be sent unchanged, and a lock of another kind than asked
//     for would be wrongly used (a writer that holds a shared hold, say).
//     An ended grant's record keeps only its key's hash and its token
//     (core.EndedRequest), so an ended grant is answered ErrGrantEnded
//     whatever kind the retry names: it grants nothing either way.
//     Lease, owner and wait may differ: a repeat reports the lock as it is.
//   - A request id needs cluster version 3; below it the acquire is
//     refused with ErrUnsupported rather than served without the id: a
//     client that sends one relies on retrying it safely, and a retry of a
//     grant recorded without its id would queue behind its own lock.

// ResourceRequestRecords: the replicated request records are at
// core.MaxRequestRecords and none may be forgotten yet.
const ResourceRequestRecords = "request_records"

// reqAttempt is an acquire with a request id in progress on this leader.
// Its fields are guarded by lead.mu until done is closed, then read-only.
type reqAttempt struct {
	done chan struct{}
	// key, limit and mode are what the attempt asks for (read-only):
	// a later attempt that names another is refused, not attached.
	key   string
	limit uint32
	mode  core.Mode
	// heir is the number of the attempt that attached last (0: none),
	// heirDeadline its reply deadline; heirs counts the attachments.
	heir         uint64
	heirs        uint64
	heirDeadline time.Time
	// The outcome, set when done is closed.
	grant Grant
	err   error
}

// heirWaiting reports whether a later attempt that can still be answered
// waits for a's grant. s.lead.mu held.
func (a *reqAttempt) heirWaiting(now time.Time) bool {
	return a != nil && a.heir != 0 && now.Before(a.heirDeadline)
}

// acquireRequest is Acquire for a request with a request id (cmd carries
// it): the lookup, the attachment to an attempt in progress, or a first
// attempt of its own.
func (s *Service) acquireRequest(ctx context.Context, p AcquireParams, cmd core.Command, deadline time.Time, identity string) (Grant, error) {
	h := core.RequestKey(identity, p.RequestID)
	for {
		a, heir, err := s.beginAttempt(h, p, deadline)
		if err != nil {
			return Grant{}, err
		}
		if heir != 0 {
			g, err, again := s.awaitAttempt(ctx, p, a, heir, deadline)
			if again {
				continue
			}
			return s.settling(g, err)
		}
		p.attempt = a
		g, err := s.firstAttempt(ctx, p, cmd, deadline, identity)
		return s.settling(s.finishAttempt(h, a, p, deadline, g, err))
	}
}

// settling marks a grant the transport delivers watching (Queued) as
// settling for the delivery window (settle.go).
func (s *Service) settling(g Grant, err error) (Grant, error) {
	if err == nil && g.Queued && !g.Repeated {
		s.markSettling(g.Key, g.Token, s.cfg.SettleWindow)
	}
	return g, err
}

// beginAttempt registers an attempt of request h, or attaches to the one
// in progress (heir: its number as heir) when it asks for the same key
// and kind as p; one that asks for another is a RequestMismatchError.
func (s *Service) beginAttempt(h [32]byte, p AcquireParams, deadline time.Time) (a *reqAttempt, heir uint64, err error) {
	s.lead.mu.Lock()
	defer s.lead.mu.Unlock()
	if !s.lead.ready {
		return nil, 0, s.notLeader()
	}
	if a := s.lead.requests[h]; a != nil {
		if a.key != p.Key || !p.asksKind(a.limit, a.mode) {
			return nil, 0, &RequestMismatchError{RequestID: p.RequestID, InProgress: true,
				Key: a.key, Limit: a.limit, Mode: a.mode, KindKnown: true,
				AskedKey: p.Key, AskedLimit: p.Limit, AskedMode: p.Mode}
		}
		a.heirs++
		a.heir = a.heirs
		if deadline.After(a.heirDeadline) {
			a.heirDeadline = deadline
		}
		return a, a.heir, nil
	}
	a = &reqAttempt{done: make(chan struct{}), key: p.Key, limit: p.Limit, mode: p.Mode}
	s.lead.requests[h] = a
	return a, 0, nil
}

// awaitAttempt waits, as heir number heir, for attempt a. again: a ended
// without a grant, so the caller starts afresh.
func (s *Service) awaitAttempt(ctx context.Context, p AcquireParams, a *reqAttempt, heir uint64, deadline time.Time) (_ Grant, _ error, again bool) {
	select {
	case <-a.done:
	case <-ctx.Done():
		s.lead.mu.Lock()
		select {
		case <-a.done: // it ended meanwhile: take the outcome below
		default:
			if a.heir == heir {
				a.heir = 0 // nobody waits for its grant any more
			}
			s.lead.mu.Unlock()
			return Grant{}, fmt.Errorf("%w: an earlier attempt of request_id %q is still in progress on the leader; retry with the same request_id: %w", ErrIndeterminate, p.RequestID, ctx.Err()), false
		}
		s.lead.mu.Unlock()
	}
	switch {
	case a.err != nil:
		return Grant{}, nil, true
	case a.heir != heir:
		return Grant{}, fmt.Errorf("%w: a later attempt of request_id %q took over; retry with it", ErrIndeterminate, p.RequestID), false
	case !a.grant.Repeated && s.cfg.Now().After(deadline):
		// Granted after this heir's deadline too: nobody can hold it.
		s.ReleaseUndelivered(a.grant.Key, a.grant.Token)
		return Grant{}, fmt.Errorf("%w: granted token %d after the requester's deadline; released", ErrTimeout, a.grant.Token), false
	}
	g := a.grant
	// Its requester may have left too: deliver it watching (natsapi).
	g.Queued = g.Queued || !g.Repeated
	return g, nil, false
}

// finishAttempt ends attempt a with its outcome: a grant goes to its heir
// if one waits (the attempt itself then answers indeterminate), and a
// fresh grant nobody can receive any more (both deadlines passed) is
// released.
func (s *Service) finishAttempt(h [32]byte, a *reqAttempt, p AcquireParams, deadline time.Time, g Grant, err error) (Grant, error) {
	now := s.cfg.Now()
	s.lead.mu.Lock()
	if s.lead.requests[h] == a {
		delete(s.lead.requests, h)
	}
	heir := err == nil && a.heirWaiting(now)
	if err == nil && !heir {
		a.heir = 0
	}
	a.grant, a.err = g, err
	close(a.done)
	s.lead.mu.Unlock()
	switch {
	case heir:
		return Grant{}, fmt.Errorf("%w: a later attempt of request_id %q took over and is answered with the grant", ErrIndeterminate, p.RequestID)
	case err == nil && !g.Repeated && now.After(deadline):
		s.ReleaseUndelivered(g.Key, g.Token)
		return Grant{}, fmt.Errorf("%w: granted token %d after the requester's deadline; released", ErrTimeout, g.Token)
	}
	return g, err
}

// firstAttempt is an attempt of its own: the lookup, then the usual
// acquire with the request id in its Grant.
func (s *Service) firstAttempt(ctx context.Context, p AcquireParams, cmd core.Command, deadline time.Time, identity string) (Grant, error) {
	if g, found, err := s.lookupRequest(ctx, p, identity); found || err != nil {
		return g, err
	}
	if err := s.checkPolicy(ctx, p, cmd.LeaseMS); err != nil {
		return Grant{}, err
	}
	// A pre-check: Apply enforces the bound (ResultRequestsExhausted).
	if err := s.admitRequest(s.cfg.WallClockMS()); err != nil {
		return Grant{}, err
	}
	return s.acquireLoop(ctx, p, cmd, deadline, identity)
}

// lookupRequest answers a request whose id the applied state knows, after
// a ReadIndex (found); found is false when it knows none.
func (s *Service) lookupRequest(ctx context.Context, p AcquireParams, identity string) (_ Grant, found bool, _ error) {
	var rec core.RequestRecord
	s.node.View(func(m *core.Machine) { rec = m.LookupRequest(identity, p.RequestID) })
	if rec.Status == core.RequestUnknown {
		return Grant{}, false, nil
	}
	var held core.Lock
	for {
		// The table may be a deposed leader's: confirm before answering.
		if err := s.node.ReadIndex(ctx); err != nil {
			return Grant{}, true, s.nodeErr(err)
		}
		s.node.View(func(m *core.Machine) {
			rec = m.LookupRequest(identity, p.RequestID)
			if rec.Status == core.RequestHeld {
				held, _ = m.Holder(rec.Key, rec.Token)
			}
		})
		if rec.Status != core.RequestHeld {
			break
		}
		// A grant whose delivery or lost-reply release is under way is
		// answered once that settles (settle.go).
		waited, err := s.awaitSettled(ctx, held.Key, held.Token)
		if err != nil {
			return Grant{}, true, fmt.Errorf("%w: the grant of request_id %q is being delivered or released; retry with the same request_id: %w", ErrIndeterminate, p.RequestID, err)
		}
		if waited {
			continue
		}
		// Not settling now. A release whose mark ended between the View
		// above and that look applied before its mark ended: only a View
		// taken after the look shows it.
		before := rec
		s.node.View(func(m *core.Machine) {
			rec = m.LookupRequest(identity, p.RequestID)
			if rec.Status == core.RequestHeld {
				held, _ = m.Holder(rec.Key, rec.Token)
			}
		})
		if rec == before {
			break
		}
	}
	switch {
	case rec.Status == core.RequestUnknown:
		return Grant{}, false, nil // forgotten meanwhile
	case rec.KeyHash != core.RequestKeyHash(p.Key):
		return Grant{}, true, mismatch(p, rec)
	case rec.Status == core.RequestEnded:
		// Its kind is not recorded (only the key's hash): the answer
		// grants nothing whatever the retry asks for.
		return Grant{}, true, &GrantEndedError{Key: p.Key, Token: rec.Token}
	case !p.asksKind(held.Limit, held.Mode):
		return Grant{}, true, heldMismatch(p, held)
	}
	return s.repeatedGrant(held), true, nil
}

// withdrawRequest settles a request its client gave up on, from the
// replicated request records, for a leader that does not know its wait
// (a new leader, say): a held grant of key is released (the client never
// received it: it gave up), an ended one reported, and none reported as
// not granted. An attempt of it still in progress on this leader, or a
// record of another key, leaves the outcome unknown (the zero Withdrawal).
// The client vouches that it never received a grant of this request id:
// the SDK sends it only for ids of its own making.
//
// From cluster version 6 it proposes a Settle instead (settleRequest),
// which also makes sure that no attempt of the request still in the
// network is granted later.
func (s *Service) withdrawRequest(ctx context.Context, key, requestID string) (Withdrawal, error) {
	identity := IdentityFrom(ctx)
	if len(requestID) > core.MaxRequestIDLen || s.node.ClusterVersion() < 3 {
		return Withdrawal{}, nil
	}
	if s.node.ClusterVersion() >= 6 {
		return s.settleRequest(ctx, key, identity, requestID)
	}
	inProgress := func() bool {
		s.lead.mu.Lock()
		defer s.lead.mu.Unlock()
		return s.lead.requests[core.RequestKey(identity, requestID)] != nil
	}
	for {
		if inProgress() {
			return Withdrawal{}, nil
		}
		// Never from a deposed leader's table.
		if err := s.node.ReadIndex(ctx); err != nil {
			return Withdrawal{}, s.nodeErr(err)
		}
		var rec core.RequestRecord
		s.node.View(func(m *core.Machine) { rec = m.LookupRequest(identity, requestID) })
		switch {
		case rec.Status == core.RequestUnknown:
			if inProgress() {
				return Withdrawal{}, nil
			}
			return Withdrawal{NotGranted: true}, nil
		case rec.KeyHash != core.RequestKeyHash(key):
			return Withdrawal{}, nil
		case rec.Status == core.RequestEnded:
			return Withdrawal{EndedToken: rec.Token}, nil
		}
		// Held: release it, once a delivery or release under way settled.
		if waited, err := s.awaitSettled(ctx, key, rec.Token); err != nil {
			return Withdrawal{}, fmt.Errorf("%w: the request's grant is being delivered or released: %w", ErrIndeterminate, err)
		} else if waited {
			continue
		}
		a, err := s.propose(ctx, core.Release(key, rec.Token))
		if err != nil {
			return Withdrawal{}, err
		}
		s.log.Info("released the grant of a request its client gave up on", "key", key, "token", rec.Token, "result", a.Result.String())
		return Withdrawal{ReleasedToken: rec.Token}, nil
	}
}

// settleRequest settles a request its client gave up on with one Settle
// (core/requests.go), applied atomically: a held grant of key is
// released, an ended one reported, and a request with no record gets a
// tombstone, so that an attempt of it still in the network (in another
// node's NATS server, or queued on this leader) is refused when its Grant
// applies (GrantEndedError with token 0) instead of granted to nobody.
// A grant being delivered or released is waited for first, as a retry
// would (settle.go).
func (s *Service) settleRequest(ctx context.Context, key, identity, requestID string) (Withdrawal, error) {
	if err := core.ValidateRequestID(requestID); err != nil || requestID == "" {
		return Withdrawal{}, nil
	}
	var rec core.RequestRecord
	s.node.View(func(m *core.Machine) { rec = m.LookupRequest(identity, requestID) })
	if rec.Status == core.RequestHeld && rec.Key == key {
		if _, err := s.awaitSettled(ctx, key, rec.Token); err != nil {
			return Withdrawal{}, fmt.Errorf("%w: the request's grant is being delivered or released: %w", ErrIndeterminate, err)
		}
	}
	a, err := s.propose(ctx, core.Settle(key, identity, requestID, s.cfg.WallClockMS()))
	if err != nil {
		return Withdrawal{}, err
	}
	switch r := a.Result; r.Kind {
	case core.ResultReleased:
		s.log.Info("released the grant of a request its client gave up on", "key", key, "token", r.Token)
		return Withdrawal{ReleasedToken: r.Token}, nil
	case core.ResultGrantEnded:
		if r.Token == 0 {
			return Withdrawal{NotGranted: true}, nil // settled before
		}
		return Withdrawal{EndedToken: r.Token}, nil
	case core.ResultSettled:
		return Withdrawal{NotGranted: true}, nil
	case core.ResultRequestsExhausted:
		return Withdrawal{}, s.refuse(&LimitError{Resource: ResourceRequestRecords, Limit: core.MaxRequestRecords})
	}
	// A grant of another key, or a Noop (the cluster version changed
	// under it): the outcome stays unknown.
	return Withdrawal{}, nil
}

// repeatedGrant answers a request with the grant it holds, l: its lease
// as it stands on this leader's timer.
func (s *Service) repeatedGrant(l core.Lock) Grant {
	g := Grant{Key: l.Key, Token: l.Token, Lease: time.Duration(l.LeaseMS) * time.Millisecond, Repeated: true, Owner: l.Owner, Limit: l.Limit, Mode: l.Mode}
	s.lead.mu.Lock()
	g.Remaining = s.remainingOf(l, s.cfg.Now())
	s.lead.mu.Unlock()
	g.Fence = s.fence(l.Key, l.Token)
	return g
}

// RequestMismatchError: an acquire whose request id names a request made
// for another key or another kind (limit, mode) than the acquire asks
// for. Its code is invalid_argument (it unwraps to a core.Error): the
// acquire is wrong as sent, nothing changed, and sending it again is
// refused the same way; a retry must be sent unchanged, and another
// acquire needs a new request id.
type RequestMismatchError struct {
	RequestID string
	// Key is the key the request was made for ("" when only its hash is
	// known: an ended grant); Token its grant's token (0: none yet).
	Key   string
	Token uint64
	// Limit and Mode are the request's kind when KindKnown (a held grant,
	// or an attempt in progress on the leader).
	Limit     uint32
	Mode      core.Mode
	KindKnown bool
	// InProgress: the request is being served on the leader (queued, or
	// its Grant in flight), not granted yet.
	InProgress bool
	// What the refused acquire asked for.
	AskedKey   string
	AskedLimit uint32
	AskedMode  core.Mode
}

func (e *RequestMismatchError) detail() string {
	key := "another key"
	if e.Key != "" {
		key = fmt.Sprintf("%q", e.Key)
	}
	var what string
	switch {
	case e.InProgress:
		what = fmt.Sprintf("is in progress on the leader for %s on %s", kindText(e.Limit, e.Mode), key)
	case e.KindKnown:
		what = fmt.Sprintf("was granted %s on %s (token %d)", kindText(e.Limit, e.Mode), key, e.Token)
	default:
		what = fmt.Sprintf("was used for %s (token %d)", key, e.Token)
	}
	asked := fmt.Sprintf("%q", e.AskedKey)
	if e.KindKnown {
		asked = fmt.Sprintf("%s on %q", kindText(e.AskedLimit, e.AskedMode), e.AskedKey)
	}
	return fmt.Sprintf("request_id %q %s, not %s: a retry must be sent unchanged; use a new request_id for each acquire", e.RequestID, what, asked)
}

func (e *RequestMismatchError) Error() string { return "lockservice: " + e.detail() }

// Unwrap gives the invalid_argument core.Error the transports answer
// with (errors.Is(err, core.ErrInvalidArgument) holds).
func (e *RequestMismatchError) Unwrap() error {
	return &core.Error{Code: core.CodeInvalidArgument, Detail: e.detail()}
}

// asksKind says whether p asks for a lock of kind (limit, mode). p's
// limit is normalised as the Grant writes it (core.Command.WithKind), so
// the fields compare as they are.
func (p AcquireParams) asksKind(limit uint32, mode core.Mode) bool {
	return p.Limit == limit && p.Mode == mode
}

// kindText names a kind as an acquire asks for it.
func kindText(limit uint32, mode core.Mode) string {
	switch {
	case limit > 1:
		return fmt.Sprintf("a slot of a semaphore of limit %d", limit)
	case mode == core.ModeShared:
		return "a shared hold"
	}
	return "a mutex (or exclusive hold)"
}

// mismatch is the error of a request id used before for another key.
func mismatch(p AcquireParams, rec core.RequestRecord) error {
	return &RequestMismatchError{RequestID: p.RequestID, Key: rec.Key, Token: rec.Token, AskedKey: p.Key, AskedLimit: p.Limit, AskedMode: p.Mode}
}

// heldMismatch is the error of a request id whose grant held, of p's key,
// is of another kind than p asks for.
func heldMismatch(p AcquireParams, held core.Lock) error {
	return &RequestMismatchError{RequestID: p.RequestID, Key: held.Key, Token: held.Token, Limit: held.Limit, Mode: held.Mode, KindKnown: true,
		AskedKey: p.Key, AskedLimit: p.Limit, AskedMode: p.Mode}
}

// admitRequest refuses a new request id the request records have no room
// for (core.Machine.RequestRoom), before anything is proposed.
func (s *Service) admitRequest(grantedAtMS uint64) error {
	var room bool
	s.node.View(func(m *core.Machine) { room = m.RequestRoom(grantedAtMS) })
	if room {
		return nil
	}
	return s.refuse(&LimitError{Resource: ResourceRequestRecords, Limit: core.MaxRequestRecords})
}

// appliedRequest turns the apply result of a Grant with a request id that
// found its request already recorded (a race the lookup could not see)
// into the answer the lookup would have given.
func (s *Service) appliedRequest(p AcquireParams, r core.Result) (Grant, error) {
	switch r.Kind {
	case core.ResultGrantRepeated:
		var held core.Lock
		s.node.View(func(m *core.Machine) { held, _ = m.Holder(p.Key, r.Token) })
		if held.Token == r.Token && !p.asksKind(held.Limit, held.Mode) {
			// Apply compares only the key; the Grant changed nothing.
			return Grant{}, heldMismatch(p, held)
		}
		return s.repeatedGrant(held), nil
	case core.ResultGrantEnded:
		return Grant{}, &GrantEndedError{Key: p.Key, Token: r.Token}
	case core.ResultRequestMismatch:
		return Grant{}, mismatch(p, core.RequestRecord{Token: r.Token})
	case core.ResultRequestsExhausted:
		return Grant{}, s.refuse(&LimitError{Resource: ResourceRequestRecords, Limit: core.MaxRequestRecords})
	}
	return Grant{}, fmt.Errorf("lockservice: grant applied as %v", r)
}
