package control

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"
)

const identityFile = "identity.json"

// ReasonIdentityRefused is the reason of /v1/identity's refusal: the
// identity was retired or replaced, for good.
const ReasonIdentityRefused = "identity_refused"

// identityCheckTimeout bounds the start-up question "is my identity
// still current?": a node that gets no answer starts anyway.
const identityCheckTimeout = 3 * time.Second

// Identity is this node's issued NodeID and incarnation, kept in the data
// directory beside the store.
type Identity struct {
	NodeID      uint64   `json:"node_id"`
	Incarnation uint64   `json:"incarnation"`
	ControlURLs []string `json:"control_urls,omitempty"`
}

// ReadIdentity reads the identity file in dataDir; ok is false when there
// is none.
func ReadIdentity(dataDir string) (id Identity, ok bool, err error) {
	b, err := os.ReadFile(filepath.Join(dataDir, identityFile))
	if errors.Is(err, os.ErrNotExist) {
		return Identity{}, false, nil
	}
	if err != nil {
		return Identity{}, false, fmt.Errorf("control: read identity: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&id); err != nil {
		return Identity{}, false, fmt.Errorf("control: identity file is corrupt: %w", err)
	}
	if id.NodeID == 0 || id.Incarnation == 0 {
		return Identity{}, false, errors.New("control: identity file is corrupt: node_id and incarnation must be set")
	}
	return id, true, nil
}

// WriteIdentity replaces the identity file in dataDir, synced, through a
// rename so a crash leaves the old file or the new one.
func WriteIdentity(dataDir string, id Identity) error {
	b, _ := json.MarshalIndent(id, "", "  ")
	tmp := filepath.Join(dataDir, identityFile+".tmp")
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("control: write identity: %w", err)
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return fmt.Errorf("control: write identity: %w", err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("control: write identity: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("control: write identity: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(dataDir, identityFile)); err != nil {
		return fmt.Errorf("control: write identity: %w", err)
	}
	return nil
}

// RaftLog is the one question identity resolution asks of the local raft
// log. *raftstore.Store satisfies it.
type RaftLog interface {
	LastIndex() (uint64, error)
}

// StartConfig is what ResolveIdentity needs to know about a starting node.
type StartConfig struct {
	// DataDir holds the identity file.
	DataDir string
	// Join says the node was told to join (or replace a member) through
	// the control API at JoinURLs.
	Join     bool
	JoinURLs []string
	// JoinCredential admits a new member; Replace, if not 0, is the
	// NodeID this node replaces instead, which needs the control
	// Credential.
	JoinCredential string
	Replace        uint64
	Credential     string
	// PeerListen is the peer address the node registers when it joins.
	PeerListen string
	// Log is the local raft log: a node that holds raft state but no
	// identity may not join with it.
	Log    RaftLog
	Logger *slog.Logger
	// TLS, if set, is how this node verifies (and, for mutual TLS,
	// presents itself to) the control API at https JoinURLs.
	TLS *tls.Config
}

func (cfg StartConfig) callOptions() []CallOption {
	if cfg.TLS == nil {
		return nil
	}
	return []CallOption{WithTLS(cfg.TLS)}
}

// Resolved is the identity ResolveIdentity settled on.
type Resolved struct {
	// NodeID is the issued NodeID, or 0 when the configured id stands
	// (static membership, or a node still to be bootstrapped).
	NodeID uint64
	// Join is the admission reply of a node that joined just now (its
	// NodeID, incarnation and the members to dial), nil otherwise.
	Join *Reply
}

// ResolveIdentity decides a starting node's identity: an identity file
// from an earlier bootstrap or join (checked against the cluster: a
// retired NodeID or an old incarnation is refused), a fresh join or
// replacement through the control API (whose identity it writes), or none
// (the configured id: static membership and bootstrap).
func ResolveIdentity(ctx context.Context, cfg StartConfig) (Resolved, error) {
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	id, ok, err := ReadIdentity(cfg.DataDir)
	if err != nil {
		return Resolved{}, err
	}
	if ok {
		urls := append(append([]string(nil), cfg.JoinURLs...), id.ControlURLs...)
		if len(urls) == 0 {
			return Resolved{NodeID: id.NodeID}, nil
		}
		cctx, cancel := context.WithTimeout(ctx, identityCheckTimeout)
		defer cancel()
		_, err := Call(cctx, urls, "/v1/identity", "", Request{NodeID: id.NodeID, Incarnation: id.Incarnation}, cfg.callOptions()...)
		var ce *Error
		if errors.As(err, &ce) && ce.Code == CodeRejected {
			return Resolved{}, fmt.Errorf("control: the cluster refuses identity %d/%d: %w", id.NodeID, id.Incarnation, err)
		}
		if err != nil {
			log.Warn("identity not confirmed (no leader reachable); starting anyway", "node_id", id.NodeID, "err", err)
		}
		return Resolved{NodeID: id.NodeID}, nil
	}
	if !cfg.Join {
		return Resolved{}, nil
	}
	last, err := cfg.Log.LastIndex()
	if err != nil {
		return Resolved{}, fmt.Errorf("control: refusing to join: read the raft log: %w", err)
	}
	if last > 0 {
		return Resolved{}, fmt.Errorf("control: %s holds raft state but no identity; refusing to join with it", cfg.DataDir)
	}
	var rep Reply
	if cfg.Replace != 0 {
		rep, err = Call(ctx, cfg.JoinURLs, "/v1/replacements", cfg.Credential, Request{OldNodeID: cfg.Replace, Address: cfg.PeerListen}, cfg.callOptions()...)
	} else {
		rep, err = Call(ctx, cfg.JoinURLs, "/v1/join", "", Request{Credential: cfg.JoinCredential, Address: cfg.PeerListen}, cfg.callOptions()...)
	}
	if err != nil {
		return Resolved{}, fmt.Errorf("control: join: %w", err)
	}
	if err := WriteIdentity(cfg.DataDir, Identity{NodeID: rep.NodeID, Incarnation: rep.Incarnation, ControlURLs: cfg.JoinURLs}); err != nil {
		return Resolved{}, err
	}
	log.Info("joined the cluster as a learner", "node_id", rep.NodeID, "incarnation", rep.Incarnation)
	return Resolved{NodeID: rep.NodeID, Join: &rep}, nil
}
