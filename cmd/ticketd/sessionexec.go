package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"

	"github.com/ticketd/ticketd/sdk"
)

// maxExecKeys bounds the keys one lock exec holds in a session.
const maxExecKeys = 100

// sessionExec is `ticketd lock exec KEY [KEY...] --session-ttl TTL -- CMD`:
// the keys are held in one session (docs/protocol.md §11) while the
// command runs. The timing is lockExec's with the session in the lease's
// place: the session's keepalive has the margin grace + execKillMargin, so
// Lost (which every lock of the session follows) fires at D - margin, D
// being the session's local deadline, and runLocked's SIGTERM and SIGKILL
// come before D as for a lease. Keys are taken in sorted order, so two
// lock execs that share keys never wait on each other in a cycle.
func sessionExec(ctx context.Context, o *execOptions, keys, argv []string, stdout, stderr io.Writer) int {
	cf := o.cf
	if cf.fs.Changed("lease") {
		return usagef(stderr, "--lease and --session-ttl exclude each other (the session's keepalive holds the locks)")
	}
	if !cf.fs.Changed("grace") {
		o.grace = min(defaultExecGrace, o.sessionTTL/4)
	}
	if !cf.fs.Changed("owner") {
		o.owner = defaultOwner()
	}
	margin := o.grace + execKillMargin
	if o.grace < 0 || margin > o.sessionTTL*3/4 {
		return usagef(stderr, "--session-ttl %v is too short for --grace %v: it must be at least 4/3 of (grace + %v)", o.sessionTTL, o.grace, execKillMargin)
	}
	keys = slices.Clone(keys)
	slices.Sort(keys)
	keys = slices.Compact(keys)
	if _, err := exec.LookPath(argv[0]); err != nil {
		fmt.Fprintf(stderr, "error: lock exec: %v (no lock taken)\n", err)
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrNotExist) {
			return exitNotFound
		}
		return exitCannotRun
	}
	cl, err := cf.dial()
	if err != nil {
		return fail(stderr, err)
	}
	defer cl.Close()
	octx, cancel := context.WithTimeout(ctx, cf.timeout)
	s, err := sdk.NewSession(octx, cl, sdk.WithSessionTTL(o.sessionTTL), sdk.WithSessionLockDelay(o.lockDelay),
		sdk.WithSessionKeepAlive(sdk.WithSafetyMargin(margin)))
	cancel()
	if err != nil {
		return fail(stderr, err)
	}
	// Closing the session releases every lock of it at once, whatever
	// happened; a session that cannot be closed expires after its TTL.
	closeSession := func() {
		ctimeout := cf.timeout
		if errors.Is(s.Err(), sdk.ErrLost) {
			ctimeout = min(ctimeout, lostReleaseTimeout)
		}
		cctx, ccancel := context.WithTimeout(context.Background(), ctimeout)
		defer ccancel()
		if _, err := s.Close(cctx); err != nil && !errors.Is(err, sdk.ErrNotFound) {
			fmt.Fprintf(stderr, "ticketd lock exec: close session %s: %v (its locks end with it after its TTL)\n", s.ID, err)
		}
	}
	var locks []*sdk.Lock
	for _, k := range keys {
		actx, cancel := context.WithTimeout(ctx, o.wait+cf.timeout)
		l, err := s.Acquire(actx, k, append(o.kind.options(), sdk.WithWait(o.wait), sdk.WithOwner(o.owner))...)
		cancel()
		if err != nil {
			closeSession()
			return fail(stderr, fmt.Errorf("%q (after taking %d of %d keys, all released again): %w", k, len(locks), len(keys), err))
		}
		locks = append(locks, l)
	}
	extra := make([]string, 0, 2*len(locks))
	for i, l := range locks {
		extra = append(extra, "TICKETD_KEY_"+strconv.Itoa(i+1)+"="+l.Key, "TICKETD_TOKEN_"+strconv.Itoa(i+1)+"="+strconv.FormatUint(l.Token, 10))
	}
	// Every lock follows the session: the first one's Lost and Deadline are
	// the session's.
	status := runLockedEnv(locks[0], argv, extra, stdout, stderr)
	closeSession()
	return status
}
