package core_test

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"hash/crc32"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/ticketd/ticketd/core"
)

// Byte builders for hand-made (often hostile) encodings.

func uv(v uint64) []byte { return binary.AppendUvarint(nil, v) }

func str(s string) []byte { return append(uv(uint64(len(s))), s...) }

func cat(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

// seal appends the big-endian CRC-32C that ends a snapshot.
func seal(body []byte) []byte {
	return binary.BigEndian.AppendUint32(slices.Clip(body), crc32.Checksum(body, crc32.MakeTable(crc32.Castagnoli)))
}

func snapHeader(lastToken, count uint64) []byte {
	return snapHeaderV(core.SnapshotVersion2, lastToken, count)
}

func snapHeaderV(version byte, lastToken, count uint64) []byte {
	return cat([]byte("TKS"), []byte{version}, uv(lastToken), uv(count))
}

// ctl0 is the empty control section of a version 2 snapshot: flags 0, both
// counters 0, four empty lists.
var ctl0 = []byte{0, 0, 0, 0, 0, 0, 0}

// snapshotV1 hand-encodes a version 1 snapshot, the format written before
// the control state existed.
func snapshotV1(lastToken uint64, locks []core.Lock) []byte {
	b := snapHeaderV(core.SnapshotVersion1, lastToken, uint64(len(locks)))
	for _, l := range locks {
		b = cat(b, rawLock(l.Key, l.Token, l.Owner, l.LeaseMS, l.GrantedAtMS))
	}
	return seal(b)
}

func rawLock(key string, token uint64, owner string, leaseMS, grantedAtMS uint64) []byte {
	return cat(str(key), uv(token), str(owner), uv(leaseMS), uv(grantedAtMS))
}

func mustHex(t *testing.T, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// sampleEntries covers every decodable kind, boundary values of every field,
// and multi-byte UTF-8.
func sampleEntries() []core.Entry {
	return []core.Entry{
		{RequestID: 0, Command: core.Grant("a", "", core.MinLeaseMS, 0)},
		{RequestID: 1, Command: core.Grant("lock/orders/42", "worker-3", lease, 1_733_000_000_000)},
		{RequestID: math.MaxUint64, Command: core.Grant(strings.Repeat("k", core.MaxKeyLen), strings.Repeat("o", core.MaxOwnerLen), core.MaxLeaseMS, math.MaxUint64)},
		{RequestID: 127, Command: core.Grant("잠금", "소유자", 128, 128)},
		{RequestID: 128, Command: core.Release("a", 1)},
		{RequestID: 1 << 40, Command: core.Release(strings.Repeat("é", core.MaxKeyLen/2), math.MaxUint64)},
		{RequestID: 2, Command: core.Expire("a", 1)},
		{RequestID: 3, Command: core.Expire("ключ", 1<<35)},
		{RequestID: 4, Command: core.Renew("a", 1, 0)},
		{RequestID: 5, Command: core.Renew(strings.Repeat("k", core.MaxKeyLen), math.MaxUint64, core.MaxLeaseMS)},
		{RequestID: 6, Command: core.Command{Kind: core.KindGrant, Key: "a", LeaseMS: lease, Identity: strings.Repeat("i", core.MaxIdentityLen)}},
	}
}

func TestEntryRoundTrip(t *testing.T) {
	for _, e := range sampleEntries() {
		b := core.EncodeEntry(e)
		got, err := core.DecodeEntry(b)
		if err != nil {
			t.Fatalf("DecodeEntry(EncodeEntry(%+v)): %v", e, err)
		}
		if got != e {
			t.Fatalf("round trip: got %+v, want %+v", got, e)
		}
		if again := core.EncodeEntry(got); !bytes.Equal(again, b) {
			t.Fatalf("re-encoding differs: %x vs %x", again, b)
		}
		if len(b) > core.MaxEntrySize {
			t.Fatalf("valid entry encodes to %d bytes, above MaxEntrySize", len(b))
		}
	}
}

func TestDecodeEntryDoesNotAliasInput(t *testing.T) {
	b := core.EncodeEntry(core.Entry{RequestID: 1, Command: core.Grant("key", "owner", lease, 0)})
	e, err := core.DecodeEntry(b)
	if err != nil {
		t.Fatal(err)
	}
	for i := range b {
		b[i] = 'X'
	}
	if e.Command.Key != "key" || e.Command.Owner != "owner" {
		t.Fatalf("decoded strings alias the input: %+v", e)
	}
}

// Golden bytes pin format version 1. If one of these fails, the encoding
// changed: that needs a new version, not a new golden value.
func TestEntryGolden(t *testing.T) {
	tests := []entryGolden{
		// 01 version | 07 request id | 01 grant | 01 'k' | e8 07 lease 1000 | 01 'o' | 05 granted_at
		{"grant", core.Entry{RequestID: 7, Command: core.Grant("k", "o", 1000, 5)}, "010701016be807016f05"},
		// 01 | ac 02 request id 300 | 02 release | 01 'k' | 2a token 42
		{"release", core.Entry{RequestID: 300, Command: core.Release("k", 42)}, "01ac0202016b2a"},
		// 01 | 00 request id | 03 expire | 01 'k' | 80 01 token 128
		{"expire", core.Entry{RequestID: 0, Command: core.Expire("k", 128)}, "010003016b8001"},
	}
	checkEntryGolden(t, tests)
}

func TestSnapshotGolden(t *testing.T) {
	locks := []core.Lock{
		{Key: "a", Token: 1, Owner: "o", LeaseMS: 100},
		{Key: "b", Token: 3, LeaseMS: 200, GrantedAtMS: 9},
	}
	// "TKS" | 02 version | 03 last token | 02 count
	// | 01 'a' 01 token 01 'o' 64 lease 100 00 granted_at
	// | 01 'b' 03 token 00 owner c8 01 lease 200 09 granted_at
	// | 00 flags 00 last node 00 last incarnation 00 members 00 issued 00 retired 00 credentials
	// | 2f473a6b crc32c
	const golden = "544b53020302" + "016101016f6400" + "01620300c80109" + "00000000000000" + "2f473a6b"
	want := mustHex(t, golden)
	if got := core.EncodeSnapshot(3, locks); !bytes.Equal(got, want) {
		t.Fatalf("EncodeSnapshot = %x, want %s", got, golden)
	}
	m := core.NewMachine()
	m.Load(3, locks)
	if got := m.Snapshot(); !bytes.Equal(got, want) {
		t.Fatalf("Machine.Snapshot = %x, want %s", got, golden)
	}
	last, got, err := core.DecodeSnapshot(want)
	if err != nil || last != 3 || !slices.Equal(got, locks) {
		t.Fatalf("DecodeSnapshot = %d, %+v, %v", last, got, err)
	}

	const emptyGolden = "544b53020000" + "00000000000000" + "c80f3667"
	if got := core.NewMachine().Snapshot(); !bytes.Equal(got, mustHex(t, emptyGolden)) {
		t.Fatalf("empty snapshot = %x, want %s", got, emptyGolden)
	}
}

// Version 1 snapshots, written before the control state existed, still
// decode and restore (with an empty control state); the golden bytes are
// the ones version 1 pinned.
func TestSnapshotV1StillDecodes(t *testing.T) {
	locks := []core.Lock{
		{Key: "a", Token: 1, Owner: "o", LeaseMS: 100},
		{Key: "b", Token: 3, LeaseMS: 200, GrantedAtMS: 9},
	}
	for _, tc := range []struct {
		name  string
		hex   string
		last  uint64
		locks []core.Lock
	}{
		{"two locks", "544b53010302" + "016101016f6400" + "01620300c80109" + "cff6cc36", 3, locks},
		{"empty", "544b53010000" + "1473047e", 0, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v1 := mustHex(t, tc.hex)
			if got := snapshotV1(tc.last, tc.locks); !bytes.Equal(got, v1) {
				t.Fatalf("snapshotV1 builder = %x, want %s", got, tc.hex)
			}
			last, got, err := core.DecodeSnapshot(v1)
			if err != nil || last != tc.last || !slices.Equal(got, tc.locks) {
				t.Fatalf("DecodeSnapshot(v1) = %d, %+v, %v", last, got, err)
			}
			st, err := core.DecodeSnapshotState(v1)
			if err != nil || st.LastToken != tc.last || !slices.Equal(st.Locks, tc.locks) || !reflect.DeepEqual(st.Control, core.ControlState{}) {
				t.Fatalf("DecodeSnapshotState(v1) = %+v, %v", st, err)
			}
			m := core.NewMachine()
			if err := m.Restore(v1); err != nil {
				t.Fatal(err)
			}
			// Restoring v1 gives the same state as the v2 encoding of it, and
			// the machine writes v2 from then on.
			if want := core.EncodeSnapshot(tc.last, tc.locks); !bytes.Equal(m.Snapshot(), want) {
				t.Fatalf("Snapshot after restoring v1 = %x, want %x", m.Snapshot(), want)
			}
			if m.Bootstrapped() || len(m.Members()) != 0 {
				t.Fatal("a v1 snapshot restored control state")
			}
		})
	}
}

func TestLockRecordGolden(t *testing.T) {
	l := core.Lock{Key: "k", Token: 5, Owner: "o", LeaseMS: 100, GrantedAtMS: 7}
	// 01 version | 01 'k' | 05 token | 01 'o' | 64 lease | 07 granted_at
	const golden = "01016b05016f6407"
	if got := core.EncodeLockRecord(l); !bytes.Equal(got, mustHex(t, golden)) {
		t.Fatalf("EncodeLockRecord = %x, want %s", got, golden)
	}
	got, err := core.DecodeLockRecord(mustHex(t, golden))
	if err != nil || got != l {
		t.Fatalf("DecodeLockRecord = %+v, %v", got, err)
	}
}

func TestDecodeEntryRejects(t *testing.T) {
	grantFields := cat(str("k"), uv(1000), str("o"), uv(5))
	tests := []struct {
		name string
		in   []byte
		code core.Code
	}{
		{"empty", nil, core.CodeMalformed},
		{"version 0", cat([]byte{0, 0, 1}, grantFields), core.CodeUnknownVersion},
		{"version 7", cat([]byte{7, 0, 1}, grantFields), core.CodeUnknownVersion},
		{"version 255 alone", []byte{255}, core.CodeUnknownVersion},
		{"control kind without op", []byte{1, 0, byte(core.KindControl)}, core.CodeMalformed},
		{"control kind with a lock payload", cat([]byte{1, 9, byte(core.KindControl)}, str("k"), uv(1)), core.CodeMalformed},
		{"control kind with op 0 as EncodeEntry writes it", core.EncodeEntry(core.Entry{Command: core.Command{Kind: core.KindControl, Key: "k", Token: 1}}), core.CodeMalformed},
		{"kind 0", cat([]byte{1, 0, 0}, str("k"), uv(1)), core.CodeMalformed},
		{"kind 5", cat([]byte{1, 0, 5}, str("k"), uv(1)), core.CodeMalformed},
		{"kind 255", cat([]byte{1, 0, 255}, str("k"), uv(1)), core.CodeMalformed},
		{"trailing byte", cat([]byte{1, 7, 1}, grantFields, []byte{0}), core.CodeMalformed},
		{"trailing bytes after release", cat([]byte{1, 0, 2}, str("k"), uv(1), []byte("junk")), core.CodeMalformed},
		{"non-canonical request id", cat([]byte{1, 0x80, 0x00, 1}, grantFields), core.CodeMalformed},
		{"non-canonical request id 7", cat([]byte{1, 0x87, 0x80, 0x00, 1}, grantFields), core.CodeMalformed},
		{"non-canonical key length", cat([]byte{1, 0, 2, 0x81, 0x00, 'k'}, uv(1)), core.CodeMalformed},
		{"non-canonical lease", cat([]byte{1, 0, 1}, str("k"), []byte{0xe8, 0x87, 0x00}, str("o"), uv(5)), core.CodeMalformed},
		{"non-canonical token", cat([]byte{1, 0, 3}, str("k"), []byte{0xaa, 0x00}), core.CodeMalformed},
		{"varint longer than 10 bytes", cat([]byte{1}, bytes.Repeat([]byte{0xff}, 11), []byte{1}), core.CodeMalformed},
		{"varint overflowing 64 bits", cat([]byte{1}, bytes.Repeat([]byte{0xff}, 9), []byte{0x02, 1}, grantFields), core.CodeMalformed},
		{"oversize key length prefix 513", cat([]byte{1, 0, 2}, uv(513), bytes.Repeat([]byte{'k'}, 513), uv(1)), core.CodeMalformed},
		{"huge key length prefix", cat([]byte{1, 0, 2}, uv(math.MaxUint64), uv(1)), core.CodeMalformed},
		{"key length beyond input", cat([]byte{1, 0, 2}, uv(10), []byte("abc")), core.CodeMalformed},
		{"oversize owner length prefix 257", cat([]byte{1, 0, 1}, str("k"), uv(1000), uv(257), bytes.Repeat([]byte{'o'}, 257), uv(0)), core.CodeMalformed},
		{"entry above MaxEntrySize", cat([]byte{1, 0, 2}, str("k"), uv(1), make([]byte, core.MaxEntrySize)), core.CodeMalformed},
		// Structurally fine, but the command fails Validate.
		{"empty key", cat([]byte{1, 0, 2}, str(""), uv(1)), core.CodeInvalidArgument},
		{"NUL in key", cat([]byte{1, 0, 2}, str("a\x00"), uv(1)), core.CodeInvalidArgument},
		{"invalid UTF-8 key", cat([]byte{1, 0, 2}, str("\xff"), uv(1)), core.CodeInvalidArgument},
		{"invalid UTF-8 owner", cat([]byte{1, 0, 1}, str("k"), uv(1000), str("\xff"), uv(0)), core.CodeInvalidArgument},
		{"lease 0", cat([]byte{1, 0, 1}, str("k"), uv(0), str(""), uv(0)), core.CodeInvalidArgument},
		{"lease 99", cat([]byte{1, 0, 1}, str("k"), uv(99), str(""), uv(0)), core.CodeInvalidArgument},
		{"lease above 24h", cat([]byte{1, 0, 1}, str("k"), uv(core.MaxLeaseMS+1), str(""), uv(0)), core.CodeInvalidArgument},
		{"release token 0", cat([]byte{1, 0, 2}, str("k"), uv(0)), core.CodeInvalidArgument},
		{"expire token 0", cat([]byte{1, 0, 3}, str("k"), uv(0)), core.CodeInvalidArgument},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e, err := core.DecodeEntry(tc.in)
			wantCode(t, err, tc.code)
			if e != (core.Entry{}) {
				t.Fatalf("failed decode returned a non-zero entry %+v", e)
			}
		})
	}
}

