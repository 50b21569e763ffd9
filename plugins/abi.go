package plugins

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/tetratelabs/wazero/api"

	"github.com/ticketd/ticketd/core"
)

// ABI versions this host speaks (see README.md): a module whose
// ticketd_abi_version export returns MinABIVersion..ABIVersion loads, any
// other is refused. Version 2 adds the lock kind (limit, mode) to
// validate_grant and on_applied requests; a version-1 module gets exactly
// the version-1 requests, byte for byte.
const (
	ABIVersion    = 2
	MinABIVersion = 1
)

// Size limits of the ABI. Requests are built by the host from validated
// commands and are far smaller; responses come from the guest and are
// checked against these before they are read.
const (
	// MaxRequestBytes bounds one encoded request.
	MaxRequestBytes = 16 << 10
	// MaxResponseBytes bounds one encoded response.
	MaxResponseBytes = 64 << 10
	// MaxReasonBytes bounds a verdict's reason.
	MaxReasonBytes = 256
	// MaxEvents bounds the events one on_applied call may return.
	MaxEvents = 16
	// MaxEventTypeBytes bounds an event's type.
	MaxEventTypeBytes = 64
	// maxStderrBytes bounds the guest's standard error kept per call.
	maxStderrBytes = 1 << 10
)

// Export names.
const (
	exportMemory        = "memory"
	exportInitialize    = "_initialize"
	exportStart         = "_start" // a WASI command's entry point: refused
	exportABIVersion    = "ticketd_abi_version"
	exportHooks         = "ticketd_hooks"
	exportAlloc         = "ticketd_alloc"
	exportValidateGrant = "validate_grant"
	exportOnApplied     = "on_applied"
)

// Hook bits returned by the optional ticketd_hooks export.
const (
	hookValidateGrant uint32 = 1 << 0
	hookOnApplied     uint32 = 1 << 1
	hooksKnown               = hookValidateGrant | hookOnApplied
)

// wasiModule is the only module a plugin may import from.
const wasiModule = "wasi_snapshot_preview1"

var (
	i32 = api.ValueTypeI32
	i64 = api.ValueTypeI64
)

// signature is an export's expected type.
type signature struct {
	name            string
	params, results []api.ValueType
	required        bool
}

// signatures lists the ABI's function exports, in the order they are
// checked (so a module missing several always gets the same error).
var signatures = []signature{
	{name: exportABIVersion, results: []api.ValueType{i32}, required: true},
	{name: exportAlloc, params: []api.ValueType{i32}, results: []api.ValueType{i32}, required: true},
	{name: exportInitialize},
	{name: exportHooks, results: []api.ValueType{i32}},
	{name: exportValidateGrant, params: []api.ValueType{i32, i32}, results: []api.ValueType{i64}},
	{name: exportOnApplied, params: []api.ValueType{i32, i32}, results: []api.ValueType{i64}},
}

// Wire forms (README.md "Payloads").

// grantRequest is the validate_grant request. Identity was added within
// ABI version 1: guests ignore fields they do not know (README.md), and
// the Go guest SDK's decoder always has, so modules built before it keep
// working and simply do not see it.
type grantRequest struct {
	Key      string `json:"key"`
	Owner    string `json:"owner"`
	Identity string `json:"identity"`
	LeaseMS  uint64 `json:"lease_ms"`
}

// grantRequestV2 is the validate_grant request of ABI version 2: the
// Grant's kind beside the version-1 fields.
type grantRequestV2 struct {
	grantRequest
	Limit uint32 `json:"limit"`
	Mode  string `json:"mode"`
}

type verdictResponse struct {
	Allow  *bool  `json:"allow"`
	Reason string `json:"reason"`
	Error  string `json:"error"`
}

type appliedRequest struct {
	Index   uint64         `json:"index"`
	Command appliedCommand `json:"command"`
	Result  appliedResult  `json:"result"`
}

type appliedCommand struct {
	Kind        string `json:"kind"`
	Key         string `json:"key"`
	Owner       string `json:"owner"`
	LeaseMS     uint64 `json:"lease_ms"`
	GrantedAtMS uint64 `json:"granted_at_ms"`
	Token       uint64 `json:"token"`
}

type appliedResult struct {
	Kind    string `json:"kind"`
	Token   uint64 `json:"token"`
	Existed bool   `json:"existed"`
}

// appliedRequestV2 is the on_applied request of ABI version 2: the kind
// of the lock the command acted on, and a limit_mismatch's current limit.
type appliedRequestV2 struct {
	Index   uint64           `json:"index"`
	Command appliedCommandV2 `json:"command"`
	Result  appliedResultV2  `json:"result"`
}

type appliedCommandV2 struct {
	appliedCommand
	Limit uint32 `json:"limit"`
	Mode  string `json:"mode"`
}

type appliedResultV2 struct {
	appliedResult
	Limit uint32 `json:"limit"`
}

type appliedResponse struct {
	Events *[]eventResponse `json:"events"`
	Error  string           `json:"error"`
}

type eventResponse struct {
	Type string          `json:"type"`
	Data json.RawMessage `json:"data"`
}

