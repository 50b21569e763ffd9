package daemon

import (
	"errors"
	"fmt"
	"net"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/ticketd/ticketd/control"
	"github.com/ticketd/ticketd/core"
	"github.com/ticketd/ticketd/internal/natsclient"
	"github.com/ticketd/ticketd/lockservice"
	"github.com/ticketd/ticketd/plugins"
	"github.com/ticketd/ticketd/plugins/audit"
	"github.com/ticketd/ticketd/raftstore"
	"github.com/ticketd/ticketd/transports/natsapi"
	"github.com/ticketd/ticketd/transports/protocol"
)

// Config is one node's configuration. Field tags are the flat, kebab-case
// keys used in config files, TICKETD_* variables (upper-case, '_' for '-')
// and flags (--key).
type Config struct {
	ID   uint64 `koanf:"id"`
	Data string `koanf:"data"`

	NATSListen        string `koanf:"nats-listen"`
	NATSURL           string `koanf:"nats-url"`
	NATSClusterListen string `koanf:"nats-cluster-listen"`
	NATSRoutes        string `koanf:"nats-routes"`
	NATSClusterName   string `koanf:"nats-cluster-name"`
	// NATSConfig is a nats-server configuration file for the embedded
	// server (listen, TLS, accounts, users, permissions, cluster routes).
	// It replaces nats-listen and the nats-cluster-* settings.
	NATSConfig string `koanf:"nats-config"`
	// The node's own NATS connection authenticates like any client
	// (natsclient.Auth). NATSPassword has no flag: it comes from
	// TICKETD_NATS_PASSWORD or NATSPasswordFile; NATSToken (a server's
	// authorization token) likewise from TICKETD_NATS_TOKEN or
	// NATSTokenFile.
	NATSCreds        string `koanf:"nats-creds"`
	NATSNKey         string `koanf:"nats-nkey"`
	NATSUser         string `koanf:"nats-user"`
	NATSPassword     string `koanf:"nats-password"`
	NATSPasswordFile string `koanf:"nats-password-file"`
	NATSToken        string `koanf:"nats-token"`
	NATSTokenFile    string `koanf:"nats-token-file"`
	NATSTLSCA        string `koanf:"nats-tls-ca"`
	NATSTLSCert      string `koanf:"nats-tls-cert"`
	NATSTLSKey       string `koanf:"nats-tls-key"`
	NATSInboxPrefix  string `koanf:"nats-inbox-prefix"`
	// ACL is the access list file (lockservice.ACL); "" allows every
	// request, as in development. It, and every per-identity limit, needs
	// identities nats-server writes (identity.go).
	ACL string `koanf:"acl"`
	// NATSTrustRequestInfo is the operator's word that the external server
	// at NATSURL writes who is asking (ticketd's account holds only
	// ticketd's own user and exports the lock subjects, never
	// ticketd.v1.fwd.>, as a service that tenants import): ticketd cannot
	// inspect that server, and if the word is wrong any client can claim
	// any identity.
	NATSTrustRequestInfo bool `koanf:"nats-trust-request-info"`

	PeerListen     string `koanf:"peer-listen"`
	PeerSecret     string `koanf:"peer-secret"`
	PeerSecretFile string `koanf:"peer-secret-file"`
	PeerTLSCert    string `koanf:"peer-tls-cert"`
	PeerTLSKey     string `koanf:"peer-tls-key"`
	PeerTLSCA      string `koanf:"peer-tls-ca"`
	InitialCluster string `koanf:"initial-cluster"`
	// InitialClusterState is "new" when this start creates the static
	// cluster, "existing" (the default) otherwise: a member of a
	// multi-node static cluster refuses to start on an empty data
	// directory unless told it is new, so a member whose data was wiped
	// cannot silently bootstrap again (and vote twice in a term). Ignored
	// once the data directory holds raft state, like etcd's.
	InitialClusterState string `koanf:"initial-cluster-state"`
	// InitialClusterToken goes into the cluster ID a new static cluster
	// derives from its member list: clusters that share a member list and
	// a secret still refuse each other when their tokens differ.
	InitialClusterToken string `koanf:"initial-cluster-token"`

	MetricsListen string `koanf:"metrics-listen"`
	// Pprof serves net/http/pprof under /debug/pprof/ on MetricsListen,
	// which must then be loopback; /debug/pprof/cmdline is not served.
	Pprof bool `koanf:"pprof"`

	TickMS          int    `koanf:"tick-ms"`
	ElectionTicks   int    `koanf:"election-ticks"`
	HeartbeatTicks  int    `koanf:"heartbeat-ticks"`
	SnapshotEntries uint64 `koanf:"snapshot-entries"`
	CompactKeep     uint64 `koanf:"compact-keep"`
	NoSync          bool   `koanf:"unsafe-no-fsync"`

	LogLevel  string `koanf:"log-level"`
	LogFormat string `koanf:"log-format"`

	// Control plane (SPEC §4.5): a separate listener and credential.
	ControlListen       string `koanf:"control-listen"`
	ControlCredential   string `koanf:"control-credential"`
	BootstrapCredential string `koanf:"bootstrap-credential"`
	Join                string `koanf:"join"`
	JoinCredential      string `koanf:"join-credential"`
	Replace             uint64 `koanf:"replace"`
	// Each secret can come from a file instead (never from argv in
	// examples: `ps` shows a command line to every local user).
	ControlCredentialFile   string `koanf:"control-credential-file"`
	BootstrapCredentialFile string `koanf:"bootstrap-credential-file"`
	JoinCredentialFile      string `koanf:"join-credential-file"`
	// Control API TLS: the listener's certificate and key; an optional CA
	// that client certificates must chain to (mutual TLS); the CA this
	// node trusts when it calls other nodes' control API (join, identity
	// check). A control listener off loopback needs TLS.
	ControlTLSCert     string `koanf:"control-tls-cert"`
	ControlTLSKey      string `koanf:"control-tls-key"`
	ControlTLSClientCA string `koanf:"control-tls-client-ca"`
	ControlTLSCA       string `koanf:"control-tls-ca"`

	// Plugins is a comma-separated list of WebAssembly modules.
	Plugins             string `koanf:"plugins"`
	PluginMemoryPages   uint32 `koanf:"plugin-memory-pages"`
	PluginCallTimeoutMS int    `koanf:"plugin-call-timeout-ms"`
	// Limits on what clients can make the leader hold (lockservice
	// quota.go): held locks in total (at most core.MaxLocks) and per
	// authenticated identity (0: no per-identity limit), waiters per key
	// and per node.
	MaxLocks            int `koanf:"max-locks"`
	MaxLocksPerIdentity int `koanf:"max-locks-per-identity"`
	MaxWaitersPerKey    int `koanf:"max-waiters-per-key"`
	MaxWaiters          int `koanf:"max-waiters"`
	// Sessions (issue 24, lockservice sessions.go): open sessions in
	// total (at most core.MaxSessions) and per identity (0: no limit).
	MaxSessions            int `koanf:"max-sessions"`
	MaxSessionsPerIdentity int `koanf:"max-sessions-per-identity"`
	// Fair shares (issue 21, lockservice fair.go): waiters and requests in
	// progress of one identity (anonymous requests share one), the
	// node's budget of requests in progress (acquires and the rest apart,
	// waiting acquires not counted), and each identity's share of a policy
	// plugin: calls at once (0: half the plugin's instances) and instance
	// time per second.
	MaxWaitersPerIdentity   int `koanf:"max-waiters-per-identity"`
	MaxInflightPerIdentity  int `koanf:"max-inflight-per-identity"`
	MaxInflight             int `koanf:"max-inflight"`
	PluginCallsPerIdentity  int `koanf:"plugin-calls-per-identity"`
	PluginTimePerIdentityMS int `koanf:"plugin-ms-per-identity"`

	// Disk space of the raft store (raftstore/disk.go): below
	// DiskAlarmBytes free the node refuses grants (resource_exhausted)
	// and reports the alarm; DiskBallastBytes are reserved in a file that
	// is released if a write still meets a full disk (-1: no ballast). A
	// node does not start with less than a quarter of DiskAlarmBytes free.
	DiskAlarmBytes   int64 `koanf:"disk-alarm-bytes"`
	DiskBallastBytes int64 `koanf:"disk-ballast-bytes"`

	// LeaderPlacement is PlacementFollowClients (the default: leadership
	// moves to the node through whose NATS server most requests come,
	// placement.go) or PlacementOff.
	LeaderPlacement string `koanf:"leader-placement"`

	// Group and Groups place the node in a partitioned deployment
	// (docs/scaling.md): its cluster is group Group of Groups, serves that
	// group's subjects and only the keys that hash to it. Groups 0 (the
	// default): not partitioned, the classic subjects.
	Group  uint32 `koanf:"group"`
	Groups uint32 `koanf:"groups"`

	// AuditStream, if set, names a JetStream stream that captures the
	// audit subjects (de-duplicated on Nats-Msg-Id). With the embedded
	// NATS server it turns JetStream on, storing under data/jetstream.
	AuditStream string `koanf:"audit-stream"`
	// AuditMaxBytes bounds the audit stream (the oldest events go first);
	// AuditStoreDir puts the embedded JetStream store in a directory of its
	// own, ideally on another disk than the raft store (default
	// data/jetstream).
	AuditMaxBytes int64  `koanf:"audit-max-bytes"`
	AuditStoreDir string `koanf:"audit-store-dir"`
}

