package natsapi_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/ticketd/ticketd/internal/testkit"
	"github.com/ticketd/ticketd/internal/testkit/testcluster"
	"github.com/ticketd/ticketd/transports/protocol"
)

// microAll asks every ticketd instance one micro verb and returns the
// raw answers: the way `nats micro stats ticketd` collects them.
func microAll(t *testing.T, nc *nats.Conn, verb micro.Verb, want int) [][]byte {
	t.Helper()
	subj, err := micro.ControlSubject(verb, protocol.ServiceName, "")
	if err != nil {
		t.Fatal(err)
	}
	inbox := nats.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := nc.PublishRequest(subj, inbox, nil); err != nil {
		t.Fatal(err)
	}
	var out [][]byte
	for len(out) < want {
		m, err := sub.NextMsg(5 * time.Second)
		if err != nil {
			t.Fatalf("%s: %d of %d instances answered: %v", subj, len(out), want, err)
		}
		out = append(out, m.Data)
	}
	return out
}

// clusterStats is the STATS answers of all n instances summed by
// endpoint name, with the last error of any instance that has one.
func clusterStats(t *testing.T, nc *nats.Conn, n int) map[string]*micro.EndpointStats {
	t.Helper()
	out := map[string]*micro.EndpointStats{}
	for _, raw := range microAll(t, nc, micro.StatsVerb, n) {
		var st micro.Stats
		if err := json.Unmarshal(raw, &st); err != nil {
			t.Fatalf("stats %s: %v", raw, err)
		}
		if st.Type != micro.StatsResponseType || st.Name != protocol.ServiceName || st.Metadata["node_id"] == "" {
			t.Fatalf("stats answer %s", raw)
		}
		for _, e := range st.Endpoints {
			if e.NumRequests > 0 && (e.ProcessingTime <= 0 || e.AverageProcessingTime != e.ProcessingTime/time.Duration(e.NumRequests)) {
				t.Errorf("node %s %s: processing %v, average %v over %d", st.Metadata["node_id"], e.Name, e.ProcessingTime, e.AverageProcessingTime, e.NumRequests)
			}
			sum := out[e.Name]
			if sum == nil {
				sum = &micro.EndpointStats{Name: e.Name}
				out[e.Name] = sum
			}
			sum.NumRequests += e.NumRequests
			sum.NumErrors += e.NumErrors
			sum.ProcessingTime += e.ProcessingTime
			if e.LastError != "" {
				sum.LastError = e.LastError
			}
		}
	}
	return out
}

