package lockservice

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestListACLAndRemaining(t *testing.T) {
	acl, err := ParseACL([]byte("A:\n  \"a/\": [acquire, list]\n"))
	if err != nil {
		t.Fatal(err)
	}
	s, _ := newLeader(t, Config{ACL: acl})
	ctx := WithIdentity(context.Background(), "A")
	for _, k := range []string{"a/2", "a/1"} {
		if _, err := s.Acquire(ctx, AcquireParams{Key: k, Lease: time.Minute, Timeout: 5 * time.Second}); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		prefix, after string
		afterToken    uint64
		want          []string
		err           error
	}{
		{prefix: "a/", want: []string{"a/1", "a/2"}},
		{prefix: "a/", after: "a/1", want: []string{"a/2"}},
		{prefix: "a/", after: "a/1", afterToken: 1, want: []string{"a/1", "a/2"}}, // a/1 holds token 2
		{prefix: "a/", after: "a/1", afterToken: 2, want: []string{"a/2"}},
		{prefix: "", err: ErrPermissionDenied}, // listing everything is wider than a/
		{prefix: "b/", err: ErrPermissionDenied},
	}
	for _, tc := range tests {
		p, err := s.List(ctx, tc.prefix, tc.after, tc.afterToken, 10)
		if tc.err != nil {
			if !errors.Is(err, tc.err) {
				t.Fatalf("list %q: %v, want %v", tc.prefix, err, tc.err)
			}
			continue
		}
		if err != nil || len(p.Locks) != len(tc.want) {
			t.Fatalf("list %q after %q: %+v %v", tc.prefix, tc.after, p, err)
		}
		for i, h := range p.Locks {
			if h.Lock.Key != tc.want[i] || !h.Held || h.Remaining <= 0 || h.Remaining > time.Minute {
				t.Fatalf("list %q: #%d is %+v, want %s", tc.prefix, i, h, tc.want[i])
			}
		}
	}
}
