package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// clockTicks is USER_HZ, the unit of utime and stime in /proc/<pid>/stat:
// 100 on every Linux architecture Go runs on (the kernel fixes it for
// user space whatever its own HZ).
const clockTicks = 100

// nodeCPU reads the CPU time (user+system) that local node processes
// used, from /proc; it works only against nodes on this machine.
type nodeCPU struct {
	pids []int
}

// findNodes returns the pids of every local `ticketd serve` process: its
// argv[0] ends in "ticketd" and argv[1] is "serve".
func findNodes() ([]int, error) {
	dirs, err := filepath.Glob("/proc/[0-9]*")
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, d := range dirs {
		raw, err := os.ReadFile(filepath.Join(d, "cmdline"))
		if err != nil {
			continue // gone, or not ours to read
		}
		argv := bytes.Split(raw, []byte{0})
		if len(argv) < 2 || filepath.Base(string(argv[0])) != "ticketd" || string(argv[1]) != "serve" {
			continue
		}
		if pid, err := strconv.Atoi(filepath.Base(d)); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

// parsePids parses --cpu-pids: "auto" (findNodes), "none", or a comma
// list of pids.
func parsePids(spec string) ([]int, error) {
	switch spec {
	case "none", "":
		return nil, nil
	case "auto":
		return findNodes()
	}
	var pids []int
	for _, f := range strings.Split(spec, ",") {
		pid, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || pid <= 0 {
			return nil, fmt.Errorf("--cpu-pids: %q is not a pid", f)
		}
		pids = append(pids, pid)
	}
	return pids, nil
}

// total is the CPU time the processes used so far.
func (n nodeCPU) total() (time.Duration, error) {
	var ticks uint64
	for _, pid := range n.pids {
		raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return 0, fmt.Errorf("node process %d: %w", pid, err)
		}
		// The command name (field 2) may hold spaces: count from after it.
		i := bytes.LastIndexByte(raw, ')')
		f := strings.Fields(string(raw[i+1:]))
		if len(f) < 13 {
			return 0, fmt.Errorf("node process %d: short stat line", pid)
		}
		ut, err1 := strconv.ParseUint(f[11], 10, 64) // field 14, utime
		st, err2 := strconv.ParseUint(f[12], 10, 64) // field 15, stime
		if err1 != nil || err2 != nil {
			return 0, fmt.Errorf("node process %d: bad stat line", pid)
		}
		ticks += ut + st
	}
	return time.Duration(ticks) * time.Second / clockTicks, nil
}

// selfCPU is the CPU time this process (the load generator) used.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
