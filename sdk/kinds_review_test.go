package sdk_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ticketd/ticketd/daemon"
	"github.com/ticketd/ticketd/internal/testkit"
	"github.com/ticketd/ticketd/internal/testkit/testcluster"
	"github.com/ticketd/ticketd/transports/protocol"
)

// Review of issue 25's API phase (docs/protocol.md §12) through a real
// node over NATS, with raw requests so that the SDK's own checks do not
// hide the server's answers.

// rawReply is a decoded reply: its fields, and the error code and message
// of an error reply.
type rawReply struct {
	v    map[string]any
	code string
	msg  string
}

func (r rawReply) num(field string) uint64 {
	f, _ := r.v[field].(float64)
	return uint64(f)
}

func rawReq(t *testing.T, nc *nats.Conn, subject string, body string) rawReply {
	t.Helper()
	m, err := nc.Request(subject, []byte(body), 10*time.Second)
	if err != nil {
		t.Fatalf("%s %s: %v", subject, body, err)
	}
	var r rawReply
	if err := json.Unmarshal(m.Data, &r.v); err != nil {
		t.Fatalf("%s %s: reply %q: %v", subject, body, m.Data, err)
	}
	if e, ok := r.v["error"].(map[string]any); ok {
		r.code, _ = e["code"].(string)
		r.msg, _ = e["message"].(string)
	}
	return r
}

func rawConn(t *testing.T, c *testcluster.Cluster, i int) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(c.ClientURL(i))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// rawAcquire sends an acquire and wants a grant; it returns the token.
func rawAcquire(t *testing.T, nc *nats.Conn, body string) uint64 {
	t.Helper()
	r := rawReq(t, nc, protocol.SubjectAcquire, body)
	if r.code != "" || r.num("token") == 0 {
		t.Fatalf("acquire %s: %v", body, r.v)
	}
	return r.num("token")
}

