package natsapi

import (
	"bytes"
	"encoding/json"
	"math"
	"testing"

	"github.com/ticketd/ticketd/transports/protocol"
)

// TestKeepAliveReplyIsJSONMarshal: the hand-written keepalive reply is
// byte for byte what json.Marshal writes, for every session string (the
// digits DecodeSession accepts, and strings it never passes, which take
// json.Marshal) and TTL.
func TestKeepAliveReplyIsJSONMarshal(t *testing.T) {
	sessions := []string{"1", "42", "18446744073709551615", "", "a\"b", "<&>", "\u2028", "12x", "\xff"}
	ttls := []int64{0, 1, 60000, -1, math.MaxInt64, math.MinInt64}
	for _, session := range sessions {
		for _, ttl := range ttls {
			want, err := json.Marshal(protocol.SessionKeepAliveReply{Session: session, TTLMS: ttl})
			if err != nil {
				t.Fatal(err)
			}
			if got := keepAliveReply(session, ttl); !bytes.Equal(got, want) {
				t.Errorf("keepAliveReply(%q, %d) = %s, json.Marshal = %s", session, ttl, got, want)
			}
		}
	}
}

// BenchmarkKeepAliveReply: the keepalive reply's encoding, hand-written
// against json.Marshal (go test -run '^$' -bench KeepAliveReply
// ./transports/natsapi/).
func BenchmarkKeepAliveReply(b *testing.B) {
	b.Run("hand", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = keepAliveReply("1234567", 60000)
		}
	})
	b.Run("json.Marshal", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_, _ = json.Marshal(protocol.SessionKeepAliveReply{Session: "1234567", TTLMS: 60000})
		}
	})
}
