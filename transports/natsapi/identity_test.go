package natsapi

import (
	"testing"

	"github.com/nats-io/nats.go"
)

func TestIdentityOf(t *testing.T) {
	for _, tc := range []struct {
		header string
		want   string
	}{
		{`{"acc":"TENANT_A","user":"alice","rtt":1000}`, "TENANT_A/alice"},
		{`{"acc":"TENANT_A"}`, "TENANT_A"},
		{`{"user":"alice"}`, ""}, // no account: anonymous
		{`not json`, ""},
		{``, ""},
	} {
		h := nats.Header{}
		if tc.header != "" {
			h.Set(HeaderRequestInfo, tc.header)
		}
		// A client-written Ticketd-Identity on a client subject means nothing.
		h.Set(HeaderIdentity, "TICKETD_ADMIN")
		if got := identityOf(h); got != tc.want {
			t.Errorf("identityOf(%s) = %q, want %q", tc.header, got, tc.want)
		}
	}
	// Two of them: a client's got past the server (headerguard.go), and
	// which is whose cannot be told: anonymous.
	two := nats.Header{HeaderRequestInfo: {`{"acc":"TENANT_A"}`, `{"acc":"TENANT_B"}`}}
	if got := identityOf(two); got != "" {
		t.Errorf("identityOf(two headers) = %q, want anonymous", got)
	}
}

// TestIdentityTrust: a Nats-Request-Info header names the requester only
// where the node trusts the deployment and only on a request whose reply
// subject shows it crossed a service import; a header naming ticketd's own
// account, or any header where identities are not trusted (an open NATS,
// where `{"acc":"TENANT_A"}` is whatever a client wrote), is anonymous.
func TestIdentityTrust(t *testing.T) {
	trusted := IdentityTrust{Trusted: true, OwnAccount: "TICKETD"}
	external := IdentityTrust{Trusted: true}
	const imported = "_R_.abc123.xyz"
	for _, tc := range []struct {
		name   string
		trust  IdentityTrust
		header string
		reply  string
		want   string
	}{
		{"through an import", trusted, `{"acc":"TENANT_A","user":"alice"}`, imported, "TENANT_A/alice"},
		{"through an import, tracked", trusted, `{"acc":"TENANT_A"}`, "_R_.abc123.xyz.srvhash.T", "TENANT_A"},
		{"through a gateway and an import", trusted, `{"acc":"TENANT_A"}`, "_GR_.abcdef.ghijkl._R_.abc.xyz", "TENANT_A"},
		{"external server vouched for", external, `{"acc":"TENANT_A"}`, imported, "TENANT_A"},
		{"forged: no import (own inbox)", trusted, `{"acc":"TENANT_A"}`, "_INBOX.x.y", ""},
		{"forged: no reply", trusted, `{"acc":"TENANT_A"}`, "", ""},
		{"forged: a gateway prefix alone", trusted, `{"acc":"TENANT_A"}`, "_GR_.abcdef.ghijkl.x", ""},
		{"forged: names ticketd's own account", trusted, `{"acc":"TICKETD"}`, imported, ""},
		{"forged: ticketd's own account with a user", trusted, `{"acc":"TICKETD","user":"x"}`, imported, ""},
		{"open NATS: the issue's OBSERVER", IdentityTrust{}, `{"acc":"OBSERVER"}`, imported, ""},
		{"open NATS: the issue's TENANT_A", IdentityTrust{}, `{"acc":"TENANT_A"}`, "_INBOX.a", ""},
	} {
		h := nats.Header{}
		h.Set(HeaderRequestInfo, tc.header)
		if got, ok := tc.trust.clientIdentity(h, tc.reply); got != tc.want || !ok {
			t.Errorf("%s: identity %q (served %v), want %q", tc.name, got, ok, tc.want)
		}
	}
	// Through an import nats-server always writes one header: a request
	// where none can be read hid it, and is refused, not anonymous.
	for _, tc := range []struct {
		name string
		h    nats.Header
	}{
		{"no header", nats.Header{}},
		{"no headers at all", nil},
		{"two headers", nats.Header{HeaderRequestInfo: {`{"acc":"TENANT_A"}`, `{"acc":"TENANT_B"}`}}},
		{"no account", nats.Header{HeaderRequestInfo: {`{"user":"alice"}`}}},
		{"not JSON", nats.Header{HeaderRequestInfo: {`TENANT_A`}}},
	} {
		if got, ok := trusted.clientIdentity(tc.h, imported); ok {
			t.Errorf("imported, %s: served as %q, want refused", tc.name, got)
		}
		if got, ok := (IdentityTrust{}).clientIdentity(tc.h, imported); !ok || got != "" {
			t.Errorf("untrusted, %s: %q (served %v), want anonymous", tc.name, got, ok)
		}
	}
	fwd := nats.Header{HeaderIdentity: {"TENANT_A/alice"}}
	if got := trusted.forwardedIdentity(fwd); got != "TENANT_A/alice" {
		t.Errorf("trusted forward: %q", got)
	}
	if got := (IdentityTrust{}).forwardedIdentity(fwd); got != "" {
		t.Errorf("an untrusted deployment took the forwarded identity %q: anyone can publish on an open NATS's forward subject", got)
	}
}

// A follower forwards the identity it read, never one a client wrote,
// and never a client's lost-reply mark.
func TestForwardHeader(t *testing.T) {
	in := nats.Header{HeaderIdentity: {"FORGED"}, HeaderLostReply: {"1"}, "X-Trace": {"t1"}}
	out := forwardHeader(in, "TENANT_A/alice")
	if out.Get(HeaderIdentity) != "TENANT_A/alice" || out.Get(HeaderLostReply) != "" || out.Get("X-Trace") != "t1" {
		t.Fatalf("forwardHeader = %v", out)
	}
	if in.Get(HeaderIdentity) != "FORGED" {
		t.Fatal("forwardHeader changed the client's header")
	}
	if anon := forwardHeader(in, ""); anon.Get(HeaderIdentity) != "" {
		t.Fatalf("an anonymous request forwarded as %q", anon.Get(HeaderIdentity))
	}
}