// TestReviewKindsDocClaims checks §12's claims one by one on a real node:
// the field bounds and their messages, the limit mismatch naming the
// key's limit in the documented words, held, check/release/renew per
// holder with a foreign, stale or other key's token, and get/list.
func TestReviewKindsDocClaims(t *testing.T) {
	c, lead := cluster(t, 1)
	nc := rawConn(t, c, lead)
	t1 := rawAcquire(t, nc, `{"key":"pool/gpu","limit":2,"lease_ms":60000,"owner":"w1"}`)
	t2 := rawAcquire(t, nc, `{"key":"pool/gpu","limit":2,"lease_ms":60000,"owner":"w2"}`)
	r1 := rawAcquire(t, nc, `{"key":"config/db","mode":"shared","lease_ms":60000,"owner":"r1"}`)
	r2 := rawAcquire(t, nc, `{"key":"config/db","mode":"shared","lease_ms":60000,"owner":"r2"}`)
	m1 := rawAcquire(t, nc, `{"key":"plain","lease_ms":60000,"owner":"m"}`)
	if !(t1 < t2 && t2 < r1 && r1 < r2) {
		t.Fatalf("tokens %d %d %d %d not rising", t1, t2, r1, r2)
	}

	for _, tc := range []struct {
		name, body, code, msg string
	}{
		{"limit above the maximum", `{"key":"x","limit":1025,"lease_ms":1000}`, "invalid_argument", "limit 1025 is outside [0, 1024]"},
		{"negative limit", `{"key":"x","limit":-1,"lease_ms":1000}`, "invalid_argument", "limit -1 is outside [0, 1024]"},
		{"huge limit", `{"key":"x","limit":4294967298,"lease_ms":1000}`, "invalid_argument", "outside [0, 1024]"},
		{"unknown mode", `{"key":"x","mode":"SHARED","lease_ms":1000}`, "invalid_argument", "mode"},
		{"shared semaphore", `{"key":"x","limit":2,"mode":"shared","lease_ms":1000}`, "invalid_argument", "a semaphore (limit 2) has no shared mode"},
		{"full semaphore", `{"key":"pool/gpu","limit":2,"lease_ms":60000}`, "held", ""},
		{"other limit", `{"key":"pool/gpu","limit":3,"lease_ms":60000}`, "invalid_argument",
			`key "pool/gpu" has limit 2, the acquire asked for limit 3: every holder and waiter of a key names the same limit`},
		{"mutex on a semaphore", `{"key":"pool/gpu","lease_ms":60000}`, "invalid_argument", "has limit 2, the acquire asked for limit 1"},
		{"explicit limit 1 on a semaphore", `{"key":"pool/gpu","limit":1,"lease_ms":60000}`, "invalid_argument", "has limit 2, the acquire asked for limit 1"},
		{"shared on a semaphore", `{"key":"pool/gpu","mode":"shared","lease_ms":60000}`, "invalid_argument", "has limit 2, the acquire asked for limit 1"},
		{"semaphore on a shared key", `{"key":"config/db","limit":2,"lease_ms":60000}`, "invalid_argument", `key "config/db" has limit 1, the acquire asked for limit 2`},
		{"semaphore on a mutex", `{"key":"plain","limit":2,"lease_ms":60000}`, "invalid_argument", `key "plain" has limit 1, the acquire asked for limit 2`},
		{"waiting semaphore on a mutex", `{"key":"plain","limit":2,"lease_ms":60000,"wait_ms":100}`, "invalid_argument", `key "plain" has limit 1, the acquire asked for limit 2`},
		{"exclusive on a shared key", `{"key":"config/db","lease_ms":60000}`, "held", ""},
		{"shared on a mutex", `{"key":"plain","mode":"shared","lease_ms":60000}`, "held", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := rawReq(t, nc, protocol.SubjectAcquire, tc.body)
			if r.code != tc.code || !strings.Contains(r.msg, tc.msg) {
				t.Fatalf("%s: %v, want %s %q", tc.body, r.v, tc.code, tc.msg)
			}
		})
	}

	// Check: any current holder is current; otherwise false with the
	// oldest holder's token.
	for _, tc := range []struct {
		key     string
		token   uint64
		current bool
		want    uint64
	}{
		{"pool/gpu", t1, true, t1}, {"pool/gpu", t2, true, t2},
		{"pool/gpu", r1, false, t1}, {"pool/gpu", m1 + 100, false, t1},
		{"config/db", r2, true, r2}, {"config/db", t2, false, r1},
	} {
		r := rawReq(t, nc, protocol.SubjectCheck, fmt.Sprintf(`{"key":%q,"token":%d}`, tc.key, tc.token))
		if r.code != "" || r.v["current"] != tc.current || r.num("token") != tc.want {
			t.Errorf("check %s %d: %v, want current %v token %d", tc.key, tc.token, r.v, tc.current, tc.want)
		}
	}

	// Release and renew with a token of another key, or a future one:
	// not_found, and every holder stays.
	for _, body := range []string{
		fmt.Sprintf(`{"key":"pool/gpu","token":%d}`, r1),
		fmt.Sprintf(`{"key":"config/db","token":%d}`, t1),
		fmt.Sprintf(`{"key":"pool/gpu","token":%d}`, m1+100),
		fmt.Sprintf(`{"key":"pool/gpu","token":%d}`, 0),
	} {
		if r := rawReq(t, nc, protocol.SubjectRelease, body); r.code != "not_found" && r.code != "invalid_argument" {
			t.Errorf("release %s: %v, want not_found", body, r.v)
		}
		if r := rawReq(t, nc, protocol.SubjectRenew, strings.TrimSuffix(body, "}")+`,"lease_ms":60000}`); r.code != "not_found" && r.code != "invalid_argument" {
			t.Errorf("renew %s: %v, want not_found", body, r.v)
		}
	}

	// Get: the kind, every holder in token order, the oldest on top.
	g := rawReq(t, nc, protocol.SubjectGet, `{"key":"pool/gpu"}`)
	hs, _ := g.v["holders"].([]any)
	if g.num("limit") != 2 || g.num("token") != t1 || g.v["owner"] != "w1" || len(hs) != 2 || g.v["mode"] != nil {
		t.Fatalf("get pool/gpu: %v", g.v)
	}
	if h := hs[1].(map[string]any); h["token"] != float64(t2) || h["owner"] != "w2" || h["remaining_ms"] == nil {
		t.Fatalf("get pool/gpu second holder: %v", h)
	}
	g = rawReq(t, nc, protocol.SubjectGet, `{"key":"config/db"}`)
	if g.num("limit") != 1 || g.v["mode"] != "shared" || g.num("token") != r1 {
		t.Fatalf("get config/db: %v", g.v)
	}
	g = rawReq(t, nc, protocol.SubjectGet, `{"key":"plain"}`)
	if _, ok := g.v["limit"]; ok || g.v["mode"] != nil || g.v["holders"] != nil {
		t.Fatalf("get plain: %v", g.v)
	}

	// A stale token: the released slot's token is not_found on release,
	// renew, and not current; the other holder keeps its slot.
	if r := rawReq(t, nc, protocol.SubjectRelease, fmt.Sprintf(`{"key":"pool/gpu","token":%d}`, t1)); r.v["released"] != true {
		t.Fatalf("release t1: %v", r.v)
	}
	if r := rawReq(t, nc, protocol.SubjectRelease, fmt.Sprintf(`{"key":"pool/gpu","token":%d}`, t1)); r.code != "not_found" {
		t.Fatalf("second release of t1: %v", r.v)
	}
	if r := rawReq(t, nc, protocol.SubjectRenew, fmt.Sprintf(`{"key":"pool/gpu","token":%d,"lease_ms":60000}`, t1)); r.code != "not_found" {
		t.Fatalf("renew of released t1: %v", r.v)
	}
	if r := rawReq(t, nc, protocol.SubjectCheck, fmt.Sprintf(`{"key":"pool/gpu","token":%d}`, t1)); r.v["current"] != false || r.num("token") != t2 {
		t.Fatalf("check of released t1: %v", r.v)
	}
	// List: one entry per holder, each with its kind and no holders.
	l := rawReq(t, nc, protocol.SubjectList, `{"prefix":""}`)
	locks, _ := l.v["locks"].([]any)
	var got []string
	for _, e := range locks {
		m := e.(map[string]any)
		if m["holders"] != nil {
			t.Errorf("list entry with holders: %v", m)
		}
		got = append(got, fmt.Sprintf("%s/%v/%v/%v", m["key"], m["token"], m["limit"], m["mode"]))
	}
	want := fmt.Sprintf("[config/db/%d/1/shared config/db/%d/1/shared plain/%d/<nil>/<nil> pool/gpu/%d/2/<nil>]", r1, r2, m1, t2)
	if fmt.Sprint(got) != want {
		t.Fatalf("list: %v, want %s", got, want)
	}
	_ = testkit.Eventually
}

