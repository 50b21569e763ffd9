package natsclient

import (
	"errors"
	"maps"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// DialTimeoutDefault bounds one TCP dial of a DialRecorder (nats.go's
// own default connect timeout).
const DialTimeoutDefault = 2 * time.Second

// maxRecordedDials bounds the addresses a DialRecorder remembers.
const maxRecordedDials = 16

// DialRecorder is a nats.go dialer that keeps the last dial error of each
// address. nats.go
// reports a server it could not reach only as "no servers available for
// connection" (it drops "connection refused" on purpose); the operator
// needs the OS error: "dial tcp 127.0.0.1:4222: connect: connection
// refused". Use Option on the connection, then Explain on its error.
type DialRecorder struct {
	// Timeout bounds each dial (0: DialTimeoutDefault).
	Timeout time.Duration

	mu     sync.Mutex       // guards failed
	failed map[string]error // address -> its last dial error
}

var _ nats.CustomDialer = (*DialRecorder)(nil)

// Dial dials address and records a failure.
func (d *DialRecorder) Dial(network, address string) (net.Conn, error) {
	timeout := d.Timeout
	if timeout <= 0 {
		timeout = DialTimeoutDefault
	}
	c, err := (&net.Dialer{Timeout: timeout}).Dial(network, address)
	d.mu.Lock()
	defer d.mu.Unlock()
	if err == nil {
		delete(d.failed, address)
		return c, nil
	}
	if d.failed == nil {
		d.failed = map[string]error{}
	}
	if _, ok := d.failed[address]; ok || len(d.failed) < maxRecordedDials {
		d.failed[address] = err
	}
	return nil, err
}

// Option makes a connection dial through d.
func (d *DialRecorder) Option() nats.Option { return nats.SetCustomDialer(d) }

// Explain returns err with the dial errors added (one per address, in
// address order) when err is nats.go's ErrNoServers, which hides them;
// otherwise err unchanged.
func (d *DialRecorder) Explain(err error) error {
	if !errors.Is(err, nats.ErrNoServers) {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.failed) == 0 {
		return err
	}
	addrs := slices.Sorted(maps.Keys(d.failed))
	errs := []error{err}
	for _, a := range addrs {
		errs = append(errs, d.failed[a])
	}
	return joinedErrors(errs)
}

// joinedErrors is errors.Join on one line: the first error, ": ", then
// the others separated by "; ".
type joinedErrors []error

func (j joinedErrors) Error() string {
	var b strings.Builder
	for i, e := range j {
		switch i {
		case 0:
		case 1:
			b.WriteString(": ")
		default:
			b.WriteString("; ")
		}
		b.WriteString(e.Error())
	}
	return b.String()
}

func (j joinedErrors) Unwrap() []error { return j }