// Defaults returns the configuration of a first run: one node, embedded
// NATS on 127.0.0.1:4222, data in ./ticketd-data.
func Defaults() Config {
	return Config{
		ID:               1,
		Data:             "./ticketd-data",
		NATSListen:       "127.0.0.1:4222",
		NATSClusterName:  "ticketd",
		TickMS:           100,
		ElectionTicks:    10,
		HeartbeatTicks:   1,
		SnapshotEntries:  10000,
		CompactKeep:      5000,
		LogLevel:         "info",
		LogFormat:        "text",
		MaxLocks:         core.DefaultMaxLocks,
		MaxSessions:      core.DefaultMaxSessions,
		MaxWaitersPerKey: lockservice.MaxWaitersPerKeyDefault,
		MaxWaiters:       lockservice.MaxWaitersDefault,

		MaxWaitersPerIdentity:   lockservice.MaxWaitersPerIdentityDefault,
		MaxInflightPerIdentity:  lockservice.MaxInflightPerIdentityDefault,
		MaxInflight:             natsapi.MaxInflightDefault,
		PluginTimePerIdentityMS: int(plugins.IdentityTimeDefault / time.Millisecond),
		DiskAlarmBytes:          raftstore.DiskAlarmBytesDefault,
		DiskBallastBytes:        raftstore.DiskBallastBytesDefault,
		AuditMaxBytes:           audit.MaxBytesDefault,
		LeaderPlacement:         PlacementFollowClients,

		InitialClusterState: ClusterStateExisting,
		InitialClusterToken: "ticketd-cluster",
		// Zero plugin limits take the plugins package defaults.
	}
}

