package plugins

import (
	"context"
	"errors"
	"strings"
)

// Sentinel errors. Every error this package returns matches one of them
// with errors.Is. Errors from a hook call are *CallError values, which
// match their sentinel and the underlying wazero error.
var (
	// ErrPluginTrap: the guest trapped (a panic, unreachable, an out of
	// bounds access, a proc_exit) during a call or during initialisation.
	ErrPluginTrap = errors.New("plugins: plugin trapped")
	// ErrPluginMemory: the guest trapped because it ran out of memory
	// under Config.MemoryLimitPages. It also matches ErrPluginTrap.
	ErrPluginMemory = errors.New("plugins: plugin exceeded its memory limit")
	// ErrPluginTimeout: the call's deadline (Config.CallTimeout, or the
	// caller's, whichever is sooner) passed and the instance was cut off.
	ErrPluginTimeout = errors.New("plugins: plugin exceeded its deadline")
	// ErrPluginABI: the module does not follow the ABI: missing or
	// mistyped exports, an unknown ABI version, bad pointers, oversize or
	// malformed responses, or a module that is not valid WebAssembly.
	ErrPluginABI = errors.New("plugins: plugin broke the ABI")
	// ErrCanceled: the caller's context was canceled before or during the
	// call. It also matches context.Canceled.
	ErrCanceled = errors.New("plugins: call canceled")
	// ErrNoHook: the plugin does not implement the hook that was called.
	ErrNoHook = errors.New("plugins: plugin does not implement this hook")
	// ErrClosed: the plugin was closed.
	ErrClosed = errors.New("plugins: plugin closed")
	// ErrRequestTooLarge: the encoded request exceeds MaxRequestBytes.
	ErrRequestTooLarge = errors.New("plugins: request too large")
	// ErrConfig: a Config field is out of range.
	ErrConfig = errors.New("plugins: invalid config")
)

// CallError describes a failed hook call or a module refused at Load.
type CallError struct {
	// Plugin is the plugin's name (Config.Name or a SHA-256 prefix).
	Plugin string
	// Hook is the export being called ("validate_grant", "on_applied",
	// "_initialize", ...) or "load" for checks done at Load.
	Hook string
	// Err is the sentinel: ErrPluginTrap, ErrPluginMemory,
	// ErrPluginTimeout, ErrPluginABI, ErrCanceled or ErrClosed.
	Err error
	// Detail says what went wrong, for logs.
	Detail string
	// Stderr is the start of what the guest wrote to standard error during
	// the call (a Go guest's panic message, for example), for logs. It is
	// never shown to clients.
	Stderr string
	// Cause is the underlying error (from wazero or encoding/json), if
	// any.
	Cause error
}

func (e *CallError) Error() string {
	var b strings.Builder
	b.WriteString(e.Err.Error())
	b.WriteString(": ")
	b.WriteString(e.Plugin)
	b.WriteString(" ")
	b.WriteString(e.Hook)
	if e.Detail != "" {
		b.WriteString(": ")
		b.WriteString(e.Detail)
	}
	return b.String()
}

// Unwrap returns the sentinel (and ErrPluginTrap for ErrPluginMemory,
// context.Canceled for ErrCanceled, context.DeadlineExceeded for
// ErrPluginTimeout) followed by the cause.
func (e *CallError) Unwrap() []error {
	errs := []error{e.Err}
	switch e.Err {
	case ErrPluginMemory:
		errs = append(errs, ErrPluginTrap)
	case ErrCanceled:
		errs = append(errs, context.Canceled)
	case ErrPluginTimeout:
		errs = append(errs, context.DeadlineExceeded)
	}
	if e.Cause != nil {
		errs = append(errs, e.Cause)
	}
	return errs
}

// short is the client-facing summary of a failure, used in the Reason of a
// fail-closed Verdict. It carries no guest output.
func (e *CallError) short() string {
	switch e.Err {
	case ErrPluginTrap:
		return "trapped"
	case ErrPluginMemory:
		return "exceeded its memory limit"
	case ErrPluginTimeout:
		return "exceeded its deadline"
	case ErrPluginABI:
		return "broke the plugin ABI"
	case ErrCanceled:
		return "call canceled"
	case ErrClosed:
		return "closed"
	}
	return "failed"
}
