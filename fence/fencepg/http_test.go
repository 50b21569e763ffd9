package fencepg_test

import (
	"context"
	"crypto/ed25519"
	"database/sql"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/ticketd/ticketd/fence"
	"github.com/ticketd/ticketd/fence/fencehttp"
	"github.com/ticketd/ticketd/fence/fencepg"
)

func signer(t *testing.T, first byte) (ed25519.PrivateKey, fence.PublicKey) {
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

// put sends body to h with a fence for key and token signed by priv and
// returns the status and the refusal's code and current token.
func put(t *testing.T, h http.Handler, priv ed25519.PrivateKey, cluster uint64, key string, token uint64, data string) (int, fence.Code, uint64) {
	t.Helper()
	f, err := fence.Sign(priv, cluster, key, token)
	if err != nil {
		t.Fatal(err)
	}
	r := httptest.NewRequest(http.MethodPut, "/docs/"+key, strings.NewReader(data))
	r.Header.Set(fencehttp.Header, f)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	var b struct {
		Code    fence.Code `json:"code"`
		Current uint64     `json:"current"`
	}
	if w.Code >= 400 {
		if err := json.Unmarshal(w.Body.Bytes(), &b); err != nil {
			t.Fatalf("%d %q: %v", w.Code, w.Body.String(), err)
		}
	}
	return w.Code, b.Code, b.Current
}

// TestHTTPWriteInTransaction is the recommended use for a resource with
// several processes: the middleware verifies, the handler advances the
// fence in the transaction of its write. Worker A (token 5) writes, B
// (token 6) writes, A writes again late: refused, and the row keeps B's
// data. A forged fence with a huge token changes nothing.
func TestHTTPWriteInTransaction(t *testing.T) {
	const cluster = 77
	db := newDB(t)
	ctx := context.Background()
	if _, err := db.ExecContext(ctx, `CREATE TABLE docs (key text PRIMARY KEY, body text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	priv, pub := signer(t, 0)
	forger, _ := signer(t, 9)
	v, err := fence.NewVerifier(cluster, pub)
	if err != nil {
		t.Fatal(err)
	}
	write := func(w http.ResponseWriter, r *http.Request) error {
		f, _ := fencehttp.FromContext(r.Context())
		data, err := io.ReadAll(r.Body)
		if err != nil {
			return err
		}
		tx, err := db.BeginTx(r.Context(), nil)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		if err := fencepg.Advance(r.Context(), tx, f.Key, f.Token); err != nil {
			return err
		}
		if _, err := tx.ExecContext(r.Context(), `INSERT INTO docs VALUES ($1, $2) ON CONFLICT (key) DO UPDATE SET body = EXCLUDED.body`, f.Key, string(data)); err != nil {
			return err
		}
		return tx.Commit()
	}
	h := fencehttp.Middleware(v, nil)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := write(w, r); err != nil {
			fencehttp.WriteError(w, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	body := func() string {
		var b string
		if err := db.QueryRowContext(ctx, `SELECT body FROM docs WHERE key = 'doc'`).Scan(&b); err != nil && !errors.Is(err, sql.ErrNoRows) {
			t.Fatal(err)
		}
		return b
	}
	steps := []struct {
		who     string
		priv    ed25519.PrivateKey
		cluster uint64
		token   uint64
		data    string
		status  int
		code    fence.Code
		current uint64
		after   string
	}{
		{"A writes", priv, cluster, 5, "A1", 204, "", 0, "A1"},
		{"A writes again", priv, cluster, 5, "A2", 204, "", 0, "A2"},
		{"B, granted after A's lease ended, writes", priv, cluster, 6, "B1", 204, "", 0, "B1"},
		{"A wakes up and writes", priv, cluster, 5, "A3", 409, fence.CodeStale, 6, "B1"},
		{"a forger sends a huge token", forger, cluster, 1 << 62, "X", 403, fence.CodeUnknownKey, 0, "B1"},
		{"another cluster's fence", priv, cluster + 1, 1 << 62, "X", 403, fence.CodeWrongCluster, 0, "B1"},
		{"B writes again", priv, cluster, 6, "B2", 204, "", 0, "B2"},
	}
	for _, st := range steps {
		status, code, current := put(t, h, st.priv, st.cluster, "doc", st.token, st.data)
		if status != st.status || code != st.code || current != st.current {
			t.Fatalf("%s: %d %s current %d; want %d %s current %d", st.who, status, code, current, st.status, st.code, st.current)
		}
		if got := body(); got != st.after {
			t.Fatalf("%s: the row holds %q, want %q", st.who, got, st.after)
		}
	}
}

// TestHTTPWithStore: fencepg.Store behind the middleware, for a resource
// served by one process.
func TestHTTPWithStore(t *testing.T) {
	db := newDB(t)
	priv, pub := signer(t, 0)
	v, _ := fence.NewVerifier(1, pub)
	h := fencehttp.Middleware(v, fencepg.NewStore(db))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	if status, _, _ := put(t, h, priv, 1, "k", 3, ""); status != 200 {
		t.Fatalf("token 3: %d", status)
	}
	if status, code, cur := put(t, h, priv, 1, "k", 2, ""); status != 409 || code != fence.CodeStale || cur != 3 {
		t.Fatalf("token 2 after 3: %d %s %d", status, code, cur)
	}
}
