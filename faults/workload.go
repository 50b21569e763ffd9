package faults

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ticketd/ticketd/sdk"
)

// resource is the fenced resource the lock holders write to: it remembers
// the highest token that wrote to each key and rejects lower ones. A
// holder writes only while its lock is valid by its SDK deadline; the
// check and the write happen under one mutex, so "valid at write time" is
// exact.
//
// Semaphore and read/write keys (kinds) have a guarded resource instead:
// use (kinds_workload.go) counts the holders using it.
type resource struct {
	h       *History
	mu      sync.Mutex
	highest map[string]uint64
	kinds   map[string]keySpec
	users   map[string]map[uint64]kindUser // kinds: key -> token -> user
}

// newResource is the resource of a run whose semaphore and read/write
// keys are kinds (nil: mutex keys only).
func newResource(h *History, kinds map[string]keySpec) *resource {
	return &resource{h: h, highest: map[string]uint64{}, kinds: kinds, users: map[string]map[uint64]kindUser{}}
}

// write returns attempted=false when the lock was no longer valid.
func (r *resource) write(client int, l *sdk.Lock) (attempted, accepted bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if spec, ok := r.kinds[l.Key]; ok {
		return r.use(client, l, spec)
	}
	if !l.Valid() {
		return false, false
	}
	hi := r.highest[l.Key]
	accepted = l.Token >= hi
	if accepted {
		r.highest[l.Key] = l.Token
	}
	r.h.addWrite(Write{Client: client, Key: l.Key, Token: l.Token, At: r.h.Now(), Accepted: accepted, Highest: hi})
	return true, accepted
}

// workload is the client side of a run: concurrent SDK clients on a
// small set of keys.
type workload struct {
	h        *History
	res      *resource
	keys     []string
	kinds    map[string]keySpec // the semaphore and read/write keys among keys
	leaseMin time.Duration
	leaseMax time.Duration
	maxWait  time.Duration
	// opTimeout bounds every operation on top of its queue wait.
	opTimeout time.Duration
}

// clientOptions are the SDK options of every harness client: short
// request timeouts and fast NATS failover, so that a crashed or paused
// node costs an operation, not the run.
func clientOptions() []sdk.Option {
	return []sdk.Option{
		sdk.WithRequestTimeout(time.Second),
		sdk.WithRetryBackoff(10*time.Millisecond, 200*time.Millisecond),
		sdk.WithNATSOptions(
			nats.Timeout(500*time.Millisecond),
			nats.ReconnectWait(50*time.Millisecond),
			nats.ReconnectJitter(20*time.Millisecond, 20*time.Millisecond),
			nats.MaxReconnects(-1),
			nats.PingInterval(300*time.Millisecond),
			nats.MaxPingsOutstanding(2),
			nats.RetryOnFailedConnect(true),
			nats.NoCallbacksAfterClientClose(),
			quietNATS(),
		),
	}
}

// quietNATS drops nats.go's asynchronous error reports (connection resets
// while nodes are killed), which it would otherwise print to stderr.
func quietNATS() nats.Option {
	return nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {})
}

func connectClient(urls []string) (*sdk.Client, error) {
	return sdk.Connect(strings.Join(urls, ","), clientOptions()...)
}

// classify maps an SDK error to an outcome.
func classify(kind OpKind, err error) (Outcome, string) {
	if err == nil {
		return OutOK, ""
	}
	code := sdk.CodeOf(err)
	var se *sdk.Error
	if !errors.As(err, &se) {
		// No code: nothing was sent (the context ended first).
		return OutFail, "no_attempt"
	}
	switch {
	case code.Retryable():
		// The SDK gave up after failures that certainly had no effect.
		return OutFail, string(code)
	case kind == OpGet:
		// Read-only: whatever went wrong, nothing changed.
		return OutFail, string(code)
	case errors.Is(err, sdk.ErrHeld) && kind == OpAcquire:
		return OutHeld, string(code)
	case errors.Is(err, sdk.ErrTimeout) && kind == OpAcquire:
		return OutTimeout, string(code)
	case errors.Is(err, sdk.ErrNotFound) && (kind == OpRelease || kind == OpRenew):
		return OutNotFound, string(code)
	case errors.Is(err, sdk.ErrInvalidArgument), errors.Is(err, sdk.ErrMalformed), errors.Is(err, sdk.ErrTooLarge),
		errors.Is(err, sdk.ErrDenied), errors.Is(err, sdk.ErrControlRefused), errors.Is(err, sdk.ErrPermissionDenied),
		errors.Is(err, sdk.ErrUnsupported):
		return OutFail, string(code)
	case errors.Is(err, sdk.ErrResourceExhausted) && kind == OpAcquire:
		// A limit (a leader's low disk) refused it before proposing.
		return OutFail, string(code)
	}
	// indeterminate, internal, an unknown code, or a code the operation
	// does not document (a release or renew answered "timeout"): unknown.
	return OutUnknown, string(code)
}

