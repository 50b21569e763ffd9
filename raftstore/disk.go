package raftstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"go.etcd.io/raft/v3"
)

// Disk space: an alarm before the disk is full, a ballast for when it is.
//
// A store on a disk that fills up must fail safely. Pebble cannot go on
// after a failed WAL write (it is fail-stop, like etcd on a failed WAL
// sync), so the store keeps that moment away and makes it visible:
//
//   - The DiskGuard polls the free space of the store's filesystem every
//     CheckInterval. Below AlarmBytes the alarm is on: the ticketd_disk_alarm
//     metric is 1, status reports it, one line is logged, and the lock
//     service refuses Grants with resource_exhausted (Err is its
//     lockservice StorageAlarm) while releases and expiries still apply;
//     they only free space and write little.
//   - A ballast file (BALLAST in the store directory, BallastBytes, made
//     with fallocate) reserves room. Should a write still meet a full disk
//     (ENOSPC: the alarm came too late, or something else filled the
//     disk), Pebble's vfs.OnDiskFull wrapper hands it to us: the ballast
//     is deleted, the alarm turns on, and the write is retried once, in
//     the room the ballast left, instead of stopping the node mid-traffic.
//     The alarm stays on until there is room for the ballast again (it is
//     then made again) and AlarmBytes above it.
//   - Open refuses to start with less than MinStartBytes free (a quarter of
//     the alarm level by default) with ErrNoSpace and a message that says
//     what to do, instead of letting Pebble retry its flushes for ever.
//
// What is left, a write failing with the ballast already spent or any
// other storage error, is fail-stop with one clear log line (logger.go).

// Defaults of DiskOptions.
const (
	DiskAlarmBytesDefault   = 256 << 20
	DiskBallastBytesDefault = 64 << 20
	DiskCheckDefault        = time.Second
)

// ErrNoSpace: the store's disk is (nearly) full. Returned by Open below
// DiskOptions.MinStartBytes, and matched by the DiskGuard's alarm.
var ErrNoSpace = errors.New("raftstore: not enough free disk space")

// DiskOptions configures the DiskGuard of a Store. Zero fields take the
// defaults; BallastBytes < 0 means no ballast.
type DiskOptions struct {
	AlarmBytes    int64
	BallastBytes  int64
	MinStartBytes int64 // default AlarmBytes/4
	CheckInterval time.Duration
}

func (o *DiskOptions) withDefaults() {
	if o.AlarmBytes <= 0 {
		o.AlarmBytes = DiskAlarmBytesDefault
	}
	if o.BallastBytes == 0 {
		o.BallastBytes = DiskBallastBytesDefault
	}
	if o.BallastBytes < 0 {
		o.BallastBytes = 0
	}
	if o.MinStartBytes <= 0 {
		o.MinStartBytes = o.AlarmBytes / 4
	}
	if o.CheckInterval <= 0 {
		o.CheckInterval = DiskCheckDefault
	}
}

// NoSpaceError is the disk alarm: why Grants are refused.
type NoSpaceError struct {
	Dir        string
	FreeBytes  uint64
	AlarmBytes int64
	// Full is set when a write met a full disk (ENOSPC) and the ballast
	// was spent on it.
	Full bool
}

func (e *NoSpaceError) Error() string {
	if e.Full {
		return fmt.Sprintf("the disk of %s filled up (%d MiB free now); the reserve was released to keep applying releases and expiries", e.Dir, e.FreeBytes>>20)
	}
	return fmt.Sprintf("%s has %d MiB free, below the alarm at %d MiB", e.Dir, e.FreeBytes>>20, e.AlarmBytes>>20)
}

// Is makes errors.Is(err, ErrNoSpace) hold.
func (e *NoSpaceError) Is(target error) bool { return target == ErrNoSpace }

// DiskGuard watches a store's free space (see above).
type DiskGuard struct {
	opts    DiskOptions
	fs      vfs.FS // the filesystem without the OnDiskFull wrapper
	dir     string
	ballast string
	log     *slog.Logger
	metrics *Metrics

	free  atomic.Uint64
	full  atomic.Bool                  // a write met ENOSPC and the ballast is spent
	alarm atomic.Pointer[NoSpaceError] // nil: no alarm

	stop chan struct{}
	done chan struct{}
	once sync.Once
}

