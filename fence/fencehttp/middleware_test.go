package fencehttp

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ticketd/ticketd/fence"
	"github.com/ticketd/ticketd/internal/testkit"
)

const cluster = 0x0123456789abcdef

// keys returns a fixed signing key and its public key.
func keys(t *testing.T, first byte) (ed25519.PrivateKey, fence.PublicKey) {
	t.Helper()
	seed := make([]byte, ed25519.SeedSize)
	for i := range seed {
		seed[i] = first + byte(i)
	}
	priv := ed25519.NewKeyFromSeed(seed)
	pub, err := fence.PublicKeyFromPrivate(priv)
	if err != nil {
		t.Fatal(err)
	}
	return priv, pub
}

func sign(t *testing.T, priv ed25519.PrivateKey, clusterID uint64, key string, token uint64) string {
	t.Helper()
	s, err := fence.Sign(priv, clusterID, key, token)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// reply is a response: its status, and its body when it is a refusal.
type reply struct {
	status int
	body   body
	text   string
}

func do(t *testing.T, h http.Handler, fences ...string) reply {
	t.Helper()
	return doCtx(t, context.Background(), h, fences...)
}

func doCtx(t *testing.T, ctx context.Context, h http.Handler, fences ...string) reply {
	t.Helper()
	r := httptest.NewRequestWithContext(ctx, http.MethodPut, "/orders/42", strings.NewReader("data"))
	for _, f := range fences {
		r.Header.Add(Header, f)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	rep := reply{status: w.Code, text: w.Body.String()}
	if w.Code >= 400 {
		if ct := w.Header().Get("Content-Type"); ct != "application/json" {
			t.Fatalf("refusal %d with content type %q", w.Code, ct)
		}
		if err := json.Unmarshal(w.Body.Bytes(), &rep.body); err != nil {
			t.Fatalf("refusal body %q: %v", w.Body.String(), err)
		}
	}
	return rep
}

// echo answers 200 with the fence it found in the context.
var echo = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	f, ok := FromContext(r.Context())
	fmt.Fprintf(w, "%v %q %d", ok, f.Key, f.Token)
})

func TestMiddleware(t *testing.T) {
	priv, pub := keys(t, 0)
	otherPriv, _ := keys(t, 100)
	v, err := fence.NewVerifier(cluster, pub)
	if err != nil {
		t.Fatal(err)
	}
	store := fence.NewMemoryStore(0)
	h := Middleware(v, store)(echo)
	good := sign(t, priv, cluster, "orders/42", 5)
	// good with another token in its payload and its own signature.
	parts := strings.Split(good, ".")
	payload, _ := base64.RawURLEncoding.DecodeString(parts[1])
	payload[24] = 0xff
	forged := parts[0] + "." + base64.RawURLEncoding.EncodeToString(payload) + "." + parts[2]

	for _, tc := range []struct {
		name    string
		fences  []string
		status  int
		code    fence.Code
		current uint64
		echo    string
	}{
		{"a holder writes", []string{good}, 200, "", 0, `true "orders/42" 5`},
		{"the same holder writes again", []string{good}, 200, "", 0, `true "orders/42" 5`},
		{"a former holder is refused", []string{sign(t, priv, cluster, "orders/42", 4)}, 409, fence.CodeStale, 5, ""},
		{"forged: a huge token", []string{sign(t, otherPriv, cluster, "orders/42", 1<<62)}, 403, fence.CodeUnknownKey, 0, ""},
		{"forged: changed payload", []string{forged}, 403, fence.CodeForged, 0, ""},
		{"another cluster", []string{sign(t, priv, cluster+1, "orders/42", 1<<62)}, 403, fence.CodeWrongCluster, 0, ""},
		{"malformed", []string{"hello"}, 400, fence.CodeMalformed, 0, ""},
		{"unknown version", []string{"tf2.AAAA.AAAA"}, 400, fence.CodeUnsupportedVersion, 0, ""},
		{"two headers", []string{good, good}, 400, fence.CodeMalformed, 0, ""},
		{"no header", nil, 428, fence.CodeMissing, 0, ""},
		{"the next holder writes", []string{sign(t, priv, cluster, "orders/42", 9)}, 200, "", 0, `true "orders/42" 9`},
		{"the former holder again", []string{good}, 409, fence.CodeStale, 9, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rep := do(t, h, tc.fences...)
			if rep.status != tc.status || rep.body.Code != tc.code || rep.body.Current != tc.current {
				t.Fatalf("got %d %s", rep.status, rep.text)
			}
			if tc.echo != "" && rep.text != tc.echo {
				t.Fatalf("the handler saw %q, want %q", rep.text, tc.echo)
			}
			if tc.code == fence.CodeStale && (rep.body.Key != "orders/42" || !strings.Contains(rep.body.Message, fmt.Sprint("current token ", tc.current))) {
				t.Fatalf("a stale refusal must say the key and the current token: %s", rep.text)
			}
		})
	}
	// No refused fence moved the store: the forged and foreign huge
	// tokens did not poison it.
	if cur, _ := store.Current("orders/42"); cur != 9 {
		t.Fatalf("the store holds %d, want 9", cur)
	}
}

