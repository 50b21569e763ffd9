package core

import (
	"encoding/binary"
	"strconv"
)

// Request record encodings: one ended request record as storage keeps it
// in a row of its own, and the request section of a snapshot (version 4).
//
//	ended record:    version:1 | ended
//	request section: data_clock_ms:uvarint | ended_head:uvarint | count:uvarint | ended*
//	ended = request:32 | key_hash:32 | token:uvarint | ended_at_ms:uvarint
//
// Ended records come oldest first; ended_head is the sequence number of
// the first (of the next one, when there is none).

// minEndedSize is the smallest encoding of an ended record, which bounds
// an honest count by the input length.
const minEndedSize = 32 + 32 + 1 + 1

// EncodeEndedRequest encodes one ended request record as stored in its
// storage row.
func EncodeEndedRequest(e EndedRequest) []byte {
	b := make([]byte, 0, 1+MaxEndedSnapshotSize)
	return appendEndedRequest(append(b, EndedRequestVersion1), &e)
}

// DecodeEndedRequest decodes one stored ended request record. Its token
// may be 0 (a tombstone, cluster version 6); how it relates to the rest
// of the state, the cluster version included, is for Machine.LoadRequests
// to check.
func DecodeEndedRequest(b []byte) (EndedRequest, error) {
	d := decoder{b: b}
	if v := d.byte(); d.err == nil && v != EndedRequestVersion1 {
		return EndedRequest{}, &Error{Code: CodeUnknownVersion, Detail: "ended request record version " + strconv.Itoa(int(v))}
	}
	e := d.endedRequest()
	if err := d.finish(); err != nil {
		return EndedRequest{}, err
	}
	return e, nil
}

func appendEndedRequest(b []byte, e *EndedRequest) []byte {
	b = append(b, e.Request[:]...)
	b = append(b, e.KeyHash[:]...)
	b = binary.AppendUvarint(b, e.Token)
	return binary.AppendUvarint(b, e.EndedAtMS)
}

func (d *decoder) endedRequest() EndedRequest {
	var e EndedRequest
	e.Request = d.hash()
	e.KeyHash = d.hash()
	e.Token = d.uvarint()
	e.EndedAtMS = d.uvarint()
	return e
}

func appendRequestsHeader(b []byte, dataClockMS, endedHead uint64, count int) []byte {
	b = binary.AppendUvarint(b, dataClockMS)
	b = binary.AppendUvarint(b, endedHead)
	return binary.AppendUvarint(b, uint64(count))
}

// requests reads a request section. The caller validates it against the
// rest of the snapshot (validateRequests).
func (d *decoder) requests() RequestState {
	var rs RequestState
	rs.DataClockMS = d.uvarint()
	rs.EndedHead = d.uvarint()
	n := d.count(MaxRequestRecords, minEndedSize, "ended requests")
	if n > 0 {
		rs.Ended = make([]EndedRequest, 0, n)
	}
	for i := uint64(0); i < n && d.err == nil; i++ {
		rs.Ended = append(rs.Ended, d.endedRequest())
	}
	if d.err != nil {
		return RequestState{}
	}
	return rs
}