func newDiskGuard(fs vfs.FS, dir string, opts DiskOptions, log *slog.Logger, m *Metrics) *DiskGuard {
	opts.withDefaults()
	return &DiskGuard{opts: opts, fs: fs, dir: dir, ballast: fs.PathJoin(dir, "BALLAST"), log: log, metrics: m,
		stop: make(chan struct{}), done: make(chan struct{})}
}

// checkStart refuses to open a store with less than MinStartBytes free.
func (g *DiskGuard) checkStart() error {
	u, err := g.fs.GetDiskUsage(g.dir)
	if err != nil {
		return fmt.Errorf("raftstore: disk usage of %s: %w", g.dir, err)
	}
	if int64(u.AvailBytes) < g.opts.MinStartBytes {
		return fmt.Errorf("%w: %s has %d MiB free, a node needs at least %d MiB to start (a quarter of the disk alarm level): free space on that disk and start again",
			ErrNoSpace, g.dir, u.AvailBytes>>20, g.opts.MinStartBytes>>20)
	}
	return nil
}

// onDiskFull is called by the vfs.OnDiskFull wrapper when a write met
// ENOSPC, with every new write held until it returns: release the ballast
// so that the retry has room, and turn the alarm on.
func (g *DiskGuard) onDiskFull() {
	g.full.Store(true)
	if err := g.fs.Remove(g.ballast); err != nil && !errors.Is(err, os.ErrNotExist) {
		g.log.Error("disk full and the ballast could not be removed", "err", err)
	}
	g.check(false)
}

// start makes the ballast if there is room and starts polling.
func (g *DiskGuard) start() {
	g.check(true)
	go g.run()
}

func (g *DiskGuard) run() {
	defer close(g.done)
	t := time.NewTicker(g.opts.CheckInterval)
	defer t.Stop()
	for {
		select {
		case <-g.stop:
			return
		case <-t.C:
			g.check(true)
		}
	}
}

func (g *DiskGuard) close() {
	g.once.Do(func() {
		close(g.stop)
		select {
		case <-g.done:
		case <-time.After(5 * time.Second): // never started
		}
	})
}

// check reads the free space, makes the ballast again when there is room
// (and remake allows it: not from the ENOSPC handler, which just removed
// it), and sets the alarm.
func (g *DiskGuard) check(remake bool) {
	u, err := g.fs.GetDiskUsage(g.dir)
	if err != nil {
		g.log.Warn("reading free disk space", "dir", g.dir, "err", err)
		return
	}
	free := u.AvailBytes
	if remake && g.opts.BallastBytes > 0 && !g.hasBallast() && int64(free) >= g.opts.AlarmBytes+g.opts.BallastBytes {
		if err := g.makeBallast(); err != nil {
			g.log.Warn("making the disk ballast", "err", err)
		} else if u2, err := g.fs.GetDiskUsage(g.dir); err == nil {
			free = u2.AvailBytes
		}
	}
	g.free.Store(free)
	full := g.full.Load()
	if full && (g.opts.BallastBytes == 0 || g.hasBallast()) && int64(free) >= g.opts.AlarmBytes {
		g.full.Store(false)
		full = false
	}
	var alarm *NoSpaceError
	if full || int64(free) < g.opts.AlarmBytes {
		alarm = &NoSpaceError{Dir: g.dir, FreeBytes: free, AlarmBytes: g.opts.AlarmBytes, Full: full}
	}
	// The metric first, so whoever sees the alarm sees the gauge too.
	g.metrics.observeDisk(free, alarm != nil)
	prev := g.alarm.Swap(alarm)
	switch {
	case prev == nil && alarm != nil:
		g.log.Warn("storage low on space: grants are refused (releases and expiries still apply)", "alarm", alarm.Error())
	case prev != nil && alarm == nil:
		g.log.Info("storage space recovered: grants are accepted again", "free_mib", free>>20)
	}
}