// waitRaw sends a waiting acquire in the background and returns once the
// leader has it queued as the n-th waiter of key.
func waitRaw(t *testing.T, c *testcluster.Cluster, lead int, nc *nats.Conn, key, body string, n int) <-chan rawReply {
	t.Helper()
	out := make(chan rawReply, 1)
	go func() {
		var r rawReply
		m, err := nc.Request(protocol.SubjectAcquire, []byte(body), 30*time.Second)
		if err != nil {
			r.code = "transport: " + err.Error()
		} else if err := json.Unmarshal(m.Data, &r.v); err != nil {
			r.code = "decode: " + err.Error()
		} else if e, ok := r.v["error"].(map[string]any); ok {
			r.code, _ = e["code"].(string)
			r.msg, _ = e["message"].(string)
		}
		out <- r
	}()
	testkit.Eventually(t, 10*time.Second, body+" queued", func() bool { return c.Node(lead).Locks().Waiting(key) == n })
	return out
}

func granted(t *testing.T, name string, ch <-chan rawReply) uint64 {
	t.Helper()
	select {
	case r := <-ch:
		if r.code != "" || r.num("token") == 0 {
			t.Fatalf("%s: %v %s %s", name, r.v, r.code, r.msg)
		}
		return r.num("token")
	case <-time.After(5 * time.Second):
		t.Fatalf("%s was not granted", name)
	}
	return 0
}

func notYet(t *testing.T, name string, ch <-chan rawReply) {
	t.Helper()
	select {
	case r := <-ch:
		t.Fatalf("%s answered out of turn: %v %s", name, r.v, r.code)
	case <-time.After(200 * time.Millisecond):
	}
}

