package faults

import (
	"net"
	"sync"
	"time"
)

type proxyState int

const (
	proxyPass proxyState = iota
	proxyDrop
	proxyBlackhole
)

// proxy is a TCP relay on 127.0.0.1 for one directed raft link (the
// peer transport dials one connection per direction, so cutting the proxy
// of a -> b silences a's messages to b only). In drop mode it closes its
// connections and refuses new ones; in blackhole mode it keeps every
// connection open and discards what arrives, the way a silent network
// loses packets, and closes those connections when the link heals (a
// stream with a hole in it cannot resume).
type proxy struct {
	ln     net.Listener
	target string

	mu     sync.Mutex
	state  proxyState
	conns  map[*proxyConn]struct{}
	closed bool
	wg     sync.WaitGroup
}

type proxyConn struct {
	down, up  net.Conn // down: accepted from the dialer; up: to the target (nil while blackholed from the start)
	blackhole bool     // guarded by proxy.mu
	once      sync.Once
}

func (pc *proxyConn) close() {
	pc.once.Do(func() {
		_ = pc.down.Close()
		if pc.up != nil {
			_ = pc.up.Close()
		}
	})
}

func newProxy(target string) (*proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &proxy{ln: ln, target: target, conns: map[*proxyConn]struct{}{}}
	p.wg.Add(1)
	go p.acceptLoop()
	return p, nil
}

func (p *proxy) addr() string { return p.ln.Addr().String() }

func (p *proxy) set(s proxyState) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.state = s
	for pc := range p.conns {
		switch {
		case s == proxyDrop:
			pc.close()
		case s == proxyBlackhole:
			pc.blackhole = true
		case s == proxyPass && pc.blackhole:
			pc.close()
		}
	}
}

func (p *proxy) acceptLoop() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		state, closed := p.state, p.closed
		p.mu.Unlock()
		if closed || state == proxyDrop {
			_ = c.Close()
			continue
		}
		pc := &proxyConn{down: c}
		if state == proxyPass {
			up, err := net.DialTimeout("tcp", p.target, time.Second)
			if err != nil {
				_ = c.Close()
				continue
			}
			pc.up = up
		} else {
			pc.blackhole = true
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			pc.close()
			continue
		}
		p.conns[pc] = struct{}{}
		p.mu.Unlock()
		p.wg.Add(1)
		go p.pipe(pc, pc.down, pc.up)
		if pc.up != nil {
			p.wg.Add(1)
			go p.pipe(pc, pc.up, pc.down)
		}
	}
}

// pipe copies src to dst until either side fails, discarding while the
// connection is blackholed.
func (p *proxy) pipe(pc *proxyConn, src, dst net.Conn) {
	defer p.wg.Done()
	defer func() {
		pc.close()
		p.mu.Lock()
		delete(p.conns, pc)
		p.mu.Unlock()
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			bh := pc.blackhole
			p.mu.Unlock()
			if !bh && dst != nil {
				if _, werr := dst.Write(buf[:n]); werr != nil {
					return
				}
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *proxy) close() {
	p.mu.Lock()
	p.closed = true
	for pc := range p.conns {
		pc.close()
	}
	p.mu.Unlock()
	_ = p.ln.Close()
	p.wg.Wait()
}
