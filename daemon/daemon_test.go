package daemon_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ticketd/ticketd/core"
	"github.com/ticketd/ticketd/daemon"
	"github.com/ticketd/ticketd/internal/testkit"
	"github.com/ticketd/ticketd/internal/testkit/testcluster"
	"github.com/ticketd/ticketd/lockservice"
	"github.com/ticketd/ticketd/plugins"
	"github.com/ticketd/ticketd/sdk"
	"github.com/ticketd/ticketd/transports/protocol"
)

// startNode starts a single node with data in dir and waits until it
// leads.
func startNode(t testing.TB, dir string, opts daemon.Options) *daemon.Daemon {
	t.Helper()
	cfg := daemon.Defaults()
	cfg.Data = dir
	cfg.NATSListen = "127.0.0.1:0"
	cfg.TickMS = testkit.TickMS
	if opts.Logger == nil {
		opts.Logger = testkit.QuietLogger()
	}
	d, err := daemon.Start(context.Background(), cfg, opts)
	if err != nil {
		t.Fatalf("start node: %v", err)
	}
	testkit.Eventually(t, 10*time.Second, "node leads at the newest cluster version", func() bool { return testcluster.Settled(d) })
	return d
}

// connect makes an SDK client on a new connection to d.
func connect(t testing.TB, d *daemon.Daemon) (*nats.Conn, *sdk.Client) {
	t.Helper()
	nc := testkit.Connect(t, d.ClientURL())
	cl, err := sdk.New(nc)
	if err != nil {
		t.Fatalf("sdk: %v", err)
	}
	return nc, cl
}

// rawRequest sends body to subject and parses the reply.
func rawRequest(t testing.TB, nc *nats.Conn, subject string, body string, v any) *protocol.Error {
	t.Helper()
	m, err := nc.Request(subject, []byte(body), 5*time.Second)
	if err != nil {
		t.Fatalf("request %s %s: %v", subject, body, err)
	}
	if err := protocol.ParseReply(m.Data, v); err != nil {
		var pe *protocol.Error
		if !errors.As(err, &pe) {
			t.Fatalf("unparseable reply %q: %v", m.Data, err)
		}
		if got := m.Header.Get("Nats-Service-Error-Code"); got != string(pe.Code) {
			t.Errorf("error header code %q, body code %q", got, pe.Code)
		}
		return pe
	}
	return nil
}

// TestLockLifecycleAcrossRestart walks the session: acquire,
// held, wrong token, release, re-acquire with a larger token, restart,
// same state, next token larger than all before.
func TestLockLifecycleAcrossRestart(t *testing.T) {
	dir := t.TempDir()
	d := startNode(t, dir, daemon.Options{})
	_, cl := connect(t, d)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	l1, err := cl.Acquire(ctx, "k", sdk.WithLease(10*time.Second), sdk.WithOwner("alice"))
	if err != nil {
		t.Fatalf("acquire: %v", err)
	}
	if _, err := cl.Acquire(ctx, "k", sdk.WithLease(10*time.Second)); !errors.Is(err, sdk.ErrHeld) {
		t.Fatalf("second acquire: got %v, want ErrHeld", err)
	}
	if err := cl.Release(ctx, "k", l1.Token+100); !errors.Is(err, sdk.ErrNotFound) {
		t.Fatalf("wrong-token release: got %v, want ErrNotFound", err)
	}
	if h, err := cl.Get(ctx, "k"); err != nil || !h.Held || h.Token != l1.Token || h.Owner != "alice" {
		t.Fatalf("after wrong release: %+v %v, want held with token %d", h, err, l1.Token)
	}
	if err := cl.Release(ctx, "k", l1.Token); err != nil {
		t.Fatalf("release: %v", err)
	}
	l2, err := cl.Acquire(ctx, "k", sdk.WithLease(time.Minute), sdk.WithOwner("bob"))
	if err != nil {
		t.Fatalf("re-acquire: %v", err)
	}
	if l2.Token <= l1.Token {
		t.Fatalf("token %d after %d: not increasing", l2.Token, l1.Token)
	}
	before := testcluster.StateOf(d)
	d.Close()

	d = startNode(t, dir, daemon.Options{})
	defer d.Close()
	after := testcluster.StateOf(d)
	if after.Digest != before.Digest || after.LastToken != before.LastToken {
		t.Fatalf("state changed across restart: last token %d -> %d", before.LastToken, after.LastToken)
	}
	_, cl = connect(t, d)
	h, err := cl.Get(ctx, "k")
	if err != nil || !h.Held || h.Token != l2.Token || h.Owner != "bob" {
		t.Fatalf("after restart: %+v %v, want held by bob with token %d", h, err, l2.Token)
	}
	// A restarted leader re-arms with the full lease: never shorter.
	if h.Remaining < 50*time.Second {
		t.Fatalf("remaining %v after restart, want close to the full minute", h.Remaining)
	}
	l3, err := cl.Acquire(ctx, "other", sdk.WithLease(time.Second))
	if err != nil {
		t.Fatalf("acquire after restart: %v", err)
	}
	if l3.Token <= l2.Token {
		t.Fatalf("token %d after restart is not above %d", l3.Token, l2.Token)
	}
}

