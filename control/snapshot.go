package control

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/ticketd/ticketd/core"
	"github.com/ticketd/ticketd/raftstore"
)

// snapshot answers POST /v1/snapshot (admin, leader only) with a backup
// file: the applied state after a ReadIndex, so it holds every write
// committed before the request arrived, taken under the machine's read
// lock at one applied index.
func (p *Plane) snapshot(w http.ResponseWriter, r *http.Request) {
	if !p.pace(r) {
		return
	}
	if e := p.admitted(r); e != nil {
		p.fail(w, r, e)
		return
	}
	if _, e := decodeRequest(r); e != nil {
		writeError(w, e)
		return
	}
	serving(r)
	if !p.cfg.Leadership.IsLeader() {
		writeError(w, &Error{Code: CodeNotLeader, Message: "ask the leader", Leader: p.cfg.Node.Leader()})
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), TimeoutDefault)
	defer cancel()
	if err := p.cfg.Node.ReadIndex(ctx); err != nil {
		code := CodeUnavailable
		if errors.Is(err, raftstore.ErrNotLeader) {
			code = CodeNotLeader
		}
		writeError(w, &Error{Code: code, Message: fmt.Sprintf("read index: %v", err), Leader: p.cfg.Node.Leader()})
		return
	}
	info := BackupInfo{NodeID: p.cfg.ID, Term: p.cfg.Node.Term(), TakenAt: time.Now().UTC()}
	var data []byte
	p.cfg.Node.ViewIndexed(func(m *core.Machine, index uint64) {
		data = m.Snapshot()
		info.AppliedIndex = index
		info.LastToken = m.LastToken()
		info.Locks = m.Len()
		info.ClusterVersion = m.ClusterVersion()
		info.Bootstrapped = m.Bootstrapped()
		for _, mb := range m.Members() {
			info.Members = append(info.Members, Member{NodeID: mb.NodeID, Incarnation: mb.Incarnation, Address: mb.Address, Role: mb.Role.String()})
		}
	})
	file, err := EncodeBackup(info, data, p.backupKey)
	if err != nil {
		writeError(w, &Error{Code: CodeUnavailable, Message: err.Error()})
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.Itoa(len(file)))
	w.WriteHeader(http.StatusOK)
	if _, err := w.Write(file); err != nil {
		p.log.Warn("backup not delivered", "err", err)
		return
	}
	p.log.Info("backup taken", "index", info.AppliedIndex, "locks", info.Locks, "last_token", info.LastToken, "bytes", len(file))
}

// SaveBackup asks the leader among urls for a backup and returns it
// verified (DecodeBackup with the backup key of credential, which the
// leader sealed it with), with its bytes as they go to the file. It is a
// read: retrying it is always safe.
func SaveBackup(ctx context.Context, urls []string, credential string, opts ...CallOption) (Backup, []byte, error) {
	file, err := roundTrip(ctx, urls, "/v1/snapshot", credential, struct{}{}, int64(MaxBackupSize), opts)
	if err != nil {
		return Backup{}, nil, err
	}
	b, err := DecodeBackup(file, Verify{Key: NewBackupKey(credential)})
	if err != nil {
		return Backup{}, nil, fmt.Errorf("control: the leader's backup: %w", err)
	}
	return b, file, nil
}