// TestReviewKindsQueueGivesUp: a waiter that gives up in the middle or at
// the head of a key's queue (withdraw, its wait running out) must not
// keep blocking the waiters behind it (§12: the leader serves the head
// while it fits; a waiter that left is no longer in the queue).
func TestReviewKindsQueueGivesUp(t *testing.T) {
	c, lead := cluster(t, 1)
	nc := rawConn(t, c, lead)

	t.Run("writer withdraws before a reader", func(t *testing.T) {
		r1 := rawAcquire(t, nc, `{"key":"rw1","mode":"shared","lease_ms":60000}`)
		w := waitRaw(t, c, lead, nc, "rw1", `{"key":"rw1","lease_ms":60000,"wait_ms":20000,"wait_id":"w"}`, 1)
		r2 := waitRaw(t, c, lead, nc, "rw1", `{"key":"rw1","mode":"shared","lease_ms":60000,"wait_ms":20000}`, 2)
		if r := rawReq(t, nc, protocol.SubjectWithdraw, `{"key":"rw1","wait_id":"w"}`); r.v["withdrawn"] != true {
			t.Fatalf("withdraw: %v", r.v)
		}
		if tok := granted(t, "the reader behind the withdrawn writer", r2); tok <= r1 {
			t.Fatalf("reader token %d", tok)
		}
		if r := <-w; r.code != "timeout" {
			t.Fatalf("withdrawn writer: %v %s", r.v, r.code)
		}
	})
	t.Run("writer's wait runs out before a reader", func(t *testing.T) {
		rawAcquire(t, nc, `{"key":"rw2","mode":"shared","lease_ms":60000}`)
		w := waitRaw(t, c, lead, nc, "rw2", `{"key":"rw2","lease_ms":60000,"wait_ms":500}`, 1)
		r2 := waitRaw(t, c, lead, nc, "rw2", `{"key":"rw2","mode":"shared","lease_ms":60000,"wait_ms":20000}`, 2)
		if r := <-w; r.code != "timeout" {
			t.Fatalf("writer: %v %s", r.v, r.code)
		}
		granted(t, "the reader behind the timed-out writer", r2)
	})
	t.Run("semaphore waiter withdraws in the middle", func(t *testing.T) {
		h1 := rawAcquire(t, nc, `{"key":"sem","limit":2,"lease_ms":60000}`)
		h2 := rawAcquire(t, nc, `{"key":"sem","limit":2,"lease_ms":60000}`)
		a := waitRaw(t, c, lead, nc, "sem", `{"key":"sem","limit":2,"lease_ms":60000,"wait_ms":20000}`, 1)
		b := waitRaw(t, c, lead, nc, "sem", `{"key":"sem","limit":2,"lease_ms":60000,"wait_ms":20000,"wait_id":"b"}`, 2)
		cc := waitRaw(t, c, lead, nc, "sem", `{"key":"sem","limit":2,"lease_ms":60000,"wait_ms":20000}`, 3)
		// A waiter of another limit is refused at once, not queued.
		if r := rawReq(t, nc, protocol.SubjectAcquire, `{"key":"sem","limit":3,"lease_ms":60000,"wait_ms":20000}`); r.code != "invalid_argument" || !strings.Contains(r.msg, "has limit 2") {
			t.Fatalf("a waiter of limit 3: %v", r.v)
		}
		if r := rawReq(t, nc, protocol.SubjectWithdraw, `{"key":"sem","wait_id":"b"}`); r.v["withdrawn"] != true {
			t.Fatalf("withdraw b: %v", r.v)
		}
		if r := <-b; r.code != "timeout" {
			t.Fatalf("withdrawn b: %v %s", r.v, r.code)
		}
		rawReq(t, nc, protocol.SubjectRelease, fmt.Sprintf(`{"key":"sem","token":%d}`, h1))
		ta := granted(t, "a", a)
		notYet(t, "c", cc)
		rawReq(t, nc, protocol.SubjectRelease, fmt.Sprintf(`{"key":"sem","token":%d}`, h2))
		if tc := granted(t, "c", cc); tc <= ta {
			t.Fatalf("tokens a %d c %d", ta, tc)
		}
	})
	t.Run("readers behind a writer are granted together, up to the next writer", func(t *testing.T) {
		w1 := rawAcquire(t, nc, `{"key":"rw3","lease_ms":60000}`)
		ra := waitRaw(t, c, lead, nc, "rw3", `{"key":"rw3","mode":"shared","lease_ms":60000,"wait_ms":20000}`, 1)
		rb := waitRaw(t, c, lead, nc, "rw3", `{"key":"rw3","mode":"shared","lease_ms":60000,"wait_ms":20000}`, 2)
		w2 := waitRaw(t, c, lead, nc, "rw3", `{"key":"rw3","lease_ms":60000,"wait_ms":20000}`, 3)
		rc := waitRaw(t, c, lead, nc, "rw3", `{"key":"rw3","mode":"shared","lease_ms":60000,"wait_ms":20000}`, 4)
		rawReq(t, nc, protocol.SubjectRelease, fmt.Sprintf(`{"key":"rw3","token":%d}`, w1))
		ta, tb := granted(t, "ra", ra), granted(t, "rb", rb)
		notYet(t, "w2", w2)
		notYet(t, "rc", rc)
		if r := rawReq(t, nc, protocol.SubjectAcquire, `{"key":"rw3","mode":"shared","lease_ms":60000}`); r.code != "held" {
			t.Fatalf("shared try while a writer waits: %v", r.v)
		}
		rawReq(t, nc, protocol.SubjectRelease, fmt.Sprintf(`{"key":"rw3","token":%d}`, ta))
		notYet(t, "w2", w2)
		rawReq(t, nc, protocol.SubjectRelease, fmt.Sprintf(`{"key":"rw3","token":%d}`, tb))
		tw := granted(t, "w2", w2)
		if tw <= tb || tw <= ta {
			t.Fatalf("writer token %d not above readers' %d %d", tw, ta, tb)
		}
		notYet(t, "rc", rc)
		rawReq(t, nc, protocol.SubjectRelease, fmt.Sprintf(`{"key":"rw3","token":%d}`, tw))
		granted(t, "rc", rc)
	})
}