// TestLeaseExpiresByCommittedExpire: a 500 ms lease disappears through an
// applied Expire, and a late Expire for the old token leaves the next
// holder alone.
func TestLeaseExpiresByCommittedExpire(t *testing.T) {
	d := startNode(t, t.TempDir(), daemon.Options{})
	defer d.Close()
	_, cl := connect(t, d)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	l, err := cl.Acquire(ctx, "short", sdk.WithLease(500*time.Millisecond))
	if err != nil {
		t.Fatalf("acquire: %v", err)
	}
	start := time.Now()
	expiries := func() float64 { return counterValue(t, d, "ticketd_expiries_total", "existed", "true") }
	testkit.Eventually(t, 5*time.Second, "expire applied", func() bool { return expiries() == 1 })
	if el := time.Since(start); el < 400*time.Millisecond {
		t.Fatalf("expired after %v, before its 500ms lease", el)
	}
	if h, err := cl.Get(ctx, "short"); err != nil || h.Held {
		t.Fatalf("after expiry: %+v %v, want free", h, err)
	}
	l2, err := cl.Acquire(ctx, "short", sdk.WithLease(time.Minute))
	if err != nil {
		t.Fatalf("re-acquire: %v", err)
	}
	// A late or duplicated Expire for the first token.
	a, err := d.Node().Propose(ctx, core.Expire("short", l.Token))
	if err != nil {
		t.Fatalf("propose late expire: %v", err)
	}
	if a.Result.Kind != core.ResultExpired || a.Result.Existed {
		t.Fatalf("late expire applied as %v, want expired{existed:false}", a.Result)
	}
	if h, err := cl.Get(ctx, "short"); err != nil || !h.Held || h.Token != l2.Token {
		t.Fatalf("after late expire: %+v %v, want held with token %d", h, err, l2.Token)
	}
}