func TestDecodeEntryTruncated(t *testing.T) {
	for _, e := range sampleEntries() {
		b := core.EncodeEntry(e)
		for n := range len(b) {
			_, err := core.DecodeEntry(b[:n])
			if err == nil {
				t.Fatalf("%+v truncated to %d of %d bytes decoded", e.Command, n, len(b))
			}
			wantCode(t, err, core.CodeMalformed)
		}
	}
}

func TestSnapshotRoundTrip(t *testing.T) {
	tests := []struct {
		name  string
		last  uint64
		locks []core.Lock
	}{
		{"empty", 0, nil},
		{"empty with a counter", 1 << 50, nil},
		{"one", 1, []core.Lock{lk("a", 1)}},
		{"extremes", math.MaxUint64, []core.Lock{
			{Key: "\x01", Token: 1, LeaseMS: core.MinLeaseMS},
			{Key: strings.Repeat("k", core.MaxKeyLen), Token: math.MaxUint64, Owner: strings.Repeat("o", core.MaxOwnerLen), LeaseMS: core.MaxLeaseMS, GrantedAtMS: math.MaxUint64},
			{Key: "잠금", Token: 77, Owner: "소유자", LeaseMS: lease, GrantedAtMS: 3},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := core.EncodeSnapshot(tc.last, tc.locks)
			last, locks, err := core.DecodeSnapshot(b)
			if err != nil {
				t.Fatal(err)
			}
			if last != tc.last || !slices.Equal(locks, tc.locks) {
				t.Fatalf("got %d %+v, want %d %+v", last, locks, tc.last, tc.locks)
			}
			m := core.NewMachine()
			if err := m.Restore(b); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(m.Snapshot(), b) {
				t.Fatal("Restore then Snapshot is not the identity")
			}
		})
	}
}

