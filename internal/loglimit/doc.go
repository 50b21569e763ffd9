// Package loglimit bounds how many log lines a noisy source writes: a
// flood of bad connections, a storage error retried hundreds of times a
// second, or an embedded server reporting every failed login must not
// flood the node's log.
package loglimit