type worker struct {
	id  int
	cl  *sdk.Client
	rng *rand.Rand
	w   *workload
}

// run issues operations until the deadline or maxOps cycles.
func (wk *worker) run(until time.Time, maxOps int) {
	for n := 0; n < maxOps && time.Now().Before(until); n++ {
		key := wk.w.keys[wk.rng.IntN(len(wk.w.keys))]
		if wk.rng.Float64() < 0.25 {
			wk.get(key)
			continue
		}
		wk.cycle(key, until)
	}
}

func (wk *worker) dur(lo, hi time.Duration) time.Duration {
	if hi <= lo {
		return lo
	}
	return lo + time.Duration(wk.rng.Int64N(int64(hi-lo)))
}

// cycle: acquire (try or wait), write while valid, sometimes get, then
// release (or let the lease run out). A third of the cycles hold the lock
// for longer than its lease, renewing it (renewing).
func (wk *worker) cycle(key string, until time.Time) {
	lease := wk.dur(wk.w.leaseMin, wk.w.leaseMax).Truncate(time.Millisecond)
	shared := wk.pickShared(key)
	var wait time.Duration
	if wk.rng.IntN(2) == 0 {
		wait = wk.dur(50*time.Millisecond, wk.w.maxWait).Truncate(time.Millisecond)
	}
	if wk.w.kinds[key].Lock == LockRW && !shared {
		// Shared holders come and go beside each other, so an exclusive
		// request waits long enough to see them all leave (and queues
		// the shared requests behind it meanwhile: FIFO across modes).
		wait = wk.dur(wk.w.maxWait, 2*wk.w.leaseMax).Truncate(time.Millisecond)
	}
	l := wk.acquireAs(key, lease, wait, shared)
	if l == nil {
		// Do not spin on a held key.
		pace(wk.dur(10*time.Millisecond, 60*time.Millisecond), until)
		return
	}
	if wk.rng.IntN(3) == 0 {
		wk.renewing(l, until)
		return
	}
	var hold time.Duration
	release := true
	switch p := wk.rng.Float64(); {
	case p < 0.70:
		hold = wk.dur(0, l.Lease*6/10)
	case p < 0.85:
		hold = wk.dur(l.Lease*6/10, l.Lease)
	default:
		// Hold past the lease: the lock expires (the release, if sent,
		// must find nothing).
		hold = l.Lease + wk.dur(0, 300*time.Millisecond)
		release = wk.rng.IntN(2) == 0
	}
	end := time.Now().Add(hold)
	for i := 0; i < 100 && time.Now().Before(end); i++ {
		if attempted, _ := wk.w.res.write(wk.id, l); !attempted {
			break
		}
		pace(wk.dur(5*time.Millisecond, 40*time.Millisecond), end)
		if i == 2 && wk.rng.IntN(4) == 0 {
			wk.get(key)
		}
	}
	pace(time.Until(end), until.Add(wk.w.leaseMax))
	wk.w.res.leave(l)
	if release {
		wk.releaseRetried(key, l.Token)
	}
}

// releaseRetried releases once more if the first outcome is unknown:
// releasing again with the same token is harmless.
func (wk *worker) releaseRetried(key string, token uint64) {
	for i := 0; i < 2; i++ {
		if r := wk.release(key, token); r != OutUnknown {
			break
		}
	}
}

// renewing holds l for 1.5 to 3 of its leases (but not past the round's
// end), renewing it every third of its lease and writing to the resource
// while l.Valid() (the SDK deadline, which only a confirmed renewal
// moves). It keeps renewing after its deadline has passed (a confirmed
// renewal then shows the lock was still held, and writes resume) and
// stops once a renewal is refused (not_found). Then it releases, or, one
// time in five, lets the lease run out.
func (wk *worker) renewing(l *sdk.Lock, until time.Time) {
	end := time.Now().Add(wk.dur(l.Lease*3/2, l.Lease*3))
	if end.After(until) {
		end = until
	}
	every := l.Lease / 3
	next := time.Now().Add(every)
	live := true
	for i := 0; i < 1000 && time.Now().Before(end); i++ {
		if live && !time.Now().Before(next) {
			live = wk.renew(l, wk.renewLease(l)) != OutNotFound
			next = time.Now().Add(every)
		}
		wk.w.res.write(wk.id, l)
		wait := wk.dur(5*time.Millisecond, 40*time.Millisecond)
		if live {
			wait = min(wait, time.Until(next))
		}
		pace(wait, end)
	}
	wk.w.res.leave(l)
	if wk.rng.IntN(5) > 0 {
		wk.releaseRetried(l.Key, l.Token)
	}
}

// renewLease is the lease a renewal asks for: usually 0 (keep the lock's
// lease), one time in four up to twice the granted lease.
func (wk *worker) renewLease(l *sdk.Lock) time.Duration {
	if wk.rng.IntN(4) > 0 {
		return 0
	}
	return wk.dur(l.Lease*5/4, l.Lease*2).Truncate(time.Millisecond)
}