func TestSnapshotOfManyLocks(t *testing.T) {
	m := core.NewMachine()
	for i := range 1000 {
		key := fmt.Sprintf("key/%03d", (i*7919)%1000) // granted out of key order
		r := m.Apply(core.Grant(key, "", lease, uint64(i)))
		if i%3 == 0 {
			m.Apply(core.Release(key, r.Token))
		}
	}
	snap := m.Snapshot()
	fresh := core.NewMachine()
	if err := fresh.Restore(snap); err != nil {
		t.Fatal(err)
	}
	if fresh.Digest() != m.Digest() || !slices.Equal(fresh.Locks(), m.Locks()) || fresh.LastToken() != m.LastToken() {
		t.Fatal("restored machine differs")
	}
	if m.Len() != 666 || m.LastToken() != 1000 {
		t.Fatalf("Len=%d LastToken=%d", m.Len(), m.LastToken())
	}
}

func TestDecodeSnapshotRejects(t *testing.T) {
	for _, v := range []byte{core.SnapshotVersion1, core.SnapshotVersion2} {
		t.Run("v"+strconv.Itoa(int(v)), func(t *testing.T) { testDecodeSnapshotRejects(t, v) })
	}
}

// testDecodeSnapshotRejects runs the lock-table rejections against one
// snapshot version. tail is what follows the locks (the control section in
// version 2), so that every case differs from a valid snapshot only in what
// it names.
func testDecodeSnapshotRejects(t *testing.T, v byte) {
	var tail []byte
	if v == core.SnapshotVersion2 {
		tail = ctl0
	}
	hdr := func(last, count uint64) []byte { return snapHeaderV(v, last, count) }
	ver := []byte{'T', 'K', 'S', v}
	a1 := rawLock("a", 1, "", lease, 0)
	b2 := rawLock("b", 2, "", lease, 0)
	tests := []struct {
		name string
		in   []byte
		code core.Code
	}{
		{"empty", nil, core.CodeMalformed},
		{"shorter than header and checksum", []byte("TKS\x01\x00\x00\x00"), core.CodeMalformed},
		{"bad magic", seal(cat([]byte("TKX"), []byte{v}, uv(0), uv(0), tail)), core.CodeMalformed},
		{"lower-case magic", seal(cat([]byte("tks"), []byte{v}, uv(0), uv(0), tail)), core.CodeMalformed},
		{"not a snapshot at all", core.EncodeEntry(core.Entry{Command: core.Grant("abcdef", "", lease, 0)}), core.CodeMalformed},
		{"a control record", core.NewMachine().ControlSnapshot(), core.CodeMalformed},
		{"version 0", seal(cat([]byte("TKS\x00"), uv(0), uv(0), tail)), core.CodeUnknownVersion},
		{"version 7", seal(cat([]byte("TKS\x07"), uv(0), uv(0), tail)), core.CodeUnknownVersion},
		{"version 255", seal(cat([]byte("TKS\xff"), uv(0), uv(0), tail)), core.CodeUnknownVersion},
		{"bad checksum", func() []byte { b := seal(cat(hdr(2, 2), a1, b2, tail)); b[len(b)-1] ^= 0x40; return b }(), core.CodeMalformed},
		{"checksum missing", cat(hdr(2, 2), a1, b2, tail), core.CodeMalformed},
		{"header only, no counts", seal(ver), core.CodeMalformed},
		{"count missing", seal(cat(ver, uv(5))), core.CodeMalformed},
		{"unsorted keys", seal(cat(hdr(2, 2), rawLock("b", 1, "", lease, 0), rawLock("a", 2, "", lease, 0), tail)), core.CodeMalformed},
		{"duplicate keys", seal(cat(hdr(2, 2), a1, rawLock("a", 2, "", lease, 0), tail)), core.CodeMalformed},
		{"duplicate tokens", seal(cat(hdr(2, 2), a1, rawLock("b", 1, "", lease, 0), tail)), core.CodeMalformed},
		{"token above last token", seal(cat(hdr(1, 2), a1, b2, tail)), core.CodeMalformed},
		{"token with last token 0", seal(cat(hdr(0, 1), a1, tail)), core.CodeMalformed},
		{"token 0", seal(cat(hdr(5, 1), rawLock("a", 0, "", lease, 0), tail)), core.CodeMalformed},
		{"count larger than input could hold", seal(cat(hdr(2, 1000), a1, b2, tail)), core.CodeMalformed},
		{"count above MaxSnapshotLocks", seal(cat(hdr(2, core.MaxSnapshotLocks+1), a1, b2, tail)), core.CodeMalformed},
		{"count max uint64", seal(cat(hdr(2, math.MaxUint64), a1, b2, tail)), core.CodeMalformed},
		// In version 2 the empty control section parses as a lock with an
		// empty key.
		{"count one more than present", seal(cat(hdr(2, 3), a1, b2, tail)), map[bool]core.Code{false: core.CodeMalformed, true: core.CodeInvalidArgument}[v == core.SnapshotVersion2]},
		{"count one less than present", seal(cat(hdr(2, 1), a1, b2, tail)), core.CodeMalformed},
		{"trailing bytes before checksum", seal(cat(hdr(2, 2), a1, b2, tail, []byte{0})), core.CodeMalformed},
		{"non-canonical last token", seal(cat(ver, []byte{0x82, 0x00}, uv(2), a1, b2, tail)), core.CodeMalformed},
		{"non-canonical count", seal(cat(ver, uv(2), []byte{0x82, 0x00}, a1, b2, tail)), core.CodeMalformed},
		{"non-canonical lock lease", seal(cat(hdr(1, 1), str("a"), uv(1), str(""), []byte{0xb0, 0xea, 0x81, 0x00}, uv(0), tail)), core.CodeMalformed},
		{"oversize key length prefix", seal(cat(hdr(1, 1), uv(513), bytes.Repeat([]byte{'k'}, 513), uv(1), str(""), uv(lease), uv(0), tail)), core.CodeMalformed},
		{"oversize owner length prefix", seal(cat(hdr(1, 1), str("a"), uv(1), uv(257), bytes.Repeat([]byte{'o'}, 257), uv(lease), uv(0), tail)), core.CodeMalformed},
		{"truncated lock", seal(cat(hdr(1, 1), str("a"), uv(1))), core.CodeMalformed},
		// Structurally fine, but a lock fails field validation.
		{"empty key", seal(cat(hdr(1, 1), rawLock("", 1, "", lease, 0), tail)), core.CodeInvalidArgument},
		{"invalid UTF-8 key", seal(cat(hdr(1, 1), rawLock("\xff", 1, "", lease, 0), tail)), core.CodeInvalidArgument},
		{"invalid UTF-8 owner", seal(cat(hdr(1, 1), rawLock("a", 1, "\xff", lease, 0), tail)), core.CodeInvalidArgument},
		{"lease 0", seal(cat(hdr(1, 1), rawLock("a", 1, "", 0, 0), tail)), core.CodeInvalidArgument},
		{"lease above 24h", seal(cat(hdr(1, 1), rawLock("a", 1, "", core.MaxLeaseMS+1, 0), tail)), core.CodeInvalidArgument},
	}
	if v == core.SnapshotVersion2 {
		tests = append(tests, []struct {
			name string
			in   []byte
			code core.Code
		}{
			{"control section missing", seal(cat(hdr(2, 2), a1, b2)), core.CodeMalformed},
			{"control section truncated", seal(cat(hdr(2, 2), a1, b2, ctl0[:6])), core.CodeMalformed},
			{"control flags unknown bit", seal(cat(hdr(2, 2), a1, b2, []byte{4}, ctl0[1:])), core.CodeMalformed},
			{"control counters without bootstrap", seal(cat(hdr(2, 2), a1, b2, []byte{0, 1, 1}, ctl0[3:])), core.CodeMalformed},
		}...)
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			last, locks, err := core.DecodeSnapshot(tc.in)
			wantCode(t, err, tc.code)
			if last != 0 || locks != nil {
				t.Fatalf("failed decode returned data: %d %+v", last, locks)
			}
			st, err := core.DecodeSnapshotState(tc.in)
			wantCode(t, err, tc.code)
			if !reflect.DeepEqual(st, core.SnapshotState{}) {
				t.Fatalf("failed decode returned data: %+v", st)
			}
		})
	}
	// The hand builders agree with the encoders, so the cases above differ
	// from a valid snapshot only in what they name.
	valid := seal(cat(hdr(2, 2), a1, b2, tail))
	if v == core.SnapshotVersion1 {
		if want := snapshotV1(2, []core.Lock{lk("a", 1), lk("b", 2)}); !bytes.Equal(valid, want) {
			t.Fatalf("builders disagree with snapshotV1: %x vs %x", valid, want)
		}
	} else if want := core.EncodeSnapshot(2, []core.Lock{lk("a", 1), lk("b", 2)}); !bytes.Equal(valid, want) {
		t.Fatalf("builders disagree with EncodeSnapshot: %x vs %x", valid, want)
	}
	if _, _, err := core.DecodeSnapshot(valid); err != nil {
		t.Fatalf("the valid base case does not decode: %v", err)
	}
}