// TestMicroStatsCountWhatTheServiceDid sends good and bad requests to a
// three-node cluster (lock requests reach the leader, the only node
// subscribed to them; status any node) and reads the figures back through
// the micro API, as `nats micro stats ticketd` does: summed over the
// instances, requests, errors, the last error and the processing time per
// endpoint are what the nodes answered.
func TestMicroStatsCountWhatTheServiceDid(t *testing.T) {
	if testing.Short() {
		t.Skip("three-node cluster skipped in -short mode")
	}
	c := testcluster.New(t, 3)
	lead := c.Leader(10 * time.Second)
	// Renew needs the cluster version the new leader raises first.
	testkit.Eventually(t, 10*time.Second, "cluster version raised", func() bool {
		return testcluster.Settled(c.Node(lead))
	})
	// Through the leader's own NATS server: its lock subscriptions are
	// known there as soon as it serves (the others learn them a moment
	// later, and a probe would be counted).
	nc := testkit.Connect(t, c.ClientURL(lead))

	req := func(subj, body string) (*nats.Msg, string) {
		t.Helper()
		m, err := nc.Request(subj, []byte(body), 5*time.Second)
		if err != nil {
			t.Fatalf("%s %s: %v", subj, body, err)
		}
		return m, m.Header.Get(micro.ErrorCodeHeader)
	}
	expect := func(subj, body, code string) *nats.Msg {
		t.Helper()
		m, got := req(subj, body)
		if got != code {
			t.Fatalf("%s %s: code %q (%s), want %q", subj, body, got, m.Data, code)
		}
		return m
	}
	acquire := protocol.SubjectPrefix + ".lock.acquire"
	release := protocol.SubjectPrefix + ".lock.release"
	get := protocol.SubjectPrefix + ".lock.get"
	m := expect(acquire, `{"key":"a","lease_ms":60000}`, "")
	var ar protocol.AcquireReply
	if err := json.Unmarshal(m.Data, &ar); err != nil {
		t.Fatal(err)
	}
	expect(acquire, `{"key":"b","lease_ms":60000}`, "")
	expect(acquire, `{"key":"a","lease_ms":60000}`, "held")
	expect(acquire, `{"key":"a","lease_ms":60000,"x":1}`, "malformed")
	expect(acquire, `{"key":"a","lease_ms":1}`, "invalid_argument")
	expect(release, fmt.Sprintf(`{"key":"a","token":%d}`, ar.Token), "")
	expect(release, fmt.Sprintf(`{"key":"a","token":%d}`, ar.Token), "not_found")
	expect(get, `{"key":"b"}`, "")
	expect(protocol.SubjectRenew, `{"key":"b","token":999999}`, "not_found")
	expect(protocol.SubjectList, `{"prefix":"b"}`, "")
	expect(protocol.SubjectWithdraw, `{"key":"b","wait_id":"w1"}`, "")
	expect(protocol.SubjectCheck, `{"key":"b","token":1}`, "")
	expect(protocol.SubjectFenceKeys, `{}`, "")
	expect(protocol.SubjectSessionOpen, `{"ttl_ms":60000}`, "")
	expect(protocol.SubjectSessionKeepAlive, `{"session":"999999"}`, "not_found")
	expect(protocol.SubjectSessionClose, `{"session":"x"}`, "invalid_argument")
	expect(protocol.SubjectStatus, `{}`, "")
	expect(protocol.SubjectPrefix+".control.bootstrap", `{}`, "control_refused")
	// A publish without a reply subject asks nothing; micro counts it as
	// a failed reply.
	if err := nc.Publish(acquire, []byte(`{"key":"c","lease_ms":60000}`)); err != nil {
		t.Fatal(err)
	}

	want := map[string][2]int{ // requests, errors
		"acquire": {6, 4}, "release": {2, 1}, "get": {1, 0}, "renew": {1, 1}, "list": {1, 0}, "withdraw": {1, 0}, "check": {1, 0}, "fence_keys": {1, 0}, "status": {1, 0}, "control_refused": {1, 1},
		"session_open": {1, 0}, "session_keepalive": {1, 1}, "session_close": {1, 1},
	} // node_status also serves the leader's version probes
	var got map[string]*micro.EndpointStats
	// A reply reaches the client just before its figures are recorded.
	testkit.Eventually(t, 5*time.Second, "the stats to count every request", func() bool {
		got = clusterStats(t, nc, 3)
		return got["acquire"] != nil && got["acquire"].NumRequests == want["acquire"][0]
	})
	for name, w := range want {
		e := got[name]
		if e == nil {
			t.Fatalf("no endpoint %q in %v", name, got)
		}
		if name == "status" && e.NumRequests >= w[0] && e.NumErrors == w[1] {
			continue // a follower that has not heard a leader lately asks status too (daemon's removal check)
		}
		if e.NumRequests != w[0] || e.NumErrors != w[1] {
			t.Errorf("%s: %d requests, %d errors; want %d, %d", name, e.NumRequests, e.NumErrors, w[0], w[1])
		}
	}
	if le := got["release"].LastError; !strings.HasPrefix(le, "not_found:") {
		t.Errorf("release last_error %q", le)
	}
	if le := got["control_refused"].LastError; !strings.HasPrefix(le, "control_refused:") {
		t.Errorf("control_refused last_error %q", le)
	}

	// PING and INFO answer like any micro service's.
	for _, raw := range microAll(t, nc, micro.PingVerb, 3) {
		var p micro.Ping
		if err := json.Unmarshal(raw, &p); err != nil || p.Type != micro.PingResponseType || p.Version != protocol.ServiceVersion || p.ID == "" {
			t.Fatalf("ping %s: %v", raw, err)
		}
	}
	for _, raw := range microAll(t, nc, micro.InfoVerb, 3) {
		var in micro.Info
		if err := json.Unmarshal(raw, &in); err != nil || in.Type != micro.InfoResponseType || len(in.Endpoints) != len(want)+1 {
			t.Fatalf("info %s: %v", raw, err)
		}
	}
}