// TestReviewKindsRequestIDRetry: a retried semaphore acquire (§5.1) is
// answered with the first grant's token, never a second slot: while the
// semaphore has room, once it is full, and while the first attempt waits
// (the retry takes over the wait, so the queue holds it once).
func TestReviewKindsRequestIDRetry(t *testing.T) {
	c, lead := cluster(t, 1)
	nc := rawConn(t, c, lead)
	body := `{"key":"sem","limit":3,"lease_ms":60000,"request_id":"r-1"}`
	first := rawAcquire(t, nc, body)
	holders := func() int {
		hs, _ := rawReq(t, nc, protocol.SubjectGet, `{"key":"sem"}`).v["holders"].([]any)
		return len(hs)
	}
	for i, want := range []int{1, 3} {
		r := rawReq(t, nc, protocol.SubjectAcquire, body)
		if r.num("token") != first || r.v["repeated"] != true {
			t.Fatalf("retry %d: %v, want token %d repeated", i, r.v, first)
		}
		if got := holders(); got != want {
			t.Fatalf("retry %d: %d holders, want %d", i, got, want)
		}
		if i == 0 {
			rawAcquire(t, nc, `{"key":"sem","limit":3,"lease_ms":60000}`)
			rawAcquire(t, nc, `{"key":"sem","limit":3,"lease_ms":60000}`)
		}
	}
	// The same request id with another limit is not a new acquire either.
	if r := rawReq(t, nc, protocol.SubjectAcquire, `{"key":"sem","limit":4,"lease_ms":60000,"request_id":"r-1"}`); r.num("token") != first && r.code != "invalid_argument" {
		t.Fatalf("retry naming limit 4: %v", r.v)
	}

	// A waiting attempt and its retry: one waiter, one slot.
	wbody := `{"key":"sem","limit":3,"lease_ms":60000,"wait_ms":20000,"request_id":"r-2"}`
	a := waitRaw(t, c, lead, nc, "sem", wbody, 1)
	b := make(chan rawReply, 1)
	go func() {
		m, err := nc.Request(protocol.SubjectAcquire, []byte(wbody), 30*time.Second)
		var r rawReply
		if err == nil && json.Unmarshal(m.Data, &r.v) == nil {
			if e, ok := r.v["error"].(map[string]any); ok {
				r.code, _ = e["code"].(string)
			}
		}
		b <- r
	}()
	if n := c.Node(lead).Locks().Waiting("sem"); n != 1 {
		t.Fatalf("%d waiters after the retry, want 1", n)
	}
	if r := rawReq(t, nc, protocol.SubjectRelease, fmt.Sprintf(`{"key":"sem","token":%d}`, first)); r.v["released"] != true {
		t.Fatalf("release: %v", r.v)
	}
	// Whether the retry attached before the grant (the first attempt is
	// then answered indeterminate) or after (it is answered with the
	// recorded grant), the two attempts hold one slot, one token.
	var tok uint64
	for _, ch := range []<-chan rawReply{a, b} {
		select {
		case r := <-ch:
			switch {
			case r.code == "indeterminate":
			case r.code == "" && (tok == 0 || r.num("token") == tok):
				tok = r.num("token")
			default:
				t.Fatalf("an attempt: %v %s", r.v, r.code)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("an attempt was not answered")
		}
	}
	if tok == 0 {
		t.Fatal("neither attempt got the grant")
	}
	if got := holders(); got != 3 {
		t.Fatalf("%d holders after the retry's grant, want 3", got)
	}
	if r := rawReq(t, nc, protocol.SubjectAcquire, wbody); r.num("token") != tok || r.v["repeated"] != true {
		t.Fatalf("a third send: %v, want token %d", r.v, tok)
	}
	if got := holders(); got != 3 {
		t.Fatalf("%d holders after a third send, want 3", got)
	}
}

// TestReviewKindsSessionsAndDelay: a session's close ends each of its
// holders (slots of a semaphore, shared holds); a failed semaphore
// holder's lock-delay keeps exactly one slot occupied until it ends.
func TestReviewKindsSessionsAndDelay(t *testing.T) {
	c, lead := cluster(t, 1)
	nc := rawConn(t, c, lead)
	open := rawReq(t, nc, protocol.SubjectSessionOpen, `{"ttl_ms":60000,"lock_delay_ms":5000}`)
	sess, _ := open.v["session"].(string)
	if sess == "" {
		t.Fatalf("open: %v", open.v)
	}
	for _, body := range []string{
		`{"key":"s/sem","limit":3,"session":%q}`, `{"key":"s/sem","limit":3,"session":%q}`,
		`{"key":"s/rw","mode":"shared","session":%q}`, `{"key":"s/rw","mode":"shared","session":%q}`,
	} {
		rawAcquire(t, nc, fmt.Sprintf(body, sess))
	}
	other := rawAcquire(t, nc, `{"key":"s/sem","limit":3,"lease_ms":60000}`)
	if r := rawReq(t, nc, protocol.SubjectSessionClose, fmt.Sprintf(`{"session":%q}`, sess)); r.num("released") != 4 {
		t.Fatalf("close: %v, want 4 released", r.v)
	}
	g := rawReq(t, nc, protocol.SubjectGet, `{"key":"s/sem"}`)
	if g.num("token") != other || g.v["holders"] != nil && len(g.v["holders"].([]any)) != 1 {
		t.Fatalf("s/sem after the close: %v", g.v)
	}
	if g := rawReq(t, nc, protocol.SubjectGet, `{"key":"s/rw"}`); g.v["held"] != false {
		t.Fatalf("s/rw after the close: %v", g.v)
	}
	// A close is no failure: both slots are free at once, and a writer
	// gets the read/write key.
	rawAcquire(t, nc, `{"key":"s/sem","limit":3,"lease_ms":60000}`)
	rawAcquire(t, nc, `{"key":"s/sem","limit":3,"lease_ms":60000}`)
	rawAcquire(t, nc, `{"key":"s/rw","lease_ms":60000}`)

	// A failed holder of a semaphore of 2 with a lock-delay.
	rawAcquire(t, nc, `{"key":"d/sem","limit":2,"lease_ms":300,"lock_delay_ms":3000}`)
	keep := rawAcquire(t, nc, `{"key":"d/sem","limit":2,"lease_ms":60000}`)
	testkit.Eventually(t, 10*time.Second, "the short holder expired", func() bool {
		return rawReq(t, nc, protocol.SubjectGet, `{"key":"d/sem"}`).num("token") == keep
	})
	if r := rawReq(t, nc, protocol.SubjectAcquire, `{"key":"d/sem","limit":2,"lease_ms":60000}`); r.code != "held" {
		t.Fatalf("try beside a holder and a delayed slot: %v", r.v)
	}
	rawReq(t, nc, protocol.SubjectRelease, fmt.Sprintf(`{"key":"d/sem","token":%d}`, keep))
	rawAcquire(t, nc, `{"key":"d/sem","limit":2,"lease_ms":60000}`)
	r := rawReq(t, nc, protocol.SubjectAcquire, `{"key":"d/sem","limit":2,"lease_ms":60000}`)
	if r.code != "held" || delayMS(r) <= 0 || delayMS(r) > 3000 {
		t.Fatalf("second try while one slot is delayed and the other held: %v, want held with delay_ms (when the slot frees)", r.v)
	}
	// The delayed slot comes back when its delay ends, and only then.
	testkit.Eventually(t, 10*time.Second, "the delayed slot freed", func() bool {
		return rawReq(t, nc, protocol.SubjectAcquire, `{"key":"d/sem","limit":2,"lease_ms":60000}`).code == ""
	})
	if r := rawReq(t, nc, protocol.SubjectAcquire, `{"key":"d/sem","limit":2,"lease_ms":60000}`); r.code != "held" {
		t.Fatalf("a third holder of a semaphore of 2: %v", r.v)
	}
}

// TestReviewKindsBounds: §12's bounds through a node: the waiters of one
// key whatever their kind (--max-waiters-per-key), the holders of one key
// (a read/write key's shared holders: resource_exhausted key_holders, a
// bound and not a wait), and the lock-delay of a failed shared holder,
// which delays exclusive acquires only, against a failed writer's, which
// delays everyone.
func TestReviewKindsBounds(t *testing.T) {
	if testing.Short() {
		t.Skip("in-process cluster skipped in -short mode")
	}
	c := testcluster.New(t, 1, testcluster.WithConfig(func(_ int, cfg *daemon.Config) { cfg.MaxWaitersPerKey = 2 }))
	lead := c.Leader(10 * time.Second)
	testkit.Eventually(t, 10*time.Second, "a settled leader", func() bool { return testcluster.Settled(c.Node(lead)) })
	nc := rawConn(t, c, lead)

	// Two waiters of a full semaphore fill its queue; a read/write key's
	// waiters of both modes count alike.
	rawAcquire(t, nc, `{"key":"b/sem","limit":2,"lease_ms":60000}`)
	rawAcquire(t, nc, `{"key":"b/sem","limit":2,"lease_ms":60000}`)
	waitRaw(t, c, lead, nc, "b/sem", `{"key":"b/sem","limit":2,"lease_ms":60000,"wait_ms":20000}`, 1)
	waitRaw(t, c, lead, nc, "b/sem", `{"key":"b/sem","limit":2,"lease_ms":60000,"wait_ms":20000}`, 2)
	if r := rawReq(t, nc, protocol.SubjectAcquire, `{"key":"b/sem","limit":2,"lease_ms":60000,"wait_ms":20000}`); r.code != "resource_exhausted" {
		t.Fatalf("a third waiter of the semaphore: %v", r.v)
	}
	if r := rawReq(t, nc, protocol.SubjectAcquire, `{"key":"b/sem","limit":2,"lease_ms":60000}`); r.code != "held" || delayMS(r) != 0 {
		t.Fatalf("a try of the full semaphore: %v", r.v)
	}
	rawAcquire(t, nc, `{"key":"b/rw","mode":"shared","lease_ms":60000}`)
	waitRaw(t, c, lead, nc, "b/rw", `{"key":"b/rw","lease_ms":60000,"wait_ms":20000}`, 1)
	waitRaw(t, c, lead, nc, "b/rw", `{"key":"b/rw","mode":"shared","lease_ms":60000,"wait_ms":20000}`, 2)
	if r := rawReq(t, nc, protocol.SubjectAcquire, `{"key":"b/rw","mode":"shared","lease_ms":60000,"wait_ms":20000}`); r.code != "resource_exhausted" {
		t.Fatalf("a third waiter of the read/write key: %v", r.v)
	}

	// 1,024 shared holders, then key_holders, with or without a wait.
	const workers, holders = 8, 1024
	errs := make(chan string, workers)
	for w := 0; w < workers; w++ {
		go func() {
			wc := rawConn(t, c, lead)
			for i := 0; i < holders/workers; i++ {
				m, err := wc.Request(protocol.SubjectAcquire, []byte(`{"key":"b/many","mode":"shared","lease_ms":120000}`), 10*time.Second)
				if err != nil || !strings.Contains(string(m.Data), `"token"`) || strings.Contains(string(m.Data), `"error"`) {
					errs <- fmt.Sprintf("shared holder: %v %s", err, m.Data)
					return
				}
			}
			errs <- ""
		}()
	}
	for w := 0; w < workers; w++ {
		if e := <-errs; e != "" {
			t.Fatal(e)
		}
	}
	for _, body := range []string{
		`{"key":"b/many","mode":"shared","lease_ms":60000}`,
		`{"key":"b/many","mode":"shared","lease_ms":60000,"wait_ms":5000}`,
	} {
		if r := rawReq(t, nc, protocol.SubjectAcquire, body); r.code != "resource_exhausted" || !strings.Contains(r.msg, "key_holders at its limit of 1024") {
			t.Fatalf("shared holder 1025 (%s): %v", body, r.v)
		}
	}
	if r := rawReq(t, nc, protocol.SubjectAcquire, `{"key":"b/many","lease_ms":60000}`); r.code != "held" {
		t.Fatalf("a writer's try beside 1,024 readers: %v", r.v)
	}

	// A failed reader delays writers only.
	rawAcquire(t, nc, `{"key":"b/d","mode":"shared","lease_ms":300,"lock_delay_ms":3000}`)
	testkit.Eventually(t, 10*time.Second, "the reader expired", func() bool {
		return rawReq(t, nc, protocol.SubjectGet, `{"key":"b/d"}`).v["held"] == false
	})
	r2 := rawAcquire(t, nc, `{"key":"b/d","mode":"shared","lease_ms":60000}`)
	rawReq(t, nc, protocol.SubjectRelease, fmt.Sprintf(`{"key":"b/d","token":%d}`, r2))
	// A writer's try is held with delay_ms, as for a mutex's delay (§11):
	// nothing else keeps the writer out.
	if r := rawReq(t, nc, protocol.SubjectAcquire, `{"key":"b/d","lease_ms":60000}`); r.code != "held" || delayMS(r) <= 0 || delayMS(r) > 3000 {
		t.Fatalf("a writer in a failed reader's delay: %v, want held with delay_ms", r.v)
	}
	// A failed writer delays readers too.
	rawAcquire(t, nc, `{"key":"b/x","lease_ms":300,"lock_delay_ms":3000}`)
	testkit.Eventually(t, 10*time.Second, "the writer expired", func() bool {
		return rawReq(t, nc, protocol.SubjectGet, `{"key":"b/x"}`).v["held"] == false
	})
	if r := rawReq(t, nc, protocol.SubjectAcquire, `{"key":"b/x","mode":"shared","lease_ms":60000}`); r.code != "held" {
		t.Fatalf("a reader in a failed writer's delay: %v", r.v)
	}
}

// delayMS is an error reply's delay_ms (0: none).
func delayMS(r rawReply) float64 {
	e, _ := r.v["error"].(map[string]any)
	d, _ := e["delay_ms"].(float64)
	return d
}

// TestReviewKindsGiveUpAfterGrant: the ways a client gives up on a
// semaphore slot it may have been granted release exactly that slot:
// withdraw of a wait granted moments ago (released_token), withdraw by
// request_id, and a waiter whose connection closed before its grant (the
// lost-reply release); the other holders keep theirs.
func TestReviewKindsGiveUpAfterGrant(t *testing.T) {
	c, lead := cluster(t, 1)
	nc := rawConn(t, c, lead)
	keep := rawAcquire(t, nc, `{"key":"g/sem","limit":2,"lease_ms":60000}`)
	holders := func() []uint64 {
		hs, _ := rawReq(t, nc, protocol.SubjectGet, `{"key":"g/sem"}`).v["holders"].([]any)
		var out []uint64
		for _, h := range hs {
			out = append(out, uint64(h.(map[string]any)["token"].(float64)))
		}
		return out
	}
	// Granted with a wait id, then withdrawn: that slot is released.
	w := rawAcquire(t, nc, `{"key":"g/sem","limit":2,"lease_ms":60000,"wait_ms":1000,"wait_id":"gw"}`)
	if r := rawReq(t, nc, protocol.SubjectWithdraw, `{"key":"g/sem","wait_id":"gw"}`); r.num("released_token") != w {
		t.Fatalf("withdraw of a granted wait: %v, want released_token %d", r.v, w)
	}
	if hs := holders(); fmt.Sprint(hs) != fmt.Sprint([]uint64{keep}) {
		t.Fatalf("holders after the withdraw: %v, want [%d]", hs, keep)
	}
	// By request id.
	q := rawAcquire(t, nc, `{"key":"g/sem","limit":2,"lease_ms":60000,"request_id":"gq"}`)
	if r := rawReq(t, nc, protocol.SubjectWithdraw, `{"key":"g/sem","request_id":"gq"}`); r.num("released_token") != q {
		t.Fatalf("withdraw by request id: %v, want released_token %d", r.v, q)
	}
	if hs := holders(); fmt.Sprint(hs) != fmt.Sprint([]uint64{keep}) {
		t.Fatalf("holders after the request id's withdraw: %v, want [%d]", hs, keep)
	}
	// A waiter whose connection is gone when its slot comes.
	full := rawAcquire(t, nc, `{"key":"g/sem","limit":2,"lease_ms":60000}`)
	gone, err := nats.Connect(c.ClientURL(lead))
	if err != nil {
		t.Fatal(err)
	}
	waitRaw(t, c, lead, gone, "g/sem", `{"key":"g/sem","limit":2,"lease_ms":60000,"wait_ms":20000}`, 1)
	next := waitRaw(t, c, lead, nc, "g/sem", `{"key":"g/sem","limit":2,"lease_ms":60000,"wait_ms":20000}`, 2)
	gone.Close()
	rawReq(t, nc, protocol.SubjectRelease, fmt.Sprintf(`{"key":"g/sem","token":%d}`, full))
	tok := granted(t, "the waiter behind the one that left", next)
	if hs := holders(); fmt.Sprint(hs) != fmt.Sprint([]uint64{keep, tok}) {
		t.Fatalf("holders: %v, want [%d %d]", hs, keep, tok)
	}
}

// TestReviewKindsListEveryHolder: §12 says a get that had to leave holders
// out sets holders_more, and that listing the key's prefix reads them
// all. A key whose holders do not fit one NATS message (long keys and
// owners of control characters, which JSON escapes to six bytes: about
// 4.8 KB per entry, so some 200 holders pass the default 1 MB) is cut by
// list between its holders; the reply's next_after_token, passed back as
// after_token with the key as after, reads the rest. Every holder is read
// exactly once, by raw requests and by the SDK's ListAll.
func TestReviewKindsListEveryHolder(t *testing.T) {
	c, lead := cluster(t, 1)
	nc := rawConn(t, c, lead)
	key := strings.Repeat("\u0001", 511) + "k"
	owner := strings.Repeat("\u0001", 256)
	const n = 300
	want := map[uint64]bool{}
	for i := 0; i < n; i++ {
		b, _ := json.Marshal(map[string]any{"key": key, "mode": "shared", "lease_ms": 120000, "owner": owner})
		want[rawAcquire(t, nc, string(b))] = true
	}
	seen, cuts := map[uint64]bool{}, 0
	after, afterToken := "", uint64(0)
	for page := 0; ; page++ {
		if page == 10 {
			t.Fatalf("still paging after %d pages (%d of %d holders read)", page, len(seen), n)
		}
		b, _ := json.Marshal(protocol.ListRequest{After: after, AfterToken: afterToken, Limit: protocol.MaxListLimit})
		r := rawReq(t, nc, protocol.SubjectList, string(b))
		locks, _ := r.v["locks"].([]any)
		for _, l := range locks {
			tok := uint64(l.(map[string]any)["token"].(float64))
			if seen[tok] || !want[tok] {
				t.Fatalf("page %d lists token %d again or a token never granted", page, tok)
			}
			seen[tok] = true
		}
		if r.v["more"] != true || len(locks) == 0 {
			break
		}
		afterToken = r.num("next_after_token")
		if afterToken != 0 {
			cuts++
		}
		after = locks[len(locks)-1].(map[string]any)["key"].(string)
	}
	if len(seen) != n || cuts == 0 {
		t.Fatalf("listing read %d of the key's %d holders, %d pages cut inside the key", len(seen), n, cuts)
	}

	cl := client(t, c, lead)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	seen = map[uint64]bool{}
	for h, err := range cl.ListAll(ctx, "", 0) {
		if err != nil {
			t.Fatal(err)
		}
		if h.Key != key || seen[h.Token] || !want[h.Token] || h.Owner != owner {
			t.Fatalf("ListAll yields %.20q token %d (seen before: %v)", h.Key, h.Token, seen[h.Token])
		}
		seen[h.Token] = true
	}
	if len(seen) != n {
		t.Fatalf("ListAll read %d of the key's %d holders", len(seen), n)
	}
}

// TestReviewKindsSessionExpiryAndMaxLocks: a session that expires with
// two slots of a semaphore of 3 leaves two delayed slots, each blocking
// exactly one slot; and every holder counts in --max-locks like a mutex
// (a slot beyond it is resource_exhausted, not held).
func TestReviewKindsSessionExpiryAndMaxLocks(t *testing.T) {
	if testing.Short() {
		t.Skip("in-process cluster skipped in -short mode")
	}
	c := testcluster.New(t, 1, testcluster.WithConfig(func(_ int, cfg *daemon.Config) { cfg.MaxLocks = 4 }))
	lead := c.Leader(10 * time.Second)
	testkit.Eventually(t, 10*time.Second, "a settled leader", func() bool { return testcluster.Settled(c.Node(lead)) })
	nc := rawConn(t, c, lead)

	sess, _ := rawReq(t, nc, protocol.SubjectSessionOpen, `{"ttl_ms":1000,"lock_delay_ms":4000}`).v["session"].(string)
	if sess == "" {
		t.Fatal("no session")
	}
	for i := 0; i < 2; i++ {
		rawAcquire(t, nc, fmt.Sprintf(`{"key":"e/sem","limit":3,"session":%q}`, sess))
	}
	testkit.Eventually(t, 10*time.Second, "the session expired", func() bool {
		return rawReq(t, nc, protocol.SubjectGet, `{"key":"e/sem"}`).v["held"] == false
	})
	rawAcquire(t, nc, `{"key":"e/sem","limit":3,"lease_ms":60000}`)
	if r := rawReq(t, nc, protocol.SubjectAcquire, `{"key":"e/sem","limit":3,"lease_ms":60000}`); r.code != "held" || delayMS(r) <= 0 {
		t.Fatalf("a try beside two delayed slots and a holder: %v, want held with delay_ms", r.v)
	}

	// --max-locks 4: one holder above, three more slots of another key.
	for i := 0; i < 3; i++ {
		rawAcquire(t, nc, `{"key":"e/big","limit":10,"lease_ms":60000}`)
	}
	if r := rawReq(t, nc, protocol.SubjectAcquire, `{"key":"e/big","limit":10,"lease_ms":60000}`); r.code != "resource_exhausted" {
		t.Fatalf("a fifth lock beside --max-locks 4: %v, want resource_exhausted", r.v)
	}
	if r := rawReq(t, nc, protocol.SubjectAcquire, `{"key":"e/rw","mode":"shared","lease_ms":60000}`); r.code != "resource_exhausted" {
		t.Fatalf("a shared hold beside --max-locks 4: %v, want resource_exhausted", r.v)
	}
}
