package protocol

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"
)

// Partitioned deployments (docs/scaling.md): many ticketd clusters, each
// one Raft group, behind one NATS system. A client sends a keyed request
// on KeyedSubject, which carries a hash of the key; a subject mapping in
// the NATS configuration (PartitionMapping) rewrites it to the subject of
// the key's group, so no ticketd code sits in the path. Each group's nodes
// subscribe only to their group's subjects (Partition) and serve only the
// keys that hash to it (Partition.Owns).

// Subjects of a partitioned deployment.
const (
	// SubjectKeyedPrefix is where clients send keyed requests:
	// "ticketd.v1.p.<KeyHash(key)>.lock.<op>".
	SubjectKeyedPrefix = SubjectPrefix + ".p"
	// SubjectGroupPrefix is where group g's nodes listen:
	// "ticketd.v1.g.<g>.lock.<op>", ".status", ".node.<id>.status". Their
	// forward subjects stay under ticketd.v1.fwd.> (Partition.
	// ForwardSubject), which no account may export.
	SubjectGroupPrefix = SubjectPrefix + ".g"
)

// MaxGroups bounds the number of groups of a partitioned deployment. A
// client lists across groups by asking every one of them, so the bound
// also bounds what one list costs.
const MaxGroups = 1024

// KeyedOps are the operations that name one key, sent on KeyedSubject in a
// partitioned deployment. List and fence_keys name no key: a client asks a group
// (GroupSubject).
var KeyedOps = []string{"acquire", "release", "get", "renew", "withdraw", "check"}

// KeyHash is the subject token that stands for key: the hex of the first
// 16 bytes of SHA-256(key), the same as WatchSubject's hashed form. It is
// a valid subject token for every key, and derived from the key alone.
func KeyHash(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:16])
}

// KeyedSubject is the subject a client sends op on for key in a
// partitioned deployment: "ticketd.v1.p.<KeyHash(key)>.lock.<op>".
func KeyedSubject(key, op string) string {
	return SubjectKeyedPrefix + "." + KeyHash(key) + ".lock." + op
}

// GroupSubject is where group g serves op (after the mapping, for keyed
// operations; directly, for list).
func GroupSubject(g uint32, op string) string {
	return groupPrefix(g) + ".lock." + op
}

// GroupStatusSubject is where every node of group g answers status, in one
// queue group.
func GroupStatusSubject(g uint32) string { return groupPrefix(g) + ".status" }

// GroupNodeStatusSubject is where node id of group g answers status
// itself (Partition.NodeStatusSubject).
func GroupNodeStatusSubject(g uint32, id uint64) string {
	return fmt.Sprintf("%s.node.%d.status", groupPrefix(g), id)
}

func groupPrefix(g uint32) string {
	return SubjectGroupPrefix + "." + strconv.FormatUint(uint64(g), 10)
}

// GroupOf is the group of key among groups: exactly what nats-server's
// mapping function partition(groups, 1) computes from KeyedSubject's hash
// token (FNV-1a, 32 bits, of the token's bytes, modulo groups). Keys move
// only to new groups when groups is multiplied: GroupOf(k, m·n) mod n is
// GroupOf(k, n).
func GroupOf(key string, groups uint32) uint32 {
	return fnv32a(KeyHash(key)) % groups
}

// fnv32a is FNV-1a over s, as hash/fnv's New32a (nats-server's), without
// its allocation.
func fnv32a(s string) uint32 {
	const offset, prime = 2166136261, 16777619
	h := uint32(offset)
	for i := 0; i < len(s); i++ {
		h ^= uint32(s[i])
		h *= prime
	}
	return h
}

// PartitionMapping is the nats-server subject mapping that sends each
// keyed request to its key's group among groups, for the mappings block
// of the configuration of every server (or of the account clients
// publish in):
//
//	mappings: { "ticketd.v1.p.*.lock.*": "ticketd.v1.g.{{partition(2,1)}}.lock.{{wildcard(2)}}" }
func PartitionMapping(groups uint32) (src, dest string) {
	return SubjectKeyedPrefix + ".*.lock.*",
		fmt.Sprintf("%s.{{partition(%d,1)}}.lock.{{wildcard(2)}}", SubjectGroupPrefix, groups)
}

// Partition is the share of a partitioned deployment one group serves:
// group Group of Groups. The zero value is an unpartitioned cluster, which
// serves every key on the classic subjects (ticketd.v1.lock.<op>).
type Partition struct {
	Group  uint32
	Groups uint32
}

// Partitioned reports whether p is one group of a partitioned deployment.
func (p Partition) Partitioned() bool { return p.Groups > 0 }

// Validate checks p: unpartitioned, or 0 <= Group < Groups <= MaxGroups.
func (p Partition) Validate() error {
	switch {
	case p.Groups == 0 && p.Group != 0:
		return fmt.Errorf("group %d given without the number of groups", p.Group)
	case p.Groups > MaxGroups:
		return fmt.Errorf("%d groups; the limit is %d", p.Groups, MaxGroups)
	case p.Groups > 0 && p.Group >= p.Groups:
		return fmt.Errorf("group %d is not below the number of groups, %d (groups are numbered from 0)", p.Group, p.Groups)
	}
	return nil
}

// String names p for logs and errors.
func (p Partition) String() string {
	if !p.Partitioned() {
		return "unpartitioned"
	}
	return fmt.Sprintf("group %d of %d", p.Group, p.Groups)
}

// Owns reports whether p serves key: always when unpartitioned.
func (p Partition) Owns(key string) bool {
	return !p.Partitioned() || GroupOf(key, p.Groups) == p.Group
}

// LockSubject is where p's leader serves op.
func (p Partition) LockSubject(op string) string {
	if !p.Partitioned() {
		return SubjectPrefix + ".lock." + op
	}
	return GroupSubject(p.Group, op)
}

// NodeStatusSubject is where node id of p answers status itself: raft ids
// repeat across groups, so a group's nodes have subjects of their own.
func (p Partition) NodeStatusSubject(id uint64) string {
	if !p.Partitioned() {
		return NodeStatusSubject(id)
	}
	return GroupNodeStatusSubject(p.Group, id)
}

// ForwardSubject is where p's follower forwards op to leader (see the
// package-level ForwardSubject), apart per group for the same reason:
// "ticketd.v1.fwd.g.<g>.<leader-id>.<op>", under ticketd.v1.fwd.> like
// the unpartitioned form (one token longer, so neither matches the
// other's subscription), so that exporting the group subjects to tenants
// never exports a forward subject.
func (p Partition) ForwardSubject(leader uint64, op string) string {
	if !p.Partitioned() {
		return ForwardSubject(leader, op)
	}
	return fmt.Sprintf("%s.fwd.g.%d.%d.%s", SubjectPrefix, p.Group, leader, op)
}

// WrongGroup is the error of a request for a key p does not serve.
func (p Partition) WrongGroup(key string) *Error {
	return Errorf(CodeWrongGroup, "the key belongs to group %d of %d, this is %s: the NATS subject mapping and the nodes' --groups disagree, or the request was not sent on its key's subject",
		GroupOf(key, p.Groups), p.Groups, p)
}