func TestAllowUnfenced(t *testing.T) {
	priv, pub := keys(t, 0)
	v, _ := fence.NewVerifier(cluster, pub)
	h := Middleware(v, fence.NewMemoryStore(0), AllowUnfenced())(echo)
	if rep := do(t, h); rep.status != 200 || rep.text != `false "" 0` {
		t.Fatalf("no header: %d %s", rep.status, rep.text)
	}
	// A fence that is there is still checked.
	if rep := do(t, h, sign(t, priv, cluster+1, "k", 1)); rep.status != 403 {
		t.Fatalf("a foreign fence with AllowUnfenced: %d %s", rep.status, rep.text)
	}
}

func TestWithKey(t *testing.T) {
	priv, pub := keys(t, 0)
	v, _ := fence.NewVerifier(cluster, pub)
	keyOf := func(r *http.Request) (string, error) {
		if !strings.HasPrefix(r.URL.Path, "/orders/") {
			return "", errors.New("no lock protects " + r.URL.Path)
		}
		return strings.TrimPrefix(r.URL.Path, "/"), nil
	}
	h := Middleware(v, fence.NewMemoryStore(0), WithKey(keyOf))(echo)
	if rep := do(t, h, sign(t, priv, cluster, "orders/42", 1)); rep.status != 200 {
		t.Fatalf("the right key: %d %s", rep.status, rep.text)
	}
	rep := do(t, h, sign(t, priv, cluster, "orders/7", 100))
	if rep.status != 403 || rep.body.Code != fence.CodeWrongKey {
		t.Fatalf("another key's fence: %d %s", rep.status, rep.text)
	}
	r := httptest.NewRequest(http.MethodGet, "/admin", nil)
	r.Header.Set(Header, sign(t, priv, cluster, "orders/42", 1))
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code != 400 || !strings.Contains(w.Body.String(), "no lock protects /admin") {
		t.Fatalf("KeyFunc's error: %d %s", w.Code, w.Body.String())
	}
}

// failingStore fails every Advance with an error that has no code.
type failingStore struct{}

func (failingStore) Advance(context.Context, string, uint64) error {
	return errors.New("connection to db.internal:5432 refused")
}

func TestStoreFailure(t *testing.T) {
	priv, pub := keys(t, 0)
	v, _ := fence.NewVerifier(cluster, pub)
	logs := &strings.Builder{}
	called := false
	h := Middleware(v, failingStore{}, WithLogger(slog.New(slog.NewTextHandler(logs, nil))))(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { called = true }))
	rep := do(t, h, sign(t, priv, cluster, "k", 1))
	if rep.status != 503 || rep.body.Code != fence.CodeUnavailable || called {
		t.Fatalf("a failing store: %d %s, handler called %v", rep.status, rep.text, called)
	}
	if strings.Contains(rep.text, "db.internal") || !strings.Contains(logs.String(), "db.internal") {
		t.Fatalf("the store's error belongs in the log (%q), not the reply (%q)", logs, rep.text)
	}
}

