//go:build !unix

package main

import "errors"

// pauseSelf needs SIGSTOP, which only Unix has.
func pauseSelf() error {
	return errors.New("--pause-before-write needs a Unix system (SIGSTOP)")
}
