package faults

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"sort"
	"sync"
	"time"
)

// OpKind is a client operation.
type OpKind string

// The lock operations the workload issues.
const (
	OpAcquire OpKind = "acquire"
	OpRelease OpKind = "release"
	OpGet     OpKind = "get"
	OpRenew   OpKind = "renew"
)

// Outcome classifies what a client learned from one operation.
type Outcome string

// Outcomes. OutFail is a definite failure that certainly changed nothing
// (a retryable code after the SDK gave up, or nothing sent); OutUnknown is
// an indeterminate outcome (the operation may or may not have taken
// effect, at any time after its call).
const (
	OutOK       Outcome = "ok"        // acquire granted, release released, get answered, renew renewed
	OutHeld     Outcome = "held"      // try-only acquire: the key is held
	OutTimeout  Outcome = "timeout"   // waiting acquire: the wait ran out
	OutNotFound Outcome = "not_found" // release, renew: no lock with that token
	OutFail     Outcome = "fail"      // definite failure, no effect
	OutUnknown  Outcome = "unknown"   // indeterminate
)

// Op is one client operation as recorded by the workload. Times are
// nanoseconds on the harness's monotonic clock since the run started.
type Op struct {
	ID     int    `json:"id"`
	Round  int    `json:"round"`
	Client int    `json:"client"`
	Kind   OpKind `json:"kind"`
	Key    string `json:"key"`
	// Lease is the requested lease: of an acquire, or of a renew (0:
	// keep the lock's lease).
	Lease  int64   `json:"lease_ns,omitempty"`
	Wait   int64   `json:"wait_ns,omitempty"` // acquire: requested queue wait
	Call   int64   `json:"call_ns"`
	Return int64   `json:"return_ns"`
	Result Outcome `json:"outcome"`
	// Token is the granted token (acquire ok), the token released
	// (release) or renewed (renew), or the holder's token (get ok, 0 when
	// free).
	Token uint64 `json:"token,omitempty"`
	Held  bool   `json:"held,omitempty"` // get ok: the key was held
	// Granted is the granted lease and Deadline the SDK's Lock.Deadline()
	// (send time of the successful attempt + granted lease), acquire ok.
	// Renew ok: Deadline is the holder's new local deadline (the
	// Lock.Deadline() after Lock.Renew, or Renewal.Deadline of a
	// Client.Renew asking for a longer lease: send time + the lease in
	// the reply), and Granted the lease in the reply when the SDK
	// returned it (Client.Renew; 0 after Lock.Renew).
	Granted  int64  `json:"granted_ns,omitempty"`
	Deadline int64  `json:"deadline_ns,omitempty"`
	Code     string `json:"code,omitempty"`
	Err      string `json:"err,omitempty"`
	// Lock is the kind of the key ("" a mutex; kinds.go): Limit the
	// semaphore's limit (acquire), Shared a shared hold (acquire) or a
	// key held shared (get), Holders every holder's token (get ok of a
	// semaphore or read/write key, token order).
	Lock    LockKind `json:"lock,omitempty"`
	Limit   int      `json:"limit,omitempty"`
	Shared  bool     `json:"shared,omitempty"`
	Holders []uint64 `json:"holders,omitempty"`
}

// Since is the earliest moment the lease of a granted acquire can have
// started on the leader: the SDK's send time of the successful attempt.
func (o Op) Since() int64 { return o.Deadline - o.Granted }

// promise is what a confirmed grant or renewal lets the holder assume:
// the lock is its until End on the holder's clock, less every forward
// jump of a lease clock since From (the lease was armed no earlier).
type promise struct{ From, End int64 }

// promised is the promise of an acquire ok or a renew ok. A renewal's
// jumps are counted from its call, before its send: the lease was re-armed
// after that, and the earlier start only counts more jumps.
func (o Op) promised() promise {
	if o.Kind == OpRenew {
		return promise{From: o.Call, End: o.Deadline}
	}
	return promise{From: o.Since(), End: o.Deadline}
}

func (o Op) String() string {
	var s string
	switch o.Kind {
	case OpAcquire:
		mode := ""
		switch {
		case o.Lock == LockSemaphore:
			mode = fmt.Sprintf(" limit=%d", o.Limit)
		case o.Shared:
			mode = " shared"
		case o.Lock == LockRW:
			mode = " exclusive"
		}
		s = fmt.Sprintf("acquire(%s%s lease=%v wait=%v)", o.Key, mode, time.Duration(o.Lease), time.Duration(o.Wait))
		if o.Result == OutOK {
			s += fmt.Sprintf(" -> ok token=%d deadline=%s", o.Token, ms(o.Deadline))
		} else {
			s += " -> " + string(o.Result)
		}
	case OpRelease:
		s = fmt.Sprintf("release(%s token=%d) -> %s", o.Key, o.Token, o.Result)
	case OpRenew:
		s = fmt.Sprintf("renew(%s token=%d lease=%v)", o.Key, o.Token, time.Duration(o.Lease))
		if o.Result == OutOK {
			s += fmt.Sprintf(" -> ok deadline=%s", ms(o.Deadline))
			if o.Granted > 0 {
				s += fmt.Sprintf(" lease=%v", time.Duration(o.Granted))
			}
		} else {
			s += " -> " + string(o.Result)
		}
	case OpGet:
		s = fmt.Sprintf("get(%s) -> %s", o.Key, o.Result)
		if o.Result == OutOK {
			switch {
			case len(o.Holders) > 0 && o.Shared:
				s += fmt.Sprintf(" held shared by %v", o.Holders)
			case len(o.Holders) > 0:
				s += fmt.Sprintf(" held by %v", o.Holders)
			case o.Held:
				s += fmt.Sprintf(" held token=%d", o.Token)
			default:
				s += " free"
			}
		}
	}
	if o.Code != "" {
		s += " [" + o.Code + "]"
	}
	return fmt.Sprintf("#%d client %d [%s, %s] %s", o.ID, o.Client, ms(o.Call), ms(o.Return), s)
}

