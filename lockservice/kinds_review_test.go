package lockservice

import (
	"context"
	"errors"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/ticketd/ticketd/core"
	"github.com/ticketd/ticketd/plugins"
)

// kindPolicy records every Grant the leader asks the policy about.
type kindPolicy struct {
	mu   sync.Mutex
	seen []plugins.Grant
}

func (p *kindPolicy) ValidateGrant(_ context.Context, g plugins.Grant) (plugins.Verdict, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.seen = append(p.seen, g)
	return plugins.Verdict{Allow: true}, nil
}

func (p *kindPolicy) take() []plugins.Grant {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := p.seen
	p.seen = nil
	return out
}

// TestReviewKindsPolicySeesOnlyValidKinds (review of issue 25, plugins
// ABI 2): the Grant the host hands a policy plugin carries a kind the
// state machine accepts, whatever the caller asked: a hostile limit or
// mode is invalid_argument before the policy is asked; limit 1 reaches it
// as 0 (a mutex); a renewal of a slot carries the holder's kind.
func TestReviewKindsPolicySeesOnlyValidKinds(t *testing.T) {
	pol := &kindPolicy{}
	s, _, _ := newKindsLeader(t, Config{Policy: pol})
	for _, tc := range []struct {
		name  string
		limit uint32
		mode  core.Mode
	}{
		{"limit above the maximum", core.MaxSemaphoreLimit + 1, core.ModeExclusive},
		{"largest uint32 limit", math.MaxUint32, core.ModeExclusive},
		{"unknown mode", 0, core.Mode(7)},
		{"largest mode", 0, core.Mode(math.MaxUint8)},
		{"shared semaphore", 2, core.ModeShared},
	} {
		_, err := kindAcquire(s, "", "hostile", tc.limit, tc.mode, time.Minute, 0)
		var ce *core.Error
		if !errors.As(err, &ce) || ce.Code != core.CodeInvalidArgument {
			t.Errorf("%s: %v, want invalid_argument", tc.name, err)
		}
		if seen := pol.take(); len(seen) != 0 {
			t.Errorf("%s: the policy was asked about %+v", tc.name, seen)
		}
	}
	for _, tc := range []struct {
		key       string
		limit     uint32
		mode      core.Mode
		wantLimit uint32
	}{
		{"one", 1, core.ModeExclusive, 0},
		{"max", core.MaxSemaphoreLimit, core.ModeExclusive, core.MaxSemaphoreLimit},
		{"rw", 0, core.ModeShared, 0},
	} {
		g, err := kindAcquire(s, "", tc.key, tc.limit, tc.mode, time.Minute, 0)
		if err != nil {
			t.Fatalf("%s: %v", tc.key, err)
		}
		seen := pol.take()
		if len(seen) != 1 || seen[0].Limit != tc.wantLimit || seen[0].Mode != tc.mode || seen[0].Key != tc.key {
			t.Fatalf("%s: the policy saw %+v, want limit %d mode %v", tc.key, seen, tc.wantLimit, tc.mode)
		}
		if tc.key == "max" {
			if _, err := s.Renew(context.Background(), tc.key, g.Token, 2*time.Minute); err != nil {
				t.Fatalf("renew: %v", err)
			}
			if seen := pol.take(); len(seen) != 1 || seen[0].Limit != core.MaxSemaphoreLimit || seen[0].LeaseMS != 120_000 {
				t.Fatalf("renew of a slot: the policy saw %+v", seen)
			}
		}
	}
}
