package fence

import (
	"errors"
	"fmt"
)

// Code is the stable, machine-readable name of a fence error. Codes never
// change meaning; a resource may return them to its clients (fencehttp
// does) and clients may act on them.
type Code string

// The codes. Every rejection this module makes carries one of them.
const (
	// CodeMalformed: the fence is not a well-formed fence of a known
	// version (bad shape, base64, lengths, key or token), or it is longer
	// than MaxLen.
	CodeMalformed Code = "fence_malformed"
	// CodeUnsupportedVersion: the fence names a version ("tf2.") this
	// module does not know.
	CodeUnsupportedVersion Code = "fence_unsupported_version"
	// CodeUnknownKey: the fence was signed with a key whose ID is not
	// among the trusted public keys (another cluster, or a key rotated in
	// after the resource's configuration was written).
	CodeUnknownKey Code = "fence_unknown_key"
	// CodeForged: the signature does not verify: the fence was made or
	// changed by someone without the cluster's signing key.
	CodeForged Code = "fence_forged"
	// CodeWrongCluster: the fence is authentic but was issued by another
	// cluster than the one the resource trusts (two clusters that share a
	// signing key, e.g. after restoring one's backup into the other).
	CodeWrongCluster Code = "fence_wrong_cluster"
	// CodeWrongKey: the fence is authentic but for another lock key than
	// the one that protects what the request touches (fencehttp's KeyFunc).
	CodeWrongKey Code = "fence_wrong_key"
	// CodeStale: a higher token was already accepted for the key: the
	// holder of this fence lost the lock. Current names the higher token.
	CodeStale Code = "fence_stale"
	// CodeMissing: a request that must carry a fence carries none.
	CodeMissing Code = "fence_missing"
	// CodeInvalidArgument: a caller passed a value outside the limits
	// (Sign, a Store's Advance, NewVerifier, NewPublicKey).
	CodeInvalidArgument Code = "fence_invalid_argument"
	// CodeStoreFull: a MemoryStore holds its maximum number of keys and
	// refuses a new one (it never forgets a key: that would let a stale
	// token in again).
	CodeStoreFull Code = "fence_store_full"
	// CodeUnavailable: the check could not be made now (the store failed,
	// or the request ended while it waited for an earlier request of the
	// same key); nothing was accepted. Retrying later may succeed.
	CodeUnavailable Code = "fence_unavailable"
)

// Error is every error this module returns about a fence or a token.
// errors.Is(err, ErrX) is true when err carries the code of sentinel ErrX.
type Error struct {
	Code Code
	// Msg says what was wrong, for a person. It never holds a private
	// key; it may name the lock key, tokens and key IDs.
	Msg string
	// Key, Token and Current are set for CodeStale: Token was refused for
	// Key because Current (higher) was accepted before.
	Key            string
	Token, Current uint64
}

// Sentinels for errors.Is. They carry only a code and match every *Error
// with that code.
var (
	ErrMalformed          = &Error{Code: CodeMalformed}
	ErrUnsupportedVersion = &Error{Code: CodeUnsupportedVersion}
	ErrUnknownKey         = &Error{Code: CodeUnknownKey}
	ErrForged             = &Error{Code: CodeForged}
	ErrWrongCluster       = &Error{Code: CodeWrongCluster}
	ErrWrongKey           = &Error{Code: CodeWrongKey}
	ErrStale              = &Error{Code: CodeStale}
	ErrMissing            = &Error{Code: CodeMissing}
	ErrInvalidArgument    = &Error{Code: CodeInvalidArgument}
	ErrStoreFull          = &Error{Code: CodeStoreFull}
	ErrUnavailable        = &Error{Code: CodeUnavailable}
)

func (e *Error) Error() string {
	if e.Msg == "" {
		return "fence: " + string(e.Code)
	}
	return "fence: " + string(e.Code) + ": " + e.Msg
}

// Is reports whether target is the sentinel of e's code.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Msg == "" && t.Key == "" && t.Token == 0 && t.Current == 0 && t.Code == e.Code
}

// CodeOf returns the code of the *Error in err's chain, or "" if there is
// none.
func CodeOf(err error) Code {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return ""
}

// Stale is the error a Store returns when it refuses token for key
// because current, a higher token, was accepted before.
func Stale(key string, token, current uint64) *Error {
	return &Error{
		Code:    CodeStale,
		Msg:     fmt.Sprintf("token %d for key %q is below the current token %d: its holder lost the lock", token, key, current),
		Key:     key,
		Token:   token,
		Current: current,
	}
}

func errorf(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Msg: fmt.Sprintf(format, args...)}
}
