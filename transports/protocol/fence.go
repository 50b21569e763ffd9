package protocol

import (
	"bytes"

	"github.com/ticketd/ticketd/core"
)

// What lets a protected resource tell a current token from a superseded
// one (issue 23, docs/protocol.md §3 Check and §6): the check request, and
// the fence keys request that serves the public keys resources verify
// fences with (docs/fencing.md). Both are lock subjects: served by the
// leader, forwarded like get, per group in a partitioned deployment
// (Partition.LockSubject), and exported with ticketd.v1.lock.> where
// tenants import the lock service.
const (
	SubjectCheck     = SubjectPrefix + ".lock.check"
	SubjectFenceKeys = SubjectPrefix + ".lock.fence_keys"
)

// CheckRequest asks whether Token is the token Key is held with now.
type CheckRequest struct {
	Key   string `json:"key"`
	Token uint64 `json:"token"`
}

// CheckReply answers a check, read linearizably by the leader: Current
// when Key is held with the token asked about; Token is the token Key is
// held with now (0: free).
type CheckReply struct {
	Key     string `json:"key"`
	Current bool   `json:"current"`
	Token   uint64 `json:"token"`
}

// FenceKeysRequest asks for the fence public keys; its body is {}.
type FenceKeysRequest struct{}

// FenceKeysReply is the cluster's fence verification keys: its ID (16 hex
// digits, as fence.ParseClusterID reads it; "0000000000000000" for a
// cluster created before cluster IDs) and every kept public key, oldest
// first, in fence.ParsePublicKey's text form ("tfk1.…"); Current is the one
// new fences are signed with. Keys is empty, and Current absent, before
// the cluster made its first key (cluster version below 3).
type FenceKeysReply struct {
	ClusterID string   `json:"cluster_id"`
	Keys      []string `json:"keys"`
	Current   string   `json:"current,omitempty"`
}

// Validate checks a check request.
func (r *CheckRequest) Validate() error {
	if err := core.ValidateKey(r.Key); err != nil {
		return fromCore(err)
	}
	if r.Token == 0 {
		return Errorf(CodeInvalidArgument, "token must be positive")
	}
	return nil
}

func checkFields(r *CheckRequest) []flatField {
	return []flatField{{name: "key", str: &r.Key}, {name: "token", u64: &r.Token}}
}

// DecodeCheck decodes and validates a check request (a fast path like
// get's: resources may check on every write).
func DecodeCheck(data []byte) (CheckRequest, error) {
	var r CheckRequest
	fields := checkFields(&r)
	if !decodeFlat(data, fields) {
		r = CheckRequest{}
		if err := decodeStrict(data, &r, checkFields(&r)); err != nil {
			return CheckRequest{}, err
		}
	}
	return r, r.Validate()
}

// DecodeFenceKeys decodes a fence keys request: an empty object, or an
// empty body (the request carries nothing).
func DecodeFenceKeys(data []byte) (FenceKeysRequest, error) {
	var r FenceKeysRequest
	if len(bytes.TrimSpace(data)) == 0 {
		return r, nil
	}
	return r, Decode(data, &r)
}