// TestVerifyOnly: with no store the middleware verifies, the handler
// applies the rule itself (here a MemoryStore standing for the
// transaction of its write) and answers with WriteError.
func TestVerifyOnly(t *testing.T) {
	priv, pub := keys(t, 0)
	v, _ := fence.NewVerifier(cluster, pub)
	own := fence.NewMemoryStore(0)
	h := Middleware(v, nil)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f, ok := FromContext(r.Context())
		if !ok {
			t.Error("no fence in the context")
		}
		if err := own.Advance(r.Context(), f.Key, f.Token); err != nil {
			WriteError(w, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	if rep := do(t, h, sign(t, priv, cluster, "k", 3)); rep.status != http.StatusNoContent {
		t.Fatalf("first write: %d %s", rep.status, rep.text)
	}
	if rep := do(t, h, sign(t, priv, cluster, "k", 2)); rep.status != 409 || rep.body.Current != 3 || rep.body.Token != 2 {
		t.Fatalf("stale write: %d %s", rep.status, rep.text)
	}
	if rep := do(t, h, sign(t, otherKey(t), cluster, "k", 4)); rep.status != 403 {
		t.Fatalf("forged write: %d %s", rep.status, rep.text)
	}
}

func otherKey(t *testing.T) ed25519.PrivateKey {
	priv, _ := keys(t, 200)
	return priv
}

// TestKeyLockOrdersWrites is Kleppmann's scenario inside the resource: A
// (token 5) passed the check and is still writing when B (token 6)
// arrives. B must not write until A is done, and A's next write must be
// refused.
func TestKeyLockOrdersWrites(t *testing.T) {
	priv, pub := keys(t, 0)
	v, _ := fence.NewVerifier(cluster, pub)
	mw := Middleware(v, fence.NewMemoryStore(0))
	var (
		mu      sync.Mutex
		written []uint64
	)
	release := make(chan struct{})
	entered := make(chan uint64, 4)
	h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f, _ := FromContext(r.Context())
		entered <- f.Token
		if f.Token == 5 {
			<-release // A is slow to write
		}
		mu.Lock()
		written = append(written, f.Token)
		mu.Unlock()
	}))
	locks := h.(*handler).locks
	done := make(chan reply, 2)
	go func() { done <- do(t, h, sign(t, priv, cluster, "orders/42", 5)) }()
	if got := <-entered; got != 5 {
		t.Fatalf("entered %d first", got)
	}
	go func() { done <- do(t, h, sign(t, priv, cluster, "orders/42", 6)) }()
	testkit.Eventually(t, 10*time.Second, "B waiting for A's request", func() bool { return locks.refs("orders/42") == 2 })
	// Another key is not held up.
	if rep := do(t, h, sign(t, priv, cluster, "orders/43", 1)); rep.status != 200 || <-entered != 1 {
		t.Fatalf("another key while orders/42 is busy: %d %s", rep.status, rep.text)
	}
	select {
	case tok := <-entered:
		t.Fatalf("token %d entered the handler while token 5 was writing", tok)
	default:
	}
	close(release)
	for range 2 {
		if rep := <-done; rep.status != 200 {
			t.Fatalf("%d %s", rep.status, rep.text)
		}
	}
	if rep := do(t, h, sign(t, priv, cluster, "orders/42", 5)); rep.status != 409 || rep.body.Current != 6 {
		t.Fatalf("A again after B: %d %s", rep.status, rep.text)
	}
	mu.Lock()
	defer mu.Unlock()
	if fmt.Sprint(written) != "[1 5 6]" {
		t.Fatalf("writes in the order %v, want [1 5 6] (orders/43's while orders/42's 5 was writing)", written)
	}
	if locks.len() != 0 {
		t.Fatalf("%d key locks left after every request ended", locks.len())
	}
}

