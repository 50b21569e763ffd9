package faults

import (
	"errors"
	"fmt"
	"time"

	"github.com/ticketd/ticketd/raftstore"
)

// Storage faults (in-process driver): every node's store runs on its own
// testkit.FaultFS (Pebble's vfs/errorfs underneath), which the nemesis
// switches:
//
//   - disk-fsync: the log fsyncs of one node fail (EIO). The node must
//     stop at its next write (fail-stop: no acknowledgement rests on a
//     write that failed); it is restarted on a healthy disk after the hold.
//   - disk-full: one node's disk is full (writes fail with ENOSPC, free
//     space 0) for the hold. Its first write that meets it spends the
//     ballast and succeeds; the alarm refuses grants there and a leader
//     hands leadership over, so a majority keeps serving. Healed, the
//     ballast is made again and the alarm clears.
//   - disk-full-restart: a node is stopped, its disk fills, and it is
//     started again: the start must fail at once (ErrNoSpace) rather than
//     hang or spin; with space freed it starts and catches up.
//
// What the checkers already check covers the rest: no acknowledged grant
// or release is lost, replicas converge to one digest, and the workload
// keeps being served.

// Storage fault kinds.
const (
	FaultDiskSync        = "disk-fsync"
	FaultDiskFull        = "disk-full"
	FaultDiskFullRestart = "disk-full-restart"
)

// diskFaulter is a cluster whose nodes' disks the nemesis can break.
type diskFaulter interface {
	// failSync makes node i's log fsyncs fail until heal and reports
	// whether it stopped within wait (or had nothing to write: then it
	// is still running and ok is true).
	failSync(i int, wait time.Duration) (detail string, problems []string)
	// fillDisk fills node i's disk; ok is false (and nothing is done)
	// when the node is down or already in its disk alarm (its ballast
	// spent: a second full disk would stop it, which disk-fsync covers).
	fillDisk(i int) (ok bool)
	// freeDisk frees it again; a node the full disk stopped is restarted.
	freeDisk(i int) error
	// restartOnFullDisk stops node i, fills its disk, checks the start
	// fails at once, frees the disk and starts it.
	restartOnFullDisk(i int) (detail string, problems []string, err error)
	// healDisks turns every disk fault off.
	healDisks()
}

func (c *inprocCluster) failSync(i int, wait time.Duration) (string, []string) {
	d := c.node(i)
	if d == nil {
		return "node down", nil
	}
	c.mu.Lock()
	c.closing[i] = true // its stop is the expected outcome
	c.mu.Unlock()
	before := c.disks[i].FailedSyncs()
	c.disks[i].SetFailSync(true)
	select {
	case <-d.Done():
	case <-time.After(wait):
	}
	failed := c.disks[i].FailedSyncs() - before
	err := d.Node().Err()
	var sf *raftstore.StorageFailure
	switch {
	case failed == 0:
		return "no log fsync in the hold", nil
	case errors.As(err, &sf):
		return fmt.Sprintf("%d fsyncs failed; the node stopped: %v", failed, err), nil
	case err != nil:
		return "stopped", []string{fmt.Sprintf("a failed fsync stopped the node with %v, not a storage failure", err)}
	}
	return "", []string{fmt.Sprintf("%d log fsyncs failed and the node kept running", failed)}
}

func (c *inprocCluster) fillDisk(i int) bool {
	d := c.node(i)
	if d == nil || d.Store().Disk().Err() != nil {
		return false
	}
	c.mu.Lock()
	c.closing[i] = true // it may stop once its ballast is spent
	c.mu.Unlock()
	c.disks[i].SetFull(true)
	return true
}

func (c *inprocCluster) freeDisk(i int) error {
	c.disks[i].SetFull(false)
	d := c.node(i)
	if d != nil && d.Node().Err() == nil {
		c.mu.Lock()
		c.closing[i] = false
		c.mu.Unlock()
		return nil
	}
	if d != nil {
		if err := c.crash(i); err != nil {
			return err
		}
	}
	return c.restart(i)
}

func (c *inprocCluster) healDisks() {
	for _, d := range c.disks {
		d.SetFailSync(false)
		d.SetFull(false)
	}
}

func (c *inprocCluster) restartOnFullDisk(i int) (string, []string, error) {
	if c.running(i) {
		if err := c.crash(i); err != nil {
			return "", nil, err
		}
	}
	c.disks[i].SetFull(true)
	start := time.Now()
	err := c.restart(i)
	took := time.Since(start)
	c.disks[i].SetFull(false)
	var problems []string
	switch {
	case err == nil:
		problems = append(problems, "a node started on a full disk")
	case !errors.Is(err, raftstore.ErrNoSpace):
		problems = append(problems, fmt.Sprintf("the start on a full disk failed with %v, not ErrNoSpace", err))
	case took > 5*time.Second:
		problems = append(problems, fmt.Sprintf("refusing to start on a full disk took %v", took))
	}
	detail := fmt.Sprintf("start refused after %v (%v)", took.Round(time.Millisecond), err)
	if err == nil {
		return detail, problems, nil
	}
	return detail, problems, c.restart(i)
}

// injectDisk runs a storage fault kind.
func (n *nemesis) injectDisk(kind string, until time.Time) error {
	df, ok := n.c.(diskFaulter)
	if !ok {
		return errUnsupported
	}
	start := n.h.Now()
	i := n.leaderOr(true)
	if n.rng.IntN(2) == 0 {
		i = n.follower()
	}
	var detail string
	var problems []string
	var err error
	switch kind {
	case FaultDiskSync:
		detail, problems = df.failSync(i, 10*n.base)
		n.hold(until)
		df.healDisks()
		if n.c.running(i) {
			err = n.c.crash(i)
		}
		err = errors.Join(err, n.c.restart(i))
	case FaultDiskFull:
		if !df.fillDisk(i) {
			detail = "skipped: node down or already in its disk alarm"
			break
		}
		n.hold(until)
		err = df.freeDisk(i)
		detail = "writes fail with ENOSPC until the ballast is released"
	case FaultDiskFullRestart:
		detail, problems, err = df.restartOnFullDisk(i)
	}
	n.record(kind, ids(i), start, detail)
	n.mu.Lock()
	for _, p := range problems {
		n.violations = append(n.violations, Violation{Checker: kind, Message: fmt.Sprintf("node %d: %s", i+1, p)})
	}
	n.mu.Unlock()
	return err
}