// TestBadInputChangesNothing sends hostile payloads on the wire and checks
// the stable codes and that no entry was applied.
func TestBadInputChangesNothing(t *testing.T) {
	d := startNode(t, t.TempDir(), daemon.Options{})
	defer d.Close()
	nc, _ := connect(t, d)
	var ok protocol.AcquireReply
	if e := rawRequest(t, nc, protocol.SubjectAcquire, `{"key":"held","lease_ms":60000}`, &ok); e != nil {
		t.Fatalf("setup acquire: %v", e)
	}
	before := testcluster.StateOf(d)
	big := strings.Repeat("x", 10*1024)
	cases := []struct {
		name, subject, body string
		code                protocol.Code
	}{
		{"empty key", protocol.SubjectAcquire, `{"key":"","lease_ms":1000}`, protocol.CodeInvalidArgument},
		{"missing key", protocol.SubjectAcquire, `{"lease_ms":1000}`, protocol.CodeInvalidArgument},
		{"10KB key", protocol.SubjectAcquire, `{"key":"` + big + `","lease_ms":1000}`, protocol.CodeTooLarge},
		{"513 byte key", protocol.SubjectAcquire, `{"key":"` + strings.Repeat("k", 513) + `","lease_ms":1000}`, protocol.CodeInvalidArgument},
		{"lease 0", protocol.SubjectAcquire, `{"key":"a","lease_ms":0}`, protocol.CodeInvalidArgument},
		{"lease -5", protocol.SubjectAcquire, `{"key":"a","lease_ms":-5}`, protocol.CodeInvalidArgument},
		{"lease 10 years", protocol.SubjectAcquire, `{"key":"a","lease_ms":315360000000}`, protocol.CodeInvalidArgument},
		{"lease as string", protocol.SubjectAcquire, `{"key":"a","lease_ms":"10s"}`, protocol.CodeMalformed},
		{"wait negative", protocol.SubjectAcquire, `{"key":"a","lease_ms":1000,"wait_ms":-1}`, protocol.CodeInvalidArgument},
		{"owner too long", protocol.SubjectAcquire, `{"key":"a","lease_ms":1000,"owner":"` + strings.Repeat("o", 257) + `"}`, protocol.CodeInvalidArgument},
		{"malformed JSON", protocol.SubjectAcquire, `{"key":`, protocol.CodeMalformed},
		{"not an object", protocol.SubjectAcquire, `[1,2]`, protocol.CodeMalformed},
		{"empty body", protocol.SubjectAcquire, ``, protocol.CodeMalformed},
		{"trailing data", protocol.SubjectAcquire, `{"key":"a","lease_ms":1000} {}`, protocol.CodeMalformed},
		{"unknown field", protocol.SubjectAcquire, `{"key":"a","lease_ms":1000,"token":7}`, protocol.CodeMalformed},
		{"held key", protocol.SubjectAcquire, `{"key":"held","lease_ms":1000}`, protocol.CodeHeld},
		{"release wrong token", protocol.SubjectRelease, `{"key":"held","token":999}`, protocol.CodeNotFound},
		{"release token 0", protocol.SubjectRelease, `{"key":"held","token":0}`, protocol.CodeInvalidArgument},
		{"release negative token", protocol.SubjectRelease, `{"key":"held","token":-1}`, protocol.CodeMalformed},
		{"release unknown field", protocol.SubjectRelease, `{"key":"held","token":1,"force":true}`, protocol.CodeMalformed},
		{"get empty key", protocol.SubjectGet, `{"key":""}`, protocol.CodeInvalidArgument},
		{"control on client port", protocol.SubjectPrefix + ".control.bootstrap", `{"credential":"x"}`, protocol.CodeControlRefused},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := rawRequest(t, nc, tc.subject, tc.body, nil)
			if e == nil || e.Code != tc.code {
				t.Fatalf("got %v, want code %s", e, tc.code)
			}
			if e.Message == "" {
				t.Fatalf("error without a message")
			}
		})
	}
	after := testcluster.StateOf(d)
	// The wrong-token release is a real proposal (NotFound); everything
	// else must be refused before the log.
	if after.Applied > before.Applied+1 || after.Digest != before.Digest {
		t.Fatalf("bad input changed state: applied %d -> %d", before.Applied, after.Applied)
	}
}