// encodeGrant is g as a module of ABI version abi reads it: version 1
// never sees the kind.
func encodeGrant(abi uint32, g Grant) ([]byte, error) {
	r := grantRequest{Key: g.Key, Owner: g.Owner, Identity: g.Identity, LeaseMS: g.LeaseMS}
	if abi < 2 {
		return json.Marshal(r)
	}
	return json.Marshal(grantRequestV2{grantRequest: r, Limit: g.Limit, Mode: g.Mode.String()})
}

// encodeApplied copies cmd and res into the wire form: the guest sees a
// serialised copy and nothing else. A control command is shown by its kind
// only: its request (which can carry credentials and cluster identities)
// never reaches a plugin.
//
// From ABI version 2 the command carries the kind of the lock it acted on
// (cmd.Limit and cmd.Mode: what a Grant asked for; for a Renew, Release,
// Settle, Expire or ClearDelay, what the audit publisher set from
// raftstore.Applied) and the result a limit_mismatch's current limit.
func encodeApplied(abi uint32, index uint64, cmd core.Command, res core.Result) ([]byte, error) {
	c := appliedCommand{Kind: cmd.Kind.String()}
	if cmd.Kind != core.KindControl {
		c.Key, c.Owner, c.LeaseMS, c.GrantedAtMS, c.Token = cmd.Key, cmd.Owner, cmd.LeaseMS, cmd.GrantedAtMS, cmd.Token
	}
	r := appliedResult{Kind: res.Kind.String(), Token: res.Token, Existed: res.Existed}
	if abi < 2 {
		return json.Marshal(appliedRequest{Index: index, Command: c, Result: r})
	}
	c2 := appliedCommandV2{appliedCommand: c, Mode: core.ModeExclusive.String()}
	if cmd.Kind != core.KindControl {
		c2.Limit, c2.Mode = cmd.Limit, cmd.Mode.String()
	}
	return json.Marshal(appliedRequestV2{Index: index, Command: c2, Result: appliedResultV2{appliedResult: r, Limit: res.Limit}})
}

// decodeStrict decodes exactly one JSON value into v, refusing unknown
// fields and trailing data.
func decodeStrict(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("trailing data after the response")
	}
	return nil
}

// decodeVerdict checks a validate_grant response.
func decodeVerdict(b []byte) (Verdict, error) {
	var r verdictResponse
	if err := decodeStrict(b, &r); err != nil {
		return Verdict{}, fmt.Errorf("response is not a verdict: %w", err)
	}
	if r.Error != "" {
		return Verdict{}, fmt.Errorf("guest could not evaluate the request: %q", truncate(r.Error, MaxReasonBytes))
	}
	if r.Allow == nil {
		return Verdict{}, errors.New(`verdict has no "allow" field`)
	}
	if len(r.Reason) > MaxReasonBytes {
		return Verdict{}, fmt.Errorf("reason is %d bytes, the limit is %d", len(r.Reason), MaxReasonBytes)
	}
	return Verdict{Allow: *r.Allow, Reason: r.Reason}, nil
}

// decodeEvents checks an on_applied response and stamps the events.
func decodeEvents(b []byte, index uint64, plugin string) ([]Event, error) {
	var r appliedResponse
	if err := decodeStrict(b, &r); err != nil {
		return nil, fmt.Errorf("response is not an event list: %w", err)
	}
	if r.Error != "" {
		return nil, fmt.Errorf("guest could not evaluate the request: %q", truncate(r.Error, MaxReasonBytes))
	}
	if r.Events == nil {
		return nil, errors.New(`response has no "events" field`)
	}
	evs := *r.Events
	if len(evs) > MaxEvents {
		return nil, fmt.Errorf("%d events, the limit is %d", len(evs), MaxEvents)
	}
	if len(evs) == 0 {
		return nil, nil
	}
	out := make([]Event, 0, len(evs))
	for i, e := range evs {
		if err := checkEventType(e.Type); err != nil {
			return nil, fmt.Errorf("event %d: %w", i, err)
		}
		data, err := eventData(e.Data)
		if err != nil {
			return nil, fmt.Errorf("event %d (%s): %w", i, e.Type, err)
		}
		out = append(out, Event{Type: e.Type, Data: data, Index: index, Plugin: plugin})
	}
	return out, nil
}

func checkEventType(t string) error {
	if t == "" || len(t) > MaxEventTypeBytes {
		return fmt.Errorf("type is %d bytes, want 1..%d", len(t), MaxEventTypeBytes)
	}
	for i := 0; i < len(t); i++ {
		c := t[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-') {
			return fmt.Errorf("type %q has a byte outside [A-Za-z0-9._-]", t)
		}
	}
	return nil
}

// eventData returns the compacted JSON object, {} for an absent or null
// value, and an error for any other JSON value.
func eventData(raw json.RawMessage) (json.RawMessage, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return json.RawMessage("{}"), nil
	}
	if raw[0] != '{' {
		return nil, errors.New("data is not a JSON object")
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, raw); err != nil {
		return nil, fmt.Errorf("data: %w", err)
	}
	return json.RawMessage(buf.Bytes()), nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

func sameTypes(a, b []api.ValueType) bool {
	return bytes.Equal(a, b)
}
