package natsapi_test

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ticketd/ticketd/internal/testkit"
	"github.com/ticketd/ticketd/internal/testkit/testcluster"
	"github.com/ticketd/ticketd/transports/protocol"
)

// rawCall sends body on subject and returns the reply as a JSON object.
func rawCall(t *testing.T, nc *nats.Conn, subject, body string) map[string]any {
	t.Helper()
	m, err := nc.Request(subject, []byte(body), 5*time.Second)
	if err != nil {
		t.Fatalf("%s %s: %v", subject, body, err)
	}
	var v map[string]any
	if err := json.Unmarshal(m.Data, &v); err != nil {
		t.Fatalf("%s %s: %v", subject, body, err)
	}
	if v["error"] != nil {
		t.Fatalf("%s %s: %v", subject, body, v["error"])
	}
	return v
}

// kindOf is a reply's (or list entry's) limit and mode, "-" for absent.
func kindOf(v map[string]any) string {
	limit, mode := "-", "-"
	if l, ok := v["limit"]; ok {
		limit = fmt.Sprint(l)
	}
	if m, ok := v["mode"]; ok {
		mode = fmt.Sprint(m)
	}
	return limit + "/" + mode
}

// TestKindInReplies: the acquire, get and list replies of a key held
// shared by 3 readers, of a semaphore of limit 3 with 3 holders and of a
// mutex name the kind one way (docs/protocol.md §12): a semaphore slot
// "limit":3 and no mode; a shared hold "limit":1 (a read/write key's limit,
// the one a limit-2 acquire of it is told it has) and "mode":"shared"; a
// mutex neither. The acquire reply names the granted holder's kind, a
// repeated grant (same request_id) included; get the key's and every
// holder in token order; list every holder with its kind.
func TestKindInReplies(t *testing.T) {
	c := testcluster.New(t, 1)
	testkit.Eventually(t, 10*time.Second, "a settled leader", func() bool { return testcluster.Settled(c.Node(0)) })
	nc := testkit.Connect(t, c.ClientURL(0))
	untilServed(t, nc)

	const (
		sem    = "3/-"
		shared = "1/shared"
		mutex  = "-/-"
	)
	keys := []struct {
		key, body, kind string
	}{
		{"k/rw", `"mode":"shared"`, shared},
		{"k/sem", `"limit":3`, sem},
		{"k/mutex", `"limit":1`, mutex},
	}
	tokens := map[string][]float64{}
	for _, k := range keys {
		n := 3
		if k.kind == mutex {
			n = 1
		}
		for i := 1; i <= n; i++ {
			body := fmt.Sprintf(`{"key":%q,%s,"lease_ms":60000,"owner":"o%d","request_id":"%s-%d"}`, k.key, k.body, i, k.key, i)
			r := rawCall(t, nc, protocol.SubjectAcquire, body)
			if got := kindOf(r); got != k.kind {
				t.Errorf("acquire %s: kind %s, want %s (%v)", body, got, k.kind, r)
			}
			tokens[k.key] = append(tokens[k.key], r["token"].(float64))
			if i == n {
				// A retry of the same request: the grant repeated, its
				// kind as well.
				r := rawCall(t, nc, protocol.SubjectAcquire, body)
				if got := kindOf(r); r["repeated"] != true || r["token"] != tokens[k.key][i-1] || got != k.kind {
					t.Errorf("retry of %s: %v (kind %s), want the repeated grant of kind %s", body, r, got, k.kind)
				}
			}
		}
	}
	for _, k := range keys {
		g := rawCall(t, nc, protocol.SubjectGet, fmt.Sprintf(`{"key":%q}`, k.key))
		var holders []float64
		hs, _ := g["holders"].([]any)
		for _, h := range hs {
			holders = append(holders, h.(map[string]any)["token"].(float64))
		}
		if k.kind == mutex {
			holders = []float64{g["token"].(float64)}
		}
		if got := kindOf(g); got != k.kind || g["held"] != true || g["token"] != tokens[k.key][0] || fmt.Sprint(holders) != fmt.Sprint(tokens[k.key]) {
			t.Errorf("get %s: %v (kind %s), want kind %s, holders %v", k.key, g, got, k.kind, tokens[k.key])
		}
	}
	l := rawCall(t, nc, protocol.SubjectList, `{"prefix":"k/"}`)
	var got []string
	for _, e := range l["locks"].([]any) {
		m := e.(map[string]any)
		got = append(got, fmt.Sprintf("%s#%v %s", m["key"], m["token"], kindOf(m)))
	}
	var want []string
	for _, k := range []string{"k/mutex", "k/rw", "k/sem"} { // key order
		for _, tok := range tokens[k] {
			kind := map[string]string{"k/mutex": mutex, "k/rw": shared, "k/sem": sem}[k]
			want = append(want, fmt.Sprintf("%s#%v %s", k, tok, kind))
		}
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("list:\n %v\nwant\n %v", got, want)
	}
}
