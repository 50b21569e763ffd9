//go:build unix

package main

import (
	"os"
	"os/signal"
	"syscall"
)

// pauseSelf stops the whole process, every goroutine with it (the lock's
// keepalive too), as a stop-the-world pause would, until a SIGCONT. A
// SIGSTOP sent to the process stops its threads a moment after kill
// returns, so the caller waits for the SIGCONT itself: nothing after the
// pause runs before someone resumed the process.
func pauseSelf() error {
	cont := make(chan os.Signal, 1)
	signal.Notify(cont, syscall.SIGCONT)
	defer signal.Stop(cont)
	if err := syscall.Kill(syscall.Getpid(), syscall.SIGSTOP); err != nil {
		return err
	}
	<-cont
	return nil
}
