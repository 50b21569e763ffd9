package raftstore

import (
	"fmt"
)

// keyClusterID holds the cluster ID (uint64 big endian) this store was
// created for. Unlike the other rows it is optional: stores created before
// cluster IDs have none, and keep working without one (their peers, of the
// same age, present none either).
var keyClusterID = []byte("m/clusterid")

// ClusterID is the cluster ID recorded in the store; ok is false when none
// is.
func (s *Store) ClusterID() (id uint64, ok bool, err error) {
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	if s.isClosed() {
		return 0, false, ErrStoreClosed
	}
	v, ok, err := get(s.db, keyClusterID)
	if err != nil || !ok {
		return 0, false, err
	}
	id, err = decodeUint64("cluster id", v)
	return id, err == nil, err
}

// SetClusterID records id, synced. A store records one cluster ID for its
// life: setting another is an error (the same one again is not).
func (s *Store) SetClusterID(id uint64) error {
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	if s.isClosed() {
		return ErrStoreClosed
	}
	v, ok, err := get(s.db, keyClusterID)
	if err != nil {
		return err
	}
	if ok {
		old, err := decodeUint64("cluster id", v)
		if err != nil {
			return err
		}
		if old != id {
			return fmt.Errorf("raftstore: the store belongs to cluster %016x, not %016x", old, id)
		}
		return nil
	}
	if err := s.db.Set(keyClusterID, encodeUint64(id), s.wo); err != nil {
		return fmt.Errorf("raftstore: record cluster id: %w", err)
	}
	return nil
}

func (s *Store) isClosed() bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.closed
}
