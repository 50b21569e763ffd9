package audit

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/ticketd/ticketd/plugins"
)

// An event's Nats-Msg-Id must be the same on every node, so that the
// copies every node publishes are one message to JetStream and to
// subscribers that de-duplicate, and unpredictable to clients: whoever can
// publish on the audit subjects (anyone, on an open NATS) and knows the id
// of an event to come could publish a forged event under it first, and
// JetStream would keep the forgery and drop the real event as a duplicate.
// So the id is a MAC, under a key every node shares and no client knows, of
// what identifies the event: its log index, its plugin and its position
// among that plugin's events of the entry.

// MinIDKeySize is the shortest IDKey a Publisher accepts.
const MinIDKeySize = 16

// keyFileSize is the size of the key LoadOrCreateKey creates.
const keyFileSize = 32

// msgIDLabel separates the key derived from the peer secret from every
// other use of that secret.
const msgIDLabel = "ticketd audit Nats-Msg-Id v1"

// msgID is the Nats-Msg-Id of the i-th event of one applied command:
// "<index>-<MAC>", the index for people reading a stream, 128 bits of
// HMAC-SHA256 under key for everything else.
func msgID(key []byte, ev plugins.Event, i int) string {
	mac := hmac.New(sha256.New, key)
	var b [12]byte
	binary.BigEndian.PutUint64(b[:8], ev.Index)
	binary.BigEndian.PutUint32(b[8:], uint32(i))
	mac.Write(b[:])
	mac.Write([]byte(ev.Plugin))
	return fmt.Sprintf("%d-%x", ev.Index, mac.Sum(nil)[:16])
}

// KeyFromSecret derives the IDKey of a cluster from the peer secret every
// member shares (and no client knows), bound to the cluster ID.
func KeyFromSecret(secret []byte, clusterID uint64) []byte {
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte(msgIDLabel))
	var id [8]byte
	binary.BigEndian.PutUint64(id[:], clusterID)
	mac.Write(id[:])
	return mac.Sum(nil)
}

// LoadOrCreateKey reads the IDKey kept in path, creating it (random, mode
// 0600, synced) on first use: a node without peers, and so without a peer
// secret, keeps its ids across restarts, when it publishes again the
// events of entries it applies again.
func LoadOrCreateKey(path string) ([]byte, error) {
	key, err := os.ReadFile(path)
	switch {
	case err == nil && len(key) == keyFileSize:
		return key, nil
	case err == nil:
		return nil, fmt.Errorf("audit: key file %s holds %d bytes, want %d", path, len(key), keyFileSize)
	case !errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("audit: key file: %w", err)
	}
	key = make([]byte, keyFileSize)
	if _, err := rand.Read(key); err != nil {
		return nil, fmt.Errorf("audit: key: %w", err)
	}
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return nil, fmt.Errorf("audit: key file: %w", err)
	}
	_, werr := f.Write(key)
	if serr := f.Sync(); werr == nil {
		werr = serr
	}
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr != nil {
		_ = os.Remove(tmp)
		return nil, fmt.Errorf("audit: key file: %w", werr)
	}
	if err := os.Rename(tmp, path); err != nil {
		return nil, fmt.Errorf("audit: key file: %w", err)
	}
	if d, err := os.Open(filepath.Dir(path)); err == nil {
		_ = d.Sync()
		_ = d.Close()
	}
	return key, nil
}
