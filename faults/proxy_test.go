package faults

import (
	"bufio"
	"net"
	"testing"
	"time"
)

// echoServer answers every line with the same line.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				sc := bufio.NewScanner(c)
				for sc.Scan() {
					if _, err := c.Write(append(sc.Bytes(), '\n')); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}

func roundTrip(c net.Conn, msg string, within time.Duration) (string, error) {
	_ = c.SetDeadline(time.Now().Add(within))
	if _, err := c.Write([]byte(msg + "\n")); err != nil {
		return "", err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	return line, err
}

func TestProxyModes(t *testing.T) {
	p, err := newProxy(echoServer(t))
	if err != nil {
		t.Fatal(err)
	}
	defer p.close()
	c, err := net.Dial("tcp", p.addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got, err := roundTrip(c, "a", time.Second); err != nil || got != "a\n" {
		t.Fatalf("pass: %q %v", got, err)
	}
	p.set(proxyBlackhole)
	if got, err := roundTrip(c, "b", 200*time.Millisecond); err == nil {
		t.Fatalf("blackhole delivered %q", got)
	}
	p.set(proxyPass)
	// The blackholed connection is closed when the link heals.
	if _, err := roundTrip(c, "c", time.Second); err == nil {
		t.Fatal("a blackholed connection survived the heal")
	}
	c2, err := net.Dial("tcp", p.addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if got, err := roundTrip(c2, "d", time.Second); err != nil || got != "d\n" {
		t.Fatalf("after heal: %q %v", got, err)
	}
	p.set(proxyDrop)
	if _, err := roundTrip(c2, "e", time.Second); err == nil {
		t.Fatal("drop kept an existing connection")
	}
	if c3, err := net.Dial("tcp", p.addr()); err == nil {
		if _, err := roundTrip(c3, "f", time.Second); err == nil {
			t.Fatal("drop accepted a new connection")
		}
		c3.Close()
	}
}