// truncationSnapshots are the snapshots the truncation and bit-flip tests
// cut and corrupt: version 1, version 2 without and with control state.
func truncationSnapshots(t *testing.T) map[string][]byte {
	locks := []core.Lock{lk("a", 1), {Key: "bb", Token: 9, Owner: "me", LeaseMS: 1000, GrantedAtMS: 1 << 40}}
	m := core.NewMachine()
	m.Load(9, locks)
	lifecycle(t, m)
	return map[string][]byte{
		"v1":              snapshotV1(9, locks),
		"v2":              core.EncodeSnapshot(9, locks),
		"v2 with control": m.Snapshot(),
	}
}

func TestDecodeSnapshotTruncated(t *testing.T) {
	for name, b := range truncationSnapshots(t) {
		for n := range len(b) {
			_, _, err := core.DecodeSnapshot(b[:n])
			if err == nil {
				t.Fatalf("%s truncated to %d of %d bytes decoded", name, n, len(b))
			}
			wantCode(t, err, core.CodeMalformed)
		}
	}
}

// CRC-32C detects every single-bit error, so no one-bit corruption of a
// snapshot may decode.
func TestDecodeSnapshotBitFlips(t *testing.T) {
	for name, b := range truncationSnapshots(t) {
		for i := range len(b) * 8 {
			c := slices.Clone(b)
			c[i/8] ^= 1 << (i % 8)
			if _, _, err := core.DecodeSnapshot(c); err == nil {
				t.Fatalf("%s with bit %d flipped decoded", name, i)
			}
		}
	}
}