func ms(ns int64) string {
	if ns == math.MaxInt64 {
		return "∞"
	}
	return fmt.Sprintf("%.3fs", float64(ns)/1e9)
}

// Write is one attempt of a lock holder to write to the fenced resource.
type Write struct {
	Round    int    `json:"round"`
	Client   int    `json:"client"`
	Key      string `json:"key"`
	Token    uint64 `json:"token"`
	At       int64  `json:"at_ns"`
	Accepted bool   `json:"accepted"`
	// Highest is the highest token the resource had accepted for the key
	// before this write. A refused use of a semaphore or read/write key:
	// Blocking are the users in the way, Highest the oldest of them.
	Highest  uint64   `json:"highest"`
	Blocking []uint64 `json:"blocking,omitempty"`
}

// Jump is one step of a node's lease clock.
type Jump struct {
	At    int64 `json:"at_ns"`
	Node  int   `json:"node"`
	Delta int64 `json:"delta_ns"`
}

// Fault is one injected fault.
type Fault struct {
	Round   int    `json:"round"`
	Kind    string `json:"kind"`
	Targets []int  `json:"targets,omitempty"` // node ids (1-based)
	Start   int64  `json:"start_ns"`
	End     int64  `json:"end_ns"`
	Detail  string `json:"detail,omitempty"`
}

// History is everything a run recorded. It is safe for concurrent use
// while recording.
type History struct {
	start time.Time

	mu     sync.Mutex
	Ops    []Op    `json:"ops"`
	Writes []Write `json:"writes"`
	Jumps  []Jump  `json:"jumps"`
	Faults []Fault `json:"faults"`
	round  int
}

// NewHistory starts the harness clock.
func NewHistory() *History { return &History{start: time.Now()} }

// Now is the harness clock: nanoseconds since the run started.
func (h *History) Now() int64 { return int64(time.Since(h.start)) }

// Rel converts a monotonic time to the harness clock.
func (h *History) Rel(t time.Time) int64 { return int64(t.Sub(h.start)) }

func (h *History) setRound(r int) {
	h.mu.Lock()
	h.round = r
	h.mu.Unlock()
}

func (h *History) addOp(o Op) {
	h.mu.Lock()
	o.ID = len(h.Ops)
	o.Round = h.round
	h.Ops = append(h.Ops, o)
	h.mu.Unlock()
}

func (h *History) addWrite(w Write) {
	h.mu.Lock()
	w.Round = h.round
	h.Writes = append(h.Writes, w)
	h.mu.Unlock()
}

func (h *History) addJump(j Jump) {
	h.mu.Lock()
	h.Jumps = append(h.Jumps, j)
	h.mu.Unlock()
}

func (h *History) addFault(f Fault) {
	h.mu.Lock()
	f.Round = h.round
	h.Faults = append(h.Faults, f)
	h.mu.Unlock()
}

// backwardJumps is the sum of every backward lease clock step so far:
// how much longer than its lease a lock may live.
func (h *History) backwardJumps() time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	var d time.Duration
	for _, j := range h.Jumps {
		if j.Delta < 0 {
			d -= time.Duration(j.Delta)
		}
	}
	return d
}

// snapshot copies the records of one round (round < 0: all).
func (h *History) snapshot(round int) (ops []Op, writes []Write, jumps []Jump, faults []Fault) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, o := range h.Ops {
		if round < 0 || o.Round == round {
			ops = append(ops, o)
		}
	}
	for _, w := range h.Writes {
		if round < 0 || w.Round == round {
			writes = append(writes, w)
		}
	}
	for _, f := range h.Faults {
		if round < 0 || f.Round == round {
			faults = append(faults, f)
		}
	}
	// Jumps are global: a lease granted in one round is not affected by a
	// later round's jumps, and the allowance only counts jumps inside a
	// lock's window.
	jumps = append(jumps, h.Jumps...)
	sort.Slice(jumps, func(i, j int) bool { return jumps[i].At < jumps[j].At })
	return ops, writes, jumps, faults
}

// historyFile is the JSON form written on failure and read by replay.
type historyFile struct {
	Name       string      `json:"name"`
	Seed       uint64      `json:"seed"`
	Nodes      int         `json:"nodes"`
	Mode       string      `json:"mode"`
	Ops        []Op        `json:"ops"`
	Writes     []Write     `json:"writes"`
	Jumps      []Jump      `json:"jumps"`
	Faults     []Fault     `json:"faults"`
	Violations []Violation `json:"violations"`
	Excused    []string    `json:"excused,omitempty"`
}

func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", " ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}

func readHistoryFile(path string) (*historyFile, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var hf historyFile
	if err := json.Unmarshal(b, &hf); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &hf, nil
}
