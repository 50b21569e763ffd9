package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ticketd/ticketd/internal/testkit"
	"github.com/ticketd/ticketd/sdk"
)

// TestLockExecSessionHoldsSeveralKeys: lock exec with --session-ttl holds
// every key in one session while the command runs (TICKETD_KEY_<i> and
// TICKETD_TOKEN_<i>, sorted), and frees them all at once when it ends (a
// close: no lock-delay).
func TestLockExecSessionHoldsSeveralKeys(t *testing.T) {
	bin := binary(t)
	c := settledCluster(t, 1)
	cl := sdkClient(t, c.ClientURL(0))
	r := runCLI(t, bin, "lock", "exec", "m/b", "m/a", "--nats", c.ClientURL(0), "--session-ttl", "2s", "--lock-delay", "30s", "--",
		"sh", "-c", `echo "$TICKETD_KEY_1=$TICKETD_TOKEN_1 $TICKETD_KEY_2=$TICKETD_TOKEN_2 $TICKETD_KEY"`)
	if r.code != 0 {
		t.Fatalf("lock exec: %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	var ta, tb uint64
	if _, err := fmt.Sscanf(strings.TrimSpace(r.stdout), "m/a=%d m/b=%d m/a", &ta, &tb); err != nil || ta == 0 || tb == 0 {
		t.Fatalf("command saw %q: %v", r.stdout, err)
	}
	for _, k := range []string{"m/a", "m/b"} {
		if _, err := cl.Acquire(t.Context(), k, sdk.WithLease(time.Second)); err != nil {
			t.Fatalf("acquire %s after lock exec ended: %v (a close leaves no lock-delay)", k, err)
		}
	}
	if r := runCLI(t, bin, "lock", "exec", "x", "y", "--nats", c.ClientURL(0), "--", "true"); r.code == 0 {
		t.Fatal("two keys without --session-ttl were accepted")
	}
}

// TestLockExecSessionKill9: a lock exec holding two keys in a session is
// killed with SIGKILL (no keepalive, no close): the server expires the
// session within its TTL of the last keepalive, then the keys stay in their
// lock-delay (held with a delay) before another client gets them.
func TestLockExecSessionKill9(t *testing.T) {
	bin := binary(t)
	c := settledCluster(t, 1)
	cl := sdkClient(t, c.ClientURL(0))
	const ttl, delay = 2 * time.Second, 1500 * time.Millisecond
	p := startCLI(t, bin, "lock", "exec", "k/1", "k/2", "--nats", c.ClientURL(0), "--session-ttl", ttl.String(), "--lock-delay", delay.String(), "--",
		"sh", "-c", "echo up; exec sleep 600")
	testkit.Eventually(t, 10*time.Second, "the command started", func() bool { return strings.Contains(p.stdout(), "up") })
	for _, k := range []string{"k/1", "k/2"} {
		if h, err := cl.Get(t.Context(), k); err != nil || !h.Held || h.Session == "" {
			t.Fatalf("%s while lock exec runs: %+v %v", k, h, err)
		}
	}
	killed := time.Now()
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, ttl+5*time.Second, "the session's keys freed", func() bool {
		h, err := cl.Get(t.Context(), "k/2")
		return err == nil && !h.Held
	})
	freed := time.Since(killed)
	if freed > ttl+time.Second {
		t.Fatalf("freed %v after the kill, the TTL is %v", freed, ttl)
	}
	_, err := cl.Acquire(t.Context(), "k/1", sdk.WithLease(time.Second))
	var e *sdk.Error
	if !errors.Is(err, sdk.ErrHeld) || !errors.As(err, &e) || e.Delay <= 0 {
		t.Fatalf("try right after the expiry: %v, want held in the lock-delay", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	l, err := cl.Acquire(ctx, "k/1", sdk.WithLease(time.Second), sdk.WithWait(5*time.Second))
	if err != nil {
		t.Fatalf("wait through the lock-delay: %v", err)
	}
	t.Logf("killed holder: keys freed %v after the kill (TTL %v), granted again %v after the kill (lock-delay %v)",
		freed.Round(time.Millisecond), ttl, time.Since(killed).Round(time.Millisecond), delay)
	if got := time.Since(killed); got < freed+delay-200*time.Millisecond {
		t.Fatalf("granted %v after the kill, inside the lock-delay", got)
	}
	_ = l.Release(t.Context())
}
