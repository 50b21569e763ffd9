package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ticketd/ticketd/internal/testkit"
	"github.com/ticketd/ticketd/internal/testkit/testcluster"
)

// candidate is one running election process.
type candidate struct {
	id   string
	cmd  *exec.Cmd
	mu   sync.Mutex
	out  bytes.Buffer
	done chan struct{}
}

func (c *candidate) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.out.Write(p)
}

func (c *candidate) output() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.out.String()
}

var electedRE = regexp.MustCompile(`(?m)^(\S+) elected token=(\d+)$`)

// terms are the tokens c was elected with, in order.
func (c *candidate) terms() []uint64 {
	var out []uint64
	for _, m := range electedRE.FindAllStringSubmatch(c.output(), -1) {
		tok, _ := strconv.ParseUint(m[2], 10, 64)
		out = append(out, tok)
	}
	return out
}

// TestThreeCandidates runs three candidates as processes against a
// three-node cluster: exactly one is elected; it is killed with SIGKILL
// and another takes over within the lease with a larger token; that one
// resigns on SIGTERM and the last takes over at once with a larger token
// still.
func TestThreeCandidates(t *testing.T) {
	if testing.Short() {
		t.Skip("process test skipped in -short mode")
	}
	bin := filepath.Join(t.TempDir(), "election")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	c := testcluster.New(t, 3)
	lead := c.Leader(10 * time.Second)
	testkit.Eventually(t, 10*time.Second, "a settled leader", func() bool { return testcluster.Settled(c.Node(lead)) })
	urls := strings.Join([]string{c.ClientURL(0), c.ClientURL(1), c.ClientURL(2)}, ",")
	const lease = 2 * time.Second

	var cands []*candidate
	for i := 1; i <= 3; i++ {
		cd := &candidate{id: fmt.Sprintf("c%d", i), done: make(chan struct{})}
		cd.cmd = exec.Command(bin, "--nats", urls, "--id", cd.id, "--lease", lease.String(), "--work", "100ms")
		cd.cmd.Stdout, cd.cmd.Stderr = cd, cd
		cd.cmd.Env = os.Environ()
		if err := cd.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go func() { _ = cd.cmd.Wait(); close(cd.done) }()
		t.Cleanup(func() {
			select {
			case <-cd.done:
			default:
				_ = cd.cmd.Process.Kill()
				<-cd.done
			}
			if t.Failed() {
				t.Logf("%s output:\n%s", cd.id, cd.output())
			}
		})
		cands = append(cands, cd)
	}
	leader := func(alive []*candidate, after uint64) (*candidate, uint64) {
		var who *candidate
		var tok uint64
		testkit.Eventually(t, 10*time.Second, fmt.Sprintf("a leader with a token above %d", after), func() bool {
			who, tok = nil, 0
			for _, cd := range alive {
				ts := cd.terms()
				if len(ts) > 0 && ts[len(ts)-1] > after {
					if who != nil {
						t.Fatalf("%s and %s both elected after token %d", who.id, cd.id, after)
					}
					who, tok = cd, ts[len(ts)-1]
				}
			}
			return who != nil
		})
		return who, tok
	}
	first, tok1 := leader(cands, 0)
	t.Logf("%s elected with token %d", first.id, tok1)

	killed := time.Now()
	if err := first.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-first.done
	rest := without(cands, first)
	second, tok2 := leader(rest, tok1)
	took := time.Since(killed)
	t.Logf("%s killed; %s elected with token %d after %v (lease %v)", first.id, second.id, tok2, took, lease)
	if took > lease+2*time.Second {
		t.Fatalf("takeover after a kill took %v, want within the lease %v (+2s)", took, lease)
	}

	resigned := time.Now()
	if err := second.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	third, tok3 := leader(without(rest, second), tok2)
	t.Logf("%s resigned; %s elected with token %d after %v", second.id, third.id, tok3, time.Since(resigned))
	select {
	case <-second.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the resigned candidate did not exit")
	}
	if !strings.Contains(second.output(), "resigning token="+strconv.FormatUint(tok2, 10)) {
		t.Fatalf("%s did not resign its term", second.id)
	}
	if !strings.Contains(third.output(), "observed leader="+second.id) {
		t.Fatalf("%s never observed %s as leader", third.id, second.id)
	}
}

func without(cs []*candidate, gone *candidate) []*candidate {
	var out []*candidate
	for _, c := range cs {
		if c != gone {
			out = append(out, c)
		}
	}
	return out
}