func (g *DiskGuard) hasBallast() bool {
	st, err := g.fs.Stat(g.ballast)
	return err == nil && st.Size() >= g.opts.BallastBytes
}

func (g *DiskGuard) makeBallast() error {
	f, err := g.fs.Create(g.ballast, vfs.WriteCategoryUnspecified)
	if err != nil {
		return err
	}
	err = f.Preallocate(0, g.opts.BallastBytes)
	if err == nil {
		// Preallocate reserves blocks without changing the size on some
		// filesystems; the size makes hasBallast true.
		_, err = f.WriteAt([]byte{0}, g.opts.BallastBytes-1)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = g.fs.Remove(g.ballast)
	}
	return err
}

// Err is the disk alarm: nil while there is room, a *NoSpaceError
// (matching ErrNoSpace) while Grants must be refused. It is the lock
// service's StorageAlarm.
func (g *DiskGuard) Err() error {
	if a := g.alarm.Load(); a != nil {
		return a
	}
	return nil
}

// FreeBytes is the free space at the last check.
func (g *DiskGuard) FreeBytes() uint64 { return g.free.Load() }

// Leadership on a low disk.
//
// A leader whose disk is low refuses every Grant, while a follower with
// room could serve them. So, while its alarm is on, the leader hands
// leadership to the most up-to-date voter (raft's leadership transfer: the
// target campaigns at once, nothing is lost), at most once every
// yieldEvery election timeouts so that a cluster whose disks are all low
// does not pass it around for ever. A follower on a low disk needs
// nothing: it only appends, and if it runs out it stops while the
// majority goes on.

// yieldEvery bounds leadership transfers on a low disk, in election
// timeouts.
const yieldEvery = 10

// yieldLoop checks the disk alarm of a leader every election timeout.
func (n *Node) yieldLoop() {
	defer n.bg.Done()
	election := time.Duration(n.cfg.ElectionTicks) * n.cfg.TickInterval
	t := time.NewTicker(election)
	defer t.Stop()
	var last time.Time
	for {
		select {
		case <-n.stopc:
			return
		case <-t.C:
		}
		alarm := n.cfg.Store.Disk().Err()
		if alarm == nil || !n.isLeader.Load() || time.Since(last) < yieldEvery*election {
			continue
		}
		if target := n.transferTarget(); target != 0 {
			last = time.Now()
			n.log.Warn("leader on a low disk hands leadership over", "to", target, "alarm", alarm.Error())
			// The planned move (handover.go): drained first, so nothing
			// it took ends indeterminate. It ends when the node stops.
			ctx, cancel := context.WithTimeout(context.Background(), 2*election)
			if err := n.handOverTo(ctx, target); err != nil && !errors.Is(err, ErrNotLeader) {
				n.log.Warn("leader on a low disk could not hand leadership over", "to", target, "err", err)
			}
			cancel()
		}
	}
}

// transferIfLeader starts raft's leadership transfer to target if this
// node still leads when the loop runs it, and says whether it did: on a
// follower raft would forward the request to the leader, which would then
// drop proposals for a transfer nobody asked of it. Loop only.
func transferIfLeader(rn *raft.RawNode, target uint64) bool {
	st := rn.BasicStatus()
	if st.RaftState != raft.StateLeader {
		return false
	}
	if st.LeadTransferee != 0 {
		// A transfer left by a move that gave up waiting: raft would
		// ignore a second one to the same node and keep the first one's
		// deadline. Asking for itself aborts it; then start afresh.
		rn.TransferLeader(st.ID)
	}
	rn.TransferLeader(target)
	return true
}

// transferTarget is the voter, other than this node, that the leader
// heard from lately (raft's RecentActive) with the highest match index (0
// if none).
func (n *Node) transferTarget() uint64 {
	st := n.Status()
	var best, match uint64
	for _, id := range n.ConfState().Voters {
		if pr, ok := st.Progress[id]; ok && id != n.cfg.ID && pr.RecentActive && pr.Match >= match {
			best, match = id, pr.Match
		}
	}
	return best
}
