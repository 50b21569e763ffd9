package pgtest

import "syscall"

// sysProcAttr runs the child as cred's user (when not nil) and kills it
// if the test binary dies first, so no server outlives a crashed test.
func sysProcAttr(cred *syscall.Credential) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGKILL}
}
