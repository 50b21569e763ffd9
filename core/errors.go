package core

import (
	"errors"
	"fmt"
)

// Code is a stable, machine-readable error code. Codes travel on the wire
// (transports, SDK, CLI) and must never be renamed.
type Code string

// Stable codes produced by this package.
const (
	CodeInvalidArgument Code = "invalid_argument"
	CodeMalformed       Code = "malformed"
	CodeUnknownVersion  Code = "unknown_version"
	CodeUnsupported     Code = "unsupported"

	// Identity codes returned by Machine.CheckIdentity.
	CodeNodeRetired      Code = "node_retired"
	CodeStaleIncarnation Code = "stale_incarnation"
	CodeUnknownNode      Code = "unknown_node"
)

// Error is a typed rejection with a stable code.
type Error struct {
	Code   Code
	Detail string
}

func (e *Error) Error() string { return fmt.Sprintf("core: %s: %s", e.Code, e.Detail) }

// Is makes errors.Is match any *Error with the same code, so callers can
// test against the sentinels below.
func (e *Error) Is(target error) bool {
	var t *Error
	if errors.As(target, &t) {
		return t.Code == e.Code && (t.Detail == "" || t.Detail == e.Detail)
	}
	return false
}

// Sentinels for errors.Is; their Detail is empty so they match any detail.
var (
	ErrInvalidArgument = &Error{Code: CodeInvalidArgument}
	ErrMalformed       = &Error{Code: CodeMalformed}
	ErrUnknownVersion  = &Error{Code: CodeUnknownVersion}
	ErrUnsupported     = &Error{Code: CodeUnsupported}

	ErrNodeRetired      = &Error{Code: CodeNodeRetired}
	ErrStaleIncarnation = &Error{Code: CodeStaleIncarnation}
	ErrUnknownNode      = &Error{Code: CodeUnknownNode}
)

func invalidf(format string, args ...any) error {
	return &Error{Code: CodeInvalidArgument, Detail: fmt.Sprintf(format, args...)}
}

func malformedf(format string, args ...any) error {
	return &Error{Code: CodeMalformed, Detail: fmt.Sprintf(format, args...)}
}