// TestWaiterGivesUp: a request whose context ends while it waits for the
// key gets 503, is not run, and leaves no lock entry behind.
func TestWaiterGivesUp(t *testing.T) {
	priv, pub := keys(t, 0)
	v, _ := fence.NewVerifier(cluster, pub)
	release := make(chan struct{})
	h := Middleware(v, fence.NewMemoryStore(0))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if f, _ := FromContext(r.Context()); f.Token == 1 {
			<-release
		}
	}))
	locks := h.(*handler).locks
	first := make(chan reply, 1)
	go func() { first <- do(t, h, sign(t, priv, cluster, "k", 1)) }()
	testkit.Eventually(t, 10*time.Second, "the first request holding the key", func() bool { return locks.refs("k") == 1 })
	ctx, cancel := context.WithCancel(context.Background())
	second := make(chan reply, 1)
	go func() { second <- doCtx(t, ctx, h, sign(t, priv, cluster, "k", 2)) }()
	testkit.Eventually(t, 10*time.Second, "the second request waiting", func() bool { return locks.refs("k") == 2 })
	cancel()
	if rep := <-second; rep.status != 503 || rep.body.Code != fence.CodeUnavailable {
		t.Fatalf("the waiter that gave up: %d %s", rep.status, rep.text)
	}
	close(release)
	<-first
	if locks.len() != 0 {
		t.Fatalf("%d key locks left", locks.len())
	}
}

// TestConcurrentRequests: many requests on few keys through a real
// server; afterwards the store holds each key's highest token and no
// key lock is left.
func TestConcurrentRequests(t *testing.T) {
	const (
		clients  = 8
		requests = 30
		keyCount = 3
	)
	priv, pub := keys(t, 0)
	v, _ := fence.NewVerifier(cluster, pub)
	store := fence.NewMemoryStore(0)
	h := Middleware(v, store)(echo)
	srv := httptest.NewServer(h)
	defer srv.Close()
	fences := make(map[[2]int]string)
	for k := range keyCount {
		for tok := 1; tok <= requests; tok++ {
			fences[[2]int{k, tok}] = sign(t, priv, cluster, fmt.Sprint("k", k), uint64(tok))
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range requests {
				k, tok := (c+i)%keyCount, 1+(c*7+i*13)%requests
				req, _ := http.NewRequestWithContext(ctx, http.MethodPut, srv.URL, nil)
				req.Header.Set(Header, fences[[2]int{k, tok}])
				resp, err := srv.Client().Do(req)
				if err != nil {
					errs <- err
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 && resp.StatusCode != 409 {
					errs <- fmt.Errorf("status %d", resp.StatusCode)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for k := range keyCount {
		highest := uint64(0)
		for c := range clients {
			for i := range requests {
				if (c+i)%keyCount == k {
					highest = max(highest, uint64(1+(c*7+i*13)%requests))
				}
			}
		}
		if cur, _ := store.Current(fmt.Sprint("k", k)); cur != highest {
			t.Errorf("key k%d: store holds %d, the highest token sent was %d", k, cur, highest)
		}
	}
	if n := h.(*handler).locks.len(); n != 0 {
		t.Fatalf("%d key locks left", n)
	}
}

func TestStatus(t *testing.T) {
	for code, want := range map[fence.Code]int{
		fence.CodeMalformed: 400, fence.CodeUnsupportedVersion: 400, fence.CodeInvalidArgument: 400,
		fence.CodeUnknownKey: 403, fence.CodeForged: 403, fence.CodeWrongCluster: 403, fence.CodeWrongKey: 403,
		fence.CodeStale: 409, fence.CodeMissing: 428, fence.CodeStoreFull: 503, fence.CodeUnavailable: 503,
	} {
		if got := Status(code); got != want {
			t.Errorf("Status(%s) = %d, want %d", code, got, want)
		}
	}
}