// renew renews l and records it. Lease 0 goes through Lock.Renew, which
// moves l's deadline on a confirmed renewal; a longer lease goes through
// Client.Renew (Lock.Renew always asks for the lock's lease), which does
// not move l's deadline, so the writes keep to the old one until the next
// Lock.Renew, whose reply carries the longer lease. The recorded deadline
// is what the renewal promised the holder.
func (wk *worker) renew(l *sdk.Lock, lease time.Duration) Outcome {
	h := wk.w.h
	ctx, cancel := context.WithTimeout(context.Background(), wk.w.opTimeout)
	defer cancel()
	o := Op{Client: wk.id, Kind: OpRenew, Key: l.Key, Token: l.Token, Lease: int64(lease)}
	prev := l.Deadline()
	o.Call = h.Now()
	var err error
	if lease == 0 {
		err = l.Renew(ctx)
	} else {
		var rn sdk.Renewal
		if rn, err = wk.cl.Renew(ctx, l.Key, l.Token, lease); err == nil {
			o.Granted, o.Deadline = int64(rn.Lease), h.Rel(rn.Deadline)
		}
	}
	o.Return = h.Now()
	o.Result, o.Code = classify(OpRenew, err)
	switch {
	case err != nil:
		o.Err = err.Error()
	case lease == 0:
		// The send time and lease of the renewal are not returned, only
		// the deadline they make; it always moves (a later send, a lease
		// never shorter). Were it not to, the renewal promised nothing
		// the model could count on (the old deadline's jumps count from
		// an earlier time).
		o.Deadline = o.Call
		if d := l.Deadline(); d.After(prev) {
			o.Deadline = h.Rel(d)
		}
	}
	h.addOp(o)
	return o.Result
}

// pace sleeps d but not past limit. It paces the workload; it never
// waits for a condition.
func pace(d time.Duration, limit time.Time) {
	if rem := time.Until(limit); d > rem {
		d = rem
	}
	if d > 0 {
		time.Sleep(d)
	}
}

func (wk *worker) acquire(key string, lease, wait time.Duration) *sdk.Lock {
	return wk.acquireAs(key, lease, wait, wk.pickShared(key))
}

// acquireAs is acquire, shared or exclusive on a read/write key.
func (wk *worker) acquireAs(key string, lease, wait time.Duration, shared bool) *sdk.Lock {
	h := wk.w.h
	ctx, cancel := context.WithTimeout(context.Background(), wait+wk.w.opTimeout)
	defer cancel()
	o := Op{Client: wk.id, Kind: OpAcquire, Key: key, Lease: int64(lease), Wait: int64(wait)}
	opts := append([]sdk.AcquireOption{sdk.WithLease(lease), sdk.WithWait(wait), sdk.WithOwner(fmt.Sprintf("client-%d", wk.id))},
		wk.kindOptions(key, shared, &o)...)
	o.Call = h.Now()
	l, err := wk.cl.Acquire(ctx, key, opts...)
	o.Return = h.Now()
	o.Result, o.Code = classify(OpAcquire, err)
	if o.Result == OutFail && o.Code == "no_attempt" {
		// An acquire abandoned by its context is settled by the SDK: a
		// waiting one withdrawn, and one whose last attempt's outcome was
		// unknown settled by its request_id (a grant it never received
		// released); the error carries no code. A grant may have existed
		// meanwhile, as after a timeout answer: model it as one.
		o.Result, o.Code = OutTimeout, "gave_up"
	}
	if err != nil {
		o.Err = err.Error()
	} else {
		o.Token, o.Granted, o.Deadline = l.Token, int64(l.Lease), h.Rel(l.Deadline())
	}
	h.addOp(o)
	return l
}

func (wk *worker) release(key string, token uint64) Outcome {
	h := wk.w.h
	ctx, cancel := context.WithTimeout(context.Background(), wk.w.opTimeout)
	defer cancel()
	o := Op{Client: wk.id, Kind: OpRelease, Key: key, Token: token}
	o.Call = h.Now()
	err := wk.cl.Release(ctx, key, token)
	o.Return = h.Now()
	o.Result, o.Code = classify(OpRelease, err)
	if err != nil {
		o.Err = err.Error()
	}
	h.addOp(o)
	return o.Result
}

func (wk *worker) get(key string) (held bool, ok bool) {
	return recordGet(wk.w.h, wk.cl, wk.id, key, wk.w.opTimeout)
}

// recordGet runs one get and records it.
func recordGet(h *History, cl *sdk.Client, client int, key string, timeout time.Duration) (held bool, ok bool) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	o := Op{Client: client, Kind: OpGet, Key: key}
	o.Call = h.Now()
	hd, err := cl.Get(ctx, key)
	o.Return = h.Now()
	o.Result, o.Code = classify(OpGet, err)
	if err != nil {
		o.Err = err.Error()
	} else {
		o.Held, o.Token = hd.Held, hd.Token
		recordHolders(&o, hd)
	}
	h.addOp(o)
	return o.Held, o.Result == OutOK
}
