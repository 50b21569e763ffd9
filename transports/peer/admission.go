package peer

import (
	"context"
	"net"
	"slices"
	"sync/atomic"
	"time"
)

// Admission: which inbound connections the listener keeps while they are
// not yet authenticated. Anyone can open TCP connections to the peer port,
// from as many addresses as they have, and say nothing; a member must
// still get through. So the pending connections are a connlimit.Table:
// at most MaxPendingHandshakesPerSource from one address, at most
// MaxPendingHandshakes from addresses that are not a member's, and a new
// connection evicts the oldest pending one rather than being refused.
// Connections from a member's address are reserved: they are not counted
// against MaxPendingHandshakes and no other address can evict them, so a
// flood from anywhere else never delays a member. Every pending
// connection must also send its hello within HelloTimeout.
//
// A member's addresses are the host of its peer address when that is an
// IP, what its host name resolves to (again every memberResolveInterval),
// and the addresses it has authenticated from (its outgoing address may
// differ from the one it listens on).

const (
	// memberResolveInterval is how often host names in members' peer
	// addresses are resolved again (an address that moved, as a
	// rescheduled container's does, is found again within it).
	memberResolveInterval = 30 * time.Second
	// maxMemberSources bounds the resolved, and the learned, addresses
	// remembered per member.
	maxMemberSources = 4
)

// pendingConn is an inbound connection admitted to the pending table.
type pendingConn struct {
	raw     net.Conn
	evicted atomic.Bool // closed to make room for a newer connection
}

func (c *pendingConn) evict() {
	c.evicted.Store(true)
	_ = c.raw.Close()
}

// hostIP is the host of addr in canonical form when it is an IP literal,
// else "".
func hostIP(addr string) string {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return ""
	}
	if ip := net.ParseIP(host); ip != nil {
		return ip.String()
	}
	return ""
}

// isMemberSource reports whether source is the address of a current
// member.
func (t *Transport) isMemberSource(source string) bool {
	t.mu.RLock()
	defer t.mu.RUnlock()
	for _, p := range t.peers {
		if p.hostIP == source || slices.Contains(p.resolved, source) || slices.Contains(p.learned, source) {
			return true
		}
	}
	return false
}

// learnSource records that member id authenticated from source.
func (t *Transport) learnSource(id uint64, source string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	p := t.peers[id]
	if p == nil || p.hostIP == source || slices.Contains(p.learned, source) {
		return
	}
	p.learned = append(p.learned, source)
	if len(p.learned) > maxMemberSources {
		p.learned = slices.Delete(p.learned, 0, 1)
	}
}

// resolveSoon asks the resolve loop for a round now (a peer was added).
func (t *Transport) resolveSoon() {
	select {
	case t.resolveNow <- struct{}{}:
	default:
	}
}

// resolveLoop resolves members' host names at start, when a peer is
// added and every memberResolveInterval, until the transport stops.
func (t *Transport) resolveLoop() {
	defer t.wg.Done()
	tick := time.NewTicker(memberResolveInterval)
	defer tick.Stop()
	for {
		t.resolveMembers()
		select {
		case <-t.ctx.Done():
			return
		case <-tick.C:
		case <-t.resolveNow:
		}
	}
}

// resolveMembers resolves the host name of every member whose peer
// address has one, each lookup bounded by DialTimeout.
func (t *Transport) resolveMembers() {
	t.mu.RLock()
	var named []*peer
	for _, p := range t.peers {
		if p.hostIP == "" {
			named = append(named, p)
		}
	}
	t.mu.RUnlock()
	for _, p := range named {
		host, _, err := net.SplitHostPort(p.addr)
		if err != nil {
			continue
		}
		ctx, cancel := context.WithTimeout(t.ctx, t.cfg.DialTimeout)
		addrs, err := net.DefaultResolver.LookupIPAddr(ctx, host)
		cancel()
		if err != nil {
			t.log.Debug("peer: resolving a member's address failed", "peer", p.id, "addr", p.addr, "err", err)
			continue
		}
		var ips []string
		for _, a := range addrs[:min(len(addrs), maxMemberSources)] {
			ips = append(ips, a.IP.String())
		}
		t.mu.Lock()
		if t.peers[p.id] == p {
			p.resolved = ips
		}
		t.mu.Unlock()
	}
}
