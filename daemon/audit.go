package daemon

import (
	"path/filepath"

	"github.com/ticketd/ticketd/plugins/audit"
)

// AuditKeyFile holds, in the data directory of a node without a peer
// secret, the key of its audit events' Nats-Msg-Id (audit.LoadOrCreateKey).
const AuditKeyFile = "audit-msgid.key"

// auditIDKey is the key of the audit events' Nats-Msg-Id: derived from the
// peer secret and the cluster ID, which every member shares and no client
// knows, so every node gives one event the same id; a node without a peer
// secret (no peers) keeps a random one in its data directory.
func (d *Daemon) auditIDKey() ([]byte, error) {
	if len(d.cfg.PeerSecret) >= MinPeerSecretLen {
		return audit.KeyFromSecret([]byte(d.cfg.PeerSecret), d.clusterID), nil
	}
	return audit.LoadOrCreateKey(filepath.Join(d.cfg.Data, AuditKeyFile))
}
