//go:build !linux

package pgtest

import "syscall"

// sysProcAttr runs the child as cred's user (when not nil).
func sysProcAttr(cred *syscall.Credential) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Credential: cred}
}