func TestLockRecordRoundTrip(t *testing.T) {
	for _, l := range []core.Lock{
		lk("a", 1),
		{Key: strings.Repeat("k", core.MaxKeyLen), Token: math.MaxUint64, Owner: strings.Repeat("o", core.MaxOwnerLen), LeaseMS: core.MaxLeaseMS, GrantedAtMS: math.MaxUint64},
		{Key: "잠금", Token: 300, Owner: "소유자", LeaseMS: core.MinLeaseMS, GrantedAtMS: 0},
	} {
		b := core.EncodeLockRecord(l)
		got, err := core.DecodeLockRecord(b)
		if err != nil || got != l {
			t.Fatalf("DecodeLockRecord(EncodeLockRecord(%+v)) = %+v, %v", l, got, err)
		}
		for n := range len(b) {
			_, err := core.DecodeLockRecord(b[:n])
			wantCode(t, err, core.CodeMalformed)
		}
	}
}

func TestDecodeLockRecordRejects(t *testing.T) {
	tests := []struct {
		name string
		in   []byte
		code core.Code
	}{
		{"empty", nil, core.CodeMalformed},
		{"version 0", cat([]byte{0}, rawLock("a", 1, "", lease, 0)), core.CodeUnknownVersion},
		{"version 5", cat([]byte{5}, rawLock("a", 1, "", lease, 0)), core.CodeUnknownVersion},
		{"trailing byte", cat([]byte{1}, rawLock("a", 1, "", lease, 0), []byte{0}), core.CodeMalformed},
		{"non-canonical token", cat([]byte{1}, str("a"), []byte{0x81, 0x00}, str(""), uv(lease), uv(0)), core.CodeMalformed},
		{"non-canonical granted_at", cat([]byte{1}, str("a"), uv(1), str(""), uv(lease), []byte{0x80, 0x80, 0x00}), core.CodeMalformed},
		{"oversize key length prefix", cat([]byte{1}, uv(513), bytes.Repeat([]byte{'k'}, 513), uv(1), str(""), uv(lease), uv(0)), core.CodeMalformed},
		{"oversize owner length prefix", cat([]byte{1}, str("a"), uv(1), uv(257), bytes.Repeat([]byte{'o'}, 257), uv(lease), uv(0)), core.CodeMalformed},
		{"token 0", cat([]byte{1}, rawLock("a", 0, "", lease, 0)), core.CodeMalformed},
		{"empty key", cat([]byte{1}, rawLock("", 1, "", lease, 0)), core.CodeInvalidArgument},
		{"NUL in key", cat([]byte{1}, rawLock("\x00", 1, "", lease, 0)), core.CodeInvalidArgument},
		{"lease 99", cat([]byte{1}, rawLock("a", 1, "", 99, 0)), core.CodeInvalidArgument},
		{"invalid UTF-8 owner", cat([]byte{1}, rawLock("a", 1, "\xc3", lease, 0)), core.CodeInvalidArgument},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l, err := core.DecodeLockRecord(tc.in)
			wantCode(t, err, tc.code)
			if l != (core.Lock{}) {
				t.Fatalf("failed decode returned %+v", l)
			}
		})
	}
}

// entryGolden pins the exact bytes of one encoded entry.
type entryGolden struct {
	name  string
	entry core.Entry
	hex   string
}

// checkEntryGolden checks that each entry encodes to exactly its bytes and
// that those bytes decode back to it.
func checkEntryGolden(t *testing.T, tests []entryGolden) {
	t.Helper()
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			want := mustHex(t, tc.hex)
			if got := core.EncodeEntry(tc.entry); !bytes.Equal(got, want) {
				t.Fatalf("EncodeEntry = %x, want %s", got, tc.hex)
			}
			got, err := core.DecodeEntry(want)
			if err != nil || got != tc.entry {
				t.Fatalf("DecodeEntry(%s) = %+v, %v; want %+v", tc.hex, got, err, tc.entry)
			}
		})
	}
}