// TestGrantAfterDeadlineIsReleased is SPEC §4.4's first branch: the Grant
// applies after the requester's declared deadline, so the leader releases
// it with the exact token and the key is free again.
func TestGrantAfterDeadlineIsReleased(t *testing.T) {
	d := startNode(t, t.TempDir(), daemon.Options{})
	defer d.Close()
	nc, cl := connect(t, d)
	// timeout_ms=1: the deadline (minus the reply margin) has passed
	// before the Grant can apply.
	e := rawRequest(t, nc, protocol.SubjectAcquire, `{"key":"late","lease_ms":60000,"timeout_ms":1}`, nil)
	if e == nil || e.Code != protocol.CodeTimeout {
		t.Fatalf("got %v, want timeout", e)
	}
	testkit.Eventually(t, 5*time.Second, "abandoned grant released", func() bool {
		return counterValue(t, d, "ticketd_releases_total", "", "") == 1
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	h, err := cl.Get(ctx, "late")
	if err != nil || h.Held {
		t.Fatalf("late grant still held: %+v %v", h, err)
	}
	if v := counterValue(t, d, "ticketd_grants_abandoned_total", "", ""); v != 1 {
		t.Fatalf("abandoned grants = %v, want 1", v)
	}
}

// TestLostReplyExpiresWithinLease is SPEC §4.4's second branch: the reply
// was written but never reached the requester (its connection dropped).
// The leader cannot know, so it does not release: the lock stays and then
// expires through a committed Expire within its lease.
func TestLostReplyExpiresWithinLease(t *testing.T) {
	d := startNode(t, t.TempDir(), daemon.Options{})
	defer d.Close()
	_, cl := connect(t, d)
	gone, err := nats.Connect(d.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	inbox := nats.NewInbox()
	body := `{"key":"orphan","lease_ms":700,"timeout_ms":5000}`
	if err := gone.PublishRequest(protocol.SubjectAcquire, inbox, []byte(body)); err != nil {
		t.Fatal(err)
	}
	if err := gone.Flush(); err != nil {
		t.Fatal(err)
	}
	gone.Close() // the requester vanishes before the reply
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var token uint64
	testkit.Eventually(t, 5*time.Second, "orphan granted", func() bool {
		h, err := cl.Get(ctx, "orphan")
		token = h.Token
		return err == nil && h.Held
	})
	testkit.Eventually(t, 5*time.Second, "orphan expired", func() bool {
		return counterValue(t, d, "ticketd_expiries_total", "existed", "true") == 1
	})
	if h, err := cl.Get(ctx, "orphan"); err != nil || h.Held {
		t.Fatalf("orphan (token %d) still held: %+v %v", token, h, err)
	}
	if v := counterValue(t, d, "ticketd_releases_total", "", ""); v != 0 {
		t.Fatalf("leader guessed and released (%v releases)", v)
	}
}

// TestSDKIndeterminateWhenReplyIsLate: the SDK stops waiting before the
// leader answers (a slow policy holds the request) and sends exactly one
// acquire. It never guesses: it settles the request with a withdraw by
// request_id, which at cluster version 6 is a Settle applied before the
// held attempt's Grant, so the outcome is definite ("gave up", the
// context's error, no code) and that Grant is refused when it applies:
// nothing is granted, nothing is left to release. (Before version 6 the
// withdraw found the attempt in progress and the SDK reported
// ErrIndeterminate; the leader then released the late grant.)
func TestSDKIndeterminateWhenReplyIsLate(t *testing.T) {
	release := make(chan struct{})
	d := startNode(t, t.TempDir(), daemon.Options{Policy: slowPolicy{release}})
	defer d.Close()
	_, cl := connect(t, d)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err := cl.Acquire(ctx, "slow", sdk.WithLease(time.Minute))
	close(release)
	if sdk.CodeOf(err) != "" || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v, want the context's error without a code (settled)", err)
	}
	// The held attempt proposes its Grant once the policy lets it, and
	// the Grant is refused against the settled request.
	testkit.Eventually(t, 5*time.Second, "the late grant proposed", func() bool {
		return counterValue(t, d, "ticketd_proposals_total", "kind", "grant") == 1
	})
	if v := counterValue(t, d, "ticketd_proposals_total", "kind", "settle"); v != 1 {
		t.Fatalf("%v settles proposed, want 1", v)
	}
	if v := counterValue(t, d, "ticketd_grants_total", "", ""); v != 0 {
		t.Fatalf("%v grants applied, want 0 (the request was settled)", v)
	}
	gctx, gcancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer gcancel()
	if h, err := cl.Get(gctx, "slow"); err != nil || h.Held {
		t.Fatalf("the key of a settled request: %+v %v, want free", h, err)
	}
}

type slowPolicy struct{ release chan struct{} }

func (p slowPolicy) ValidateGrant(ctx context.Context, g plugins.Grant) (plugins.Verdict, error) {
	<-p.release
	return plugins.Verdict{Allow: true}, nil
}

// TestWaitQueueFIFO: waiters get the key in arrival order as it frees.
func TestWaitQueueFIFO(t *testing.T) {
	d := startNode(t, t.TempDir(), daemon.Options{})
	defer d.Close()
	_, cl := connect(t, d)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	first, err := cl.Acquire(ctx, "q", sdk.WithLease(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	type got struct {
		who int
		l   *sdk.Lock
		err error
	}
	results := make(chan got, 3)
	for i := 0; i < 3; i++ {
		i := i
		go func() {
			l, err := cl.Acquire(ctx, "q", sdk.WithLease(time.Minute), sdk.WithWait(10*time.Second))
			results <- got{i, l, err}
		}()
		testkit.Eventually(t, 5*time.Second, "waiter queued", func() bool {
			return gaugeValue(t, d, "ticketd_waiters") == float64(i+1)
		})
	}
	prev := first
	for i := 0; i < 3; i++ {
		if err := cl.Release(ctx, "q", prev.Token); err != nil {
			t.Fatalf("release %d: %v", prev.Token, err)
		}
		r := <-results
		if r.err != nil {
			t.Fatalf("waiter %d: %v", r.who, r.err)
		}
		if r.who != i {
			t.Fatalf("waiter %d served as #%d: not FIFO", r.who, i)
		}
		if r.l.Token <= prev.Token {
			t.Fatalf("token %d not above %d", r.l.Token, prev.Token)
		}
		prev = r.l
	}
	// A waiter whose wait runs out gets timeout and nothing is granted.
	_, err = cl.Acquire(ctx, "q", sdk.WithLease(time.Minute), sdk.WithWait(200*time.Millisecond))
	if !errors.Is(err, sdk.ErrTimeout) {
		t.Fatalf("got %v, want ErrTimeout", err)
	}
}

func metricFamilies(t testing.TB, d *daemon.Daemon) map[string][]metricSample {
	t.Helper()
	mfs, err := d.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]metricSample{}
	for _, mf := range mfs {
		for _, m := range mf.Metric {
			s := metricSample{labels: map[string]string{}}
			for _, lp := range m.Label {
				s.labels[lp.GetName()] = lp.GetValue()
			}
			switch {
			case m.Counter != nil:
				s.value = m.Counter.GetValue()
			case m.Gauge != nil:
				s.value = m.Gauge.GetValue()
			}
			out[mf.GetName()] = append(out[mf.GetName()], s)
		}
	}
	return out
}

type metricSample struct {
	labels map[string]string
	value  float64
}

func counterValue(t testing.TB, d *daemon.Daemon, name, label, value string) float64 {
	t.Helper()
	var sum float64
	for _, s := range metricFamilies(t, d)[name] {
		if label == "" || s.labels[label] == value {
			sum += s.value
		}
	}
	return sum
}

func gaugeValue(t testing.TB, d *daemon.Daemon, name string) float64 {
	return counterValue(t, d, name, "", "")
}

// histogramMean is sum/count of a histogram metric.
func histogramMean(t testing.TB, d *daemon.Daemon, name string) float64 {
	t.Helper()
	mfs, err := d.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.Metric) > 0 && mf.Metric[0].Histogram != nil {
			h := mf.Metric[0].Histogram
			if h.GetSampleCount() == 0 {
				return 0
			}
			return h.GetSampleSum() / float64(h.GetSampleCount())
		}
	}
	return 0
}

func acquireParams(key string, lease time.Duration) lockservice.AcquireParams {
	return lockservice.AcquireParams{Key: key, Lease: lease, Timeout: 5 * time.Second}
}

func TestMetricsAndHealthEndpoints(t *testing.T) {
	cfg := daemon.Defaults()
	cfg.Data = t.TempDir()
	cfg.NATSListen = "127.0.0.1:0"
	cfg.MetricsListen = testkit.FreeAddr(t)
	cfg.TickMS = testkit.TickMS
	d, err := daemon.Start(context.Background(), cfg, daemon.Options{Logger: testkit.QuietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	testkit.Eventually(t, 10*time.Second, "node leads at the newest cluster version", func() bool { return testcluster.Settled(d) })
	_, cl := connect(t, d)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := cl.Acquire(ctx, "m", sdk.WithLease(time.Second)); err != nil {
		t.Fatal(err)
	}
	get := func(path string) (int, string) {
		resp, err := http.Get("http://" + cfg.MetricsListen + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, _ := get("/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz %d", code)
	}
	if code, body := get("/readyz"); code != http.StatusOK {
		t.Fatalf("/readyz %d %s", code, body)
	}
	code, body := get("/metrics")
	for _, want := range []string{"ticketd_grants_total 1", "ticketd_fsync_seconds_bucket", "ticketd_apply_batch_seconds_count",
		"ticketd_proposals_total{kind=\"grant\"} 1", "ticketd_is_leader 1", "ticketd_leader_changes_total", "ticketd_waiters 0",
		"ticketd_read_index_rounds_total", "ticketd_read_index_reads_total"} {
		if code != http.StatusOK || !strings.Contains(body, want) {
			t.Fatalf("/metrics (%d) lacks %q", code, want)
		}
	}
}
