package raftstore

import (
	"reflect"
	"testing"

	"go.etcd.io/raft/v3/raftpb"
)

func ents(term uint64, from, to uint64) []raftpb.Entry {
	var out []raftpb.Entry
	for i := from; i <= to; i++ {
		out = append(out, raftpb.Entry{Term: term, Index: i, Data: []byte{byte(i)}})
	}
	return out
}

func app(to, term, index, logTerm, commit uint64, e []raftpb.Entry) raftpb.Message {
	return raftpb.Message{Type: raftpb.MsgApp, From: 1, To: to, Term: term, Index: index, LogTerm: logTerm, Commit: commit, Entries: e}
}

func resp(to, term, index uint64, reject bool) raftpb.Message {
	return raftpb.Message{Type: raftpb.MsgAppResp, From: 2, To: to, Term: term, Index: index, Reject: reject}
}

func TestCoalesce(t *testing.T) {
	hb := raftpb.Message{Type: raftpb.MsgHeartbeat, From: 1, To: 2, Term: 3}
	for _, tc := range []struct {
		name string
		in   []raftpb.Message
		want []raftpb.Message
	}{
		{"one message", []raftpb.Message{app(2, 3, 10, 3, 9, ents(3, 11, 11))}, []raftpb.Message{app(2, 3, 10, 3, 9, ents(3, 11, 11))}},
		{"contiguous appends to one peer merge, commit is the later",
			[]raftpb.Message{app(2, 3, 10, 3, 9, ents(3, 11, 11)), app(2, 3, 11, 3, 10, ents(3, 12, 12)), app(2, 3, 12, 3, 10, ents(3, 13, 14))},
			[]raftpb.Message{app(2, 3, 10, 3, 10, ents(3, 11, 14))}},
		{"per peer, interleaved peers",
			[]raftpb.Message{app(2, 3, 10, 3, 9, ents(3, 11, 11)), app(3, 3, 10, 3, 9, ents(3, 11, 11)), app(2, 3, 11, 3, 9, ents(3, 12, 12)), app(3, 3, 11, 3, 9, ents(3, 12, 12))},
			[]raftpb.Message{app(2, 3, 10, 3, 9, ents(3, 11, 12)), app(3, 3, 10, 3, 9, ents(3, 11, 12))}},
		{"gap: not merged",
			[]raftpb.Message{app(2, 3, 10, 3, 9, ents(3, 11, 11)), app(2, 3, 12, 3, 9, ents(3, 13, 13))},
			[]raftpb.Message{app(2, 3, 10, 3, 9, ents(3, 11, 11)), app(2, 3, 12, 3, 9, ents(3, 13, 13))}},
		{"log term differs: not merged",
			[]raftpb.Message{app(2, 3, 10, 3, 9, ents(3, 11, 11)), app(2, 3, 11, 2, 9, ents(3, 12, 12))},
			[]raftpb.Message{app(2, 3, 10, 3, 9, ents(3, 11, 11)), app(2, 3, 11, 2, 9, ents(3, 12, 12))}},
		{"message term differs: not merged",
			[]raftpb.Message{app(2, 3, 10, 3, 9, ents(3, 11, 11)), app(2, 4, 11, 3, 9, ents(4, 12, 12))},
			[]raftpb.Message{app(2, 3, 10, 3, 9, ents(3, 11, 11)), app(2, 4, 11, 3, 9, ents(4, 12, 12))}},
		{"another message to the peer in between keeps the order",
			[]raftpb.Message{app(2, 3, 10, 3, 9, ents(3, 11, 11)), hb, app(2, 3, 11, 3, 9, ents(3, 12, 12))},
			[]raftpb.Message{app(2, 3, 10, 3, 9, ents(3, 11, 11)), hb, app(2, 3, 11, 3, 9, ents(3, 12, 12))}},
		{"empty append then entries",
			[]raftpb.Message{app(2, 3, 10, 3, 9, nil), app(2, 3, 10, 3, 10, ents(3, 11, 11))},
			[]raftpb.Message{app(2, 3, 10, 3, 10, ents(3, 11, 11))}},
		{"acks: the highest stays",
			[]raftpb.Message{resp(1, 3, 11, false), resp(1, 3, 12, false), resp(1, 3, 14, false)},
			[]raftpb.Message{resp(1, 3, 14, false)}},
		{"rejections are never merged",
			[]raftpb.Message{resp(1, 3, 11, false), resp(1, 3, 12, true), resp(1, 3, 14, false)},
			[]raftpb.Message{resp(1, 3, 11, false), resp(1, 3, 12, true), resp(1, 3, 14, false)}},
		{"acks of different terms are not merged",
			[]raftpb.Message{resp(1, 3, 11, false), resp(1, 4, 12, false)},
			[]raftpb.Message{resp(1, 3, 11, false), resp(1, 4, 12, false)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := make([]raftpb.Message, len(tc.in))
			copy(in, tc.in)
			got := coalesce(in, 9, MaxSizePerMsgDefault)
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("coalesce:\n got %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

// TestCoalesceNeverWritesIntoRaftsEntries: the first append's entry slice
// may share raft's unstable log; merging must copy it, not append into it.
func TestCoalesceNeverWritesIntoRaftsEntries(t *testing.T) {
	backing := ents(3, 11, 14)
	first := backing[:1:4] // spare capacity over entries 12..14
	msgs := []raftpb.Message{app(2, 3, 10, 3, 9, first), app(2, 3, 11, 3, 9, []raftpb.Entry{{Term: 3, Index: 12, Data: []byte("new")}})}
	got := coalesce(msgs, 9, MaxSizePerMsgDefault)
	if len(got) != 1 || len(got[0].Entries) != 2 {
		t.Fatalf("not merged: %+v", got)
	}
	if !reflect.DeepEqual(backing, ents(3, 11, 14)) {
		t.Fatalf("merge wrote into the shared slice: %+v", backing)
	}
}

// TestCoalesceRespectsSizeCap: merged appends stay under the cap.
func TestCoalesceRespectsSizeCap(t *testing.T) {
	one := ents(3, 11, 11)
	limit := 2 * uint64(one[0].Size())
	msgs := []raftpb.Message{app(2, 3, 10, 3, 9, ents(3, 11, 11)), app(2, 3, 11, 3, 9, ents(3, 12, 12)), app(2, 3, 12, 3, 9, ents(3, 13, 13))}
	got := coalesce(msgs, 9, limit)
	if len(got) != 2 || len(got[0].Entries) != 2 || len(got[1].Entries) != 1 {
		t.Fatalf("cap %d: %+v", limit, got)
	}
}