// Partition is the node's share of a partitioned deployment (the zero
// value when it is not partitioned).
func (c Config) Partition() protocol.Partition {
	return protocol.Partition{Group: c.Group, Groups: c.Groups}
}

// Limits on configuration values.
const (
	MaxMembers       = 9
	MinPeerSecretLen = 16
	// MinCredentialLen is the shortest control or bootstrap credential.
	MinCredentialLen  = 16
	MaxTick           = 10 * time.Second
	MaxElectionTicks  = 1000
	MaxHeartbeatTicks = 100
	// MaxInflight bounds max-inflight: each request in progress is a
	// goroutine.
	MaxInflight = 100000
	// MaxPluginTimePerIdentityMS is all the time of the most instances a
	// plugin has (plugins.MaxInstancesDefault), per second.
	MaxPluginTimePerIdentityMS = 1000 * plugins.MaxInstancesDefault
)

// Values of InitialClusterState.
const (
	ClusterStateNew      = "new"
	ClusterStateExisting = "existing"
)

// ErrConfig marks every configuration error.
var ErrConfig = errors.New("daemon: invalid config")

func configErr(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrConfig, fmt.Sprintf(format, args...))
}

// Member is one initial cluster member.
type Member struct {
	ID   uint64
	Addr string
}

// Members parses InitialCluster ("1=127.0.0.1:7001,2=127.0.0.1:7002").
// An empty list means a single-voter cluster of this node.
func (c Config) Members() ([]Member, error) {
	if strings.TrimSpace(c.InitialCluster) == "" {
		return []Member{{ID: c.ID, Addr: c.PeerListen}}, nil
	}
	seen := map[uint64]bool{}
	var out []Member
	for _, part := range strings.Split(c.InitialCluster, ",") {
		part = strings.TrimSpace(part)
		id, addr, ok := strings.Cut(part, "=")
		if !ok {
			return nil, configErr("initial-cluster entry %q is not id=host:port", part)
		}
		n, err := strconv.ParseUint(id, 10, 64)
		if err != nil || n == 0 {
			return nil, configErr("initial-cluster id %q is not a positive integer", id)
		}
		if _, _, err := net.SplitHostPort(addr); err != nil {
			return nil, configErr("initial-cluster address %q: %v", addr, err)
		}
		if seen[n] {
			return nil, configErr("initial-cluster id %d appears twice", n)
		}
		seen[n] = true
		out = append(out, Member{ID: n, Addr: addr})
	}
	if len(out) > MaxMembers {
		return nil, configErr("initial-cluster has %d members, the limit is %d", len(out), MaxMembers)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// Validate checks every field.
func (c Config) Validate() error {
	if c.ID == 0 {
		return configErr("id must be a positive integer")
	}
	if c.Data == "" {
		return configErr("data must name a directory")
	}
	if c.Pprof && !control.IsLoopback(c.MetricsListen) {
		// Profiles show memory and goroutine stacks: loopback only.
		return configErr("pprof needs metrics-listen on a loopback address (127.0.0.1:PORT or [::1]:PORT), got %q: profiles expose the process's memory and stacks", c.MetricsListen)
	}
	switch c.LeaderPlacement {
	case "", PlacementFollowClients, PlacementOff:
	default:
		return configErr("leader-placement %q: want %s or %s", c.LeaderPlacement, PlacementFollowClients, PlacementOff)
	}
	if err := c.Partition().Validate(); err != nil {
		return configErr("group, groups: %v", err)
	}
	if c.NATSURL == "" && c.NATSListen == "" {
		return configErr("either nats-url or nats-listen is required")
	}
	if c.NATSListen != "" && c.NATSURL == "" && c.NATSConfig == "" {
		if _, _, err := net.SplitHostPort(c.NATSListen); err != nil {
			return configErr("nats-listen %q: %v", c.NATSListen, err)
		}
	}
	if err := c.validateNATS(); err != nil {
		return err
	}
	if err := c.validateControl(); err != nil {
		return err
	}
	if c.TickMS <= 0 || time.Duration(c.TickMS)*time.Millisecond > MaxTick {
		return configErr("tick-ms %d is outside (0, %d]", c.TickMS, MaxTick.Milliseconds())
	}
	if c.ElectionTicks <= c.HeartbeatTicks || c.ElectionTicks > MaxElectionTicks {
		return configErr("election-ticks %d must exceed heartbeat-ticks %d and be at most %d", c.ElectionTicks, c.HeartbeatTicks, MaxElectionTicks)
	}
	if c.HeartbeatTicks <= 0 || c.HeartbeatTicks > MaxHeartbeatTicks {
		return configErr("heartbeat-ticks %d is outside [1, %d]", c.HeartbeatTicks, MaxHeartbeatTicks)
	}
	if c.SnapshotEntries == 0 {
		return configErr("snapshot-entries must be positive")
	}
	members, err := c.Members()
	if err != nil {
		return err
	}
	if len(members) > 1 {
		found := false
		for _, m := range members {
			found = found || m.ID == c.ID
		}
		if !found {
			return configErr("id %d is not in initial-cluster", c.ID)
		}
		if c.PeerListen == "" {
			return configErr("peer-listen is required in a multi-node cluster")
		}
		if len(c.PeerSecret) < MinPeerSecretLen {
			return configErr("peer-secret must be at least %d bytes in a multi-node cluster", MinPeerSecretLen)
		}
	}
	if (c.PeerTLSCert == "") != (c.PeerTLSKey == "") || (c.PeerTLSCert != "" && c.PeerTLSCA == "") {
		return configErr("peer-tls-cert, peer-tls-key and peer-tls-ca go together")
	}
	if c.Join != "" && c.JoinCredential == "" && c.Replace == 0 {
		return configErr("join needs join-credential (or replace with control-credential)")
	}
	if c.Replace != 0 && (c.Join == "" || c.ControlCredential == "") {
		return configErr("replace needs join and control-credential")
	}
	if (c.Join != "" || c.BootstrapCredential != "") && (c.PeerListen == "" || len(c.PeerSecret) < MinPeerSecretLen) {
		return configErr("bootstrap and join need peer-listen and a peer-secret of at least %d bytes", MinPeerSecretLen)
	}
	if c.Join != "" && c.BootstrapCredential != "" {
		return configErr("a node either bootstraps or joins, not both")
	}
	if c.Join != "" && strings.TrimSpace(c.InitialCluster) != "" || c.BootstrapCredential != "" && strings.TrimSpace(c.InitialCluster) != "" {
		return configErr("initial-cluster (static membership) and bootstrap/join (control plane) exclude each other")
	}
	if c.InitialClusterState != ClusterStateNew && c.InitialClusterState != ClusterStateExisting {
		return configErr("initial-cluster-state %q is not new or existing", c.InitialClusterState)
	}
	if c.MaxLocks < 1 || c.MaxLocks > core.MaxLocks {
		// Above core.MaxLocks a snapshot of a full table might not fit
		// what the peer transport streams (core/limits.go).
		return configErr("max-locks %d is outside [1, %d]", c.MaxLocks, core.MaxLocks)
	}
	if c.MaxLocksPerIdentity < 0 || c.MaxLocksPerIdentity > c.MaxLocks {
		return configErr("max-locks-per-identity %d is outside [0, max-locks %d] (0: no per-identity limit)", c.MaxLocksPerIdentity, c.MaxLocks)
	}
	if c.MaxSessions < 1 || c.MaxSessions > core.MaxSessions || c.MaxSessionsPerIdentity < 0 || c.MaxSessionsPerIdentity > c.MaxSessions {
		return configErr("max-sessions %d must be in [1, %d] and max-sessions-per-identity %d in [0, max-sessions] (0: no per-identity limit)", c.MaxSessions, core.MaxSessions, c.MaxSessionsPerIdentity)
	}
	if c.MaxWaitersPerKey < 1 || c.MaxWaiters < 1 || c.MaxWaitersPerKey > c.MaxWaiters {
		return configErr("max-waiters-per-key %d and max-waiters %d must be positive, per key at most per node", c.MaxWaitersPerKey, c.MaxWaiters)
	}
	if err := c.validateShares(); err != nil {
		return err
	}
	if c.DiskAlarmBytes < 1<<20 || c.DiskBallastBytes < -1 || c.DiskBallastBytes > c.DiskAlarmBytes {
		return configErr("disk-alarm-bytes %d must be at least 1 MiB, disk-ballast-bytes %d between -1 (none) and the alarm", c.DiskAlarmBytes, c.DiskBallastBytes)
	}
	if c.AuditMaxBytes < 1<<20 {
		return configErr("audit-max-bytes %d is below 1 MiB", c.AuditMaxBytes)
	}
	if c.PluginCallTimeoutMS < 0 || c.PluginCallTimeoutMS > 10000 {
		return configErr("plugin-call-timeout-ms %d is outside [0, 10000]", c.PluginCallTimeoutMS)
	}
	switch c.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		return configErr("log-level %q is not debug, info, warn or error", c.LogLevel)
	}
	switch c.LogFormat {
	case "text", "json":
	default:
		return configErr("log-format %q is not text or json", c.LogFormat)
	}
	return nil
}

// validateShares checks the fair-share settings: each positive, a share
// at most the whole.
func (c Config) validateShares() error {
	if c.MaxWaitersPerIdentity < 1 || c.MaxWaitersPerIdentity > c.MaxWaiters {
		return configErr("max-waiters-per-identity %d is outside [1, max-waiters %d]", c.MaxWaitersPerIdentity, c.MaxWaiters)
	}
	if c.MaxInflight < 1 || c.MaxInflight > MaxInflight {
		return configErr("max-inflight %d is outside [1, %d]", c.MaxInflight, MaxInflight)
	}
	if c.MaxInflightPerIdentity < 1 || c.MaxInflightPerIdentity > c.MaxInflight {
		return configErr("max-inflight-per-identity %d is outside [1, max-inflight %d]", c.MaxInflightPerIdentity, c.MaxInflight)
	}
	if c.PluginCallsPerIdentity < 0 {
		return configErr("plugin-calls-per-identity %d is negative (0: half the plugin instances)", c.PluginCallsPerIdentity)
	}
	if c.PluginTimePerIdentityMS < 1 || c.PluginTimePerIdentityMS > MaxPluginTimePerIdentityMS {
		return configErr("plugin-ms-per-identity %d is outside [1, %d]", c.PluginTimePerIdentityMS, MaxPluginTimePerIdentityMS)
	}
	return nil
}

func (c Config) validateNATS() error {
	switch {
	case natsclient.HasSecret(c.NATSURL):
		return configErr("nats-url carries a password or token (user:password@ or token@), which ps, logs and config dumps would show: set nats-user and the password with nats-password-file, TICKETD_NATS_PASSWORD_FILE or %s; a token with nats-token-file, TICKETD_NATS_TOKEN_FILE or %s", natsclient.PasswordEnv, natsclient.TokenEnv)
	case c.NATSConfig != "" && c.NATSURL != "":
		return configErr("nats-config configures the embedded server; nats-url uses another one: choose one")
	case c.NATSConfig != "" && (c.NATSClusterListen != "" || c.NATSRoutes != ""):
		return configErr("with nats-config, the cluster block of that file sets routes (nats-cluster-listen and nats-routes are refused)")
	}
	if err := c.validateIdentity(); err != nil {
		return err
	}
	if err := c.NATSAuth().Validate(); err != nil {
		return configErr("%v", err)
	}
	return nil
}

// IdentitySettings names the settings in use that exist to tell one
// requester from another and are refused where identities can be forged:
// the access list and the per-identity lock quota (off by default). A
// per-identity setting added later that is off by default belongs here.
// The fair shares (waiters, requests in progress and plugin time per
// identity) are always on and are not: where identities cannot be
// believed every request is the one anonymous identity, so a header cannot
// dodge them, and they are limits on all clients together
// (docs/operations.md); TunedShares names them for the start-up warning.
func (c Config) IdentitySettings() []string {
	var out []string
	if c.ACL != "" {
		out = append(out, "acl")
	}
	if c.MaxLocksPerIdentity > 0 {
		out = append(out, "max-locks-per-identity")
	}
	if c.MaxSessionsPerIdentity > 0 {
		out = append(out, "max-sessions-per-identity")
	}
	return out
}

// TunedShares names the fair-share settings set to other than their
// defaults: an operator who sets them expects each tenant its own share.
func (c Config) TunedShares() []string {
	d := Defaults()
	var out []string
	for _, s := range []struct {
		name string
		set  bool
	}{
		{"max-waiters-per-identity", c.MaxWaitersPerIdentity != d.MaxWaitersPerIdentity},
		{"max-inflight-per-identity", c.MaxInflightPerIdentity != d.MaxInflightPerIdentity},
		{"plugin-calls-per-identity", c.PluginCallsPerIdentity != d.PluginCallsPerIdentity},
		{"plugin-ms-per-identity", c.PluginTimePerIdentityMS != d.PluginTimePerIdentityMS},
	} {
		if s.set {
			out = append(out, s.name)
		}
	}
	return out
}

// validateIdentity refuses, before anything starts, the configurations in
// which the identity settings would trust a header any client can write
// (identity.go checks the embedded server's accounts once it runs).
func (c Config) validateIdentity() error {
	if c.NATSTrustRequestInfo && c.NATSURL == "" {
		return configErr("nats-trust-request-info vouches for an external server (nats-url); the embedded server's accounts are checked by ticketd itself")
	}
	uses := c.IdentitySettings()
	if len(uses) == 0 {
		return nil
	}
	switch {
	case c.NATSURL == "" && c.NATSConfig == "":
		// Identities come from Nats-Request-Info; on an open NATS any
		// client can write that header.
		return configErr("%s %s: an open NATS cannot tell who is asking (any client can write the Nats-Request-Info header); "+
			"start the embedded server from a nats-config with accounts, ticketd alone in its account exporting ticketd.v1.lock.> as a service that tenant accounts import (examples/secure)",
			strings.Join(uses, ", "), needIdentities(len(uses)))
	case c.NATSURL != "" && !c.NATSTrustRequestInfo:
		return configErr("%s %s, and ticketd cannot inspect the server at nats-url: unless that server puts ticketd's user alone in its account, "+
			"exporting ticketd.v1.lock.> (never ticketd.v1.fwd.>) as a service that tenant accounts import, any client can claim any identity; "+
			"once it does, say so with nats-trust-request-info (docs/protocol.md §10)", strings.Join(uses, ", "), needIdentities(len(uses)))
	}
	return nil
}

func needIdentities(n int) string {
	if n == 1 {
		return "needs identities that NATS writes"
	}
	return "need identities that NATS writes"
}

func (c Config) validateControl() error {
	for name, cred := range map[string]string{"control-credential": c.ControlCredential, "bootstrap-credential": c.BootstrapCredential} {
		if cred != "" && len(cred) < MinCredentialLen {
			return configErr("%s must be at least %d bytes", name, MinCredentialLen)
		}
	}
	if (c.ControlTLSCert == "") != (c.ControlTLSKey == "") {
		return configErr("control-tls-cert and control-tls-key go together")
	}
	if c.ControlTLSClientCA != "" && c.ControlTLSCert == "" {
		return configErr("control-tls-client-ca needs control-tls-cert and control-tls-key")
	}
	if c.ControlListen != "" && c.ControlTLSCert == "" && !control.IsLoopback(c.ControlListen) {
		return configErr("control-listen %s is not a loopback address: the control API carries credentials, so it needs control-tls-cert and control-tls-key there", c.ControlListen)
	}
	return nil
}

// NATSAuth is how the node's own NATS connection authenticates.
func (c Config) NATSAuth() natsclient.Auth {
	return natsclient.Auth{
		CredsFile: c.NATSCreds, NKeyFile: c.NATSNKey, User: c.NATSUser, Password: c.NATSPassword, Token: c.NATSToken,
		TLSCA: c.NATSTLSCA, TLSCert: c.NATSTLSCert, TLSKey: c.NATSTLSKey, InboxPrefix: c.NATSInboxPrefix,
	}
}

// LoadSecretFiles returns c with every secret that a *-file setting names
// read from its file. Setting both a secret and its file is an error
// (unless they agree, so loading twice is harmless).
func (c Config) LoadSecretFiles() (Config, error) {
	for _, s := range []struct {
		name   string
		file   string
		secret *string
	}{
		{"peer-secret", c.PeerSecretFile, &c.PeerSecret},
		{"control-credential", c.ControlCredentialFile, &c.ControlCredential},
		{"bootstrap-credential", c.BootstrapCredentialFile, &c.BootstrapCredential},
		{"join-credential", c.JoinCredentialFile, &c.JoinCredential},
		{"nats-password", c.NATSPasswordFile, &c.NATSPassword},
		{"nats-token", c.NATSTokenFile, &c.NATSToken},
	} {
		if s.file == "" {
			continue
		}
		v, err := natsclient.ReadSecretFile(s.file)
		if err != nil {
			return c, configErr("%s-file: %v", s.name, err)
		}
		if *s.secret != "" && *s.secret != v {
			return c, configErr("%s is set both directly and by %s-file", s.name, s.name)
		}
		*s.secret = v
	}
	return c, nil
}

// JoinURLs splits Join into control URLs.
func (c Config) JoinURLs() []string {
	var out []string
	for _, u := range strings.Split(c.Join, ",") {
		if u = strings.TrimSpace(u); u != "" {
			out = append(out, u)
		}
	}
	return out
}
