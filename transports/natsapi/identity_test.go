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
