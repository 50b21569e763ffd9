package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/ticketd/ticketd/fence"
	"github.com/ticketd/ticketd/sdk"
)

// maxTrustFileBytes bounds the trusted-keys file read: `ticketd fence
// pubkey --json` with fence.MaxTrustedKeys keys is about 4 KiB.
const maxTrustFileBytes = 64 << 10

// trustFile is what `ticketd fence pubkey --json` prints: the cluster ID
// and public keys a resource trusts.
type trustFile struct {
	ClusterID string   `json:"cluster_id"`
	Keys      []string `json:"keys"`
}

// loadVerifier reads the resource's trust from path (the output of
// `ticketd fence pubkey --json`).
func loadVerifier(path string) (*fence.Verifier, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("trusted keys: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxTrustFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("trusted keys %s: %w", path, err)
	}
	if len(b) > maxTrustFileBytes {
		return nil, fmt.Errorf("trusted keys %s: more than %d bytes", path, maxTrustFileBytes)
	}
	var tf trustFile
	if err := json.Unmarshal(b, &tf); err != nil {
		return nil, fmt.Errorf("trusted keys %s: not the JSON of `ticketd fence pubkey --json`: %w", path, err)
	}
	id, err := fence.ParseClusterID(tf.ClusterID)
	if err != nil {
		return nil, fmt.Errorf("trusted keys %s: cluster_id: %w", path, err)
	}
	if len(tf.Keys) > fence.MaxTrustedKeys {
		return nil, fmt.Errorf("trusted keys %s: %d keys, at most %d", path, len(tf.Keys), fence.MaxTrustedKeys)
	}
	keys := make([]fence.PublicKey, 0, len(tf.Keys))
	for _, s := range tf.Keys {
		k, err := fence.ParsePublicKey(s)
		if err != nil {
			return nil, fmt.Errorf("trusted keys %s: %w", path, err)
		}
		keys = append(keys, k)
	}
	v, err := fence.NewVerifier(id, keys...)
	if err != nil {
		return nil, fmt.Errorf("trusted keys %s: %w", path, err)
	}
	return v, nil
}

// clusterVerifier trusts the keys the cluster serves now (the SDK's
// FenceKeys, what `ticketd fence pubkey` prints).
func clusterVerifier(ctx context.Context, cl *sdk.Client) (*fence.Verifier, error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	keys, err := cl.FenceKeys(ctx)
	if err != nil {
		return nil, fmt.Errorf("the cluster's fence keys: %w", err)
	}
	if len(keys.Keys) == 0 {
		return nil, errors.New("the cluster has no fence key yet (its leader makes one once every member runs cluster version 3; `ticketd fence pubkey` prints it once made): retry in a moment")
	}
	return keys.Verifier()
}
