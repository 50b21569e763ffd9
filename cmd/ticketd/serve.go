package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"reflect"
	"sort"
	"strings"

	"github.com/knadh/koanf/parsers/yaml"
	"github.com/knadh/koanf/providers/env/v2"
	"github.com/knadh/koanf/providers/file"
	"github.com/knadh/koanf/providers/posflag"
	"github.com/knadh/koanf/v2"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/ticketd/ticketd/daemon"
	"github.com/ticketd/ticketd/internal/natsclient"
)

func serveCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run a node",
		Long: `Run a ticketd node: the raft member, its store, and (by default) an embedded
NATS server that clients reach. With no flags it starts a one-node cluster
on 127.0.0.1:4222 with data in ./ticketd-data.

Configuration comes from, in increasing precedence: built-in defaults, a
YAML file (--config, flat keys named like the flags), TICKETD_* environment
variables (TICKETD_NATS_LISTEN for --nats-listen) and flags. Unknown keys
are refused. Secrets come from --*-file flags or TICKETD_* variables, never
from flag values. serve stops on SIGTERM or SIGINT, a leader handing
leadership over first.

Exit status: 0 after SIGTERM or SIGINT; 1 when the node fails (its log's
last ERROR line says why); 2 for a refused configuration; 5 when this
member was removed from the cluster (retired, or replaced by another node:
the log says "the member has been permanently removed from the cluster"),
at start or while it runs: do not restart it, start a new node in its place
(docs/operations.md, "Replacing a failed node").`,
		Example: `  ticketd serve
  ticketd serve --config ticketd.yaml
  ticketd serve --id 1 --data data1 --peer-listen 127.0.0.1:7001 --peer-secret-file peer.secret \
      --initial-cluster 1=127.0.0.1:7001,2=127.0.0.1:7002,3=127.0.0.1:7003 --initial-cluster-state new`,
		Args:        exactArgs(),
		Annotations: map[string]string{noUsageAnnotation: "true"},
	}
	cmd.Flags().AddFlagSet(serveFlags())
	cmd.RunE = bind(cmd.Flags(), serve)
	return cmd
}

// serveFlags are the flags of serve, one per daemon.Config key.
func serveFlags() *pflag.FlagSet {
	d := daemon.Defaults()
	fs := pflag.NewFlagSet("serve", pflag.ContinueOnError)
	fs.String("config", "", "YAML config file (flat keys, same names as the flags)")
	fs.Uint64("id", d.ID, "raft id of this node")
	fs.String("data", d.Data, "data directory")
	fs.String("nats-listen", d.NATSListen, "client address of the embedded NATS server")
	fs.String("nats-url", "", "use this existing NATS instead of the embedded server (no password in it: --nats-user and TICKETD_NATS_PASSWORD_FILE)")
	fs.String("nats-cluster-listen", "", "embedded NATS cluster (route) listen address")
	fs.Uint32("group", d.Group, "in a partitioned deployment (docs/scaling.md, with --groups): this cluster is group N, numbered from 0")
	fs.Uint32("groups", d.Groups, "in a partitioned deployment: the number of groups, as in the NATS mapping's partition(N,1); 0: not partitioned")
	fs.String("nats-routes", "", "comma-separated route addresses of the other nodes' embedded NATS")
	fs.String("nats-cluster-name", d.NATSClusterName, "embedded NATS cluster name")
	fs.String("nats-config", "", "nats-server configuration file for the embedded server (listen, TLS, accounts, users, permissions, routes)")
	// The node's own connection authenticates like any client; the values
	// land in the config keys of the same names (the password only from
	// TICKETD_NATS_PASSWORD or --nats-password-file).
	natsclient.Flags(fs, func(string) string { return "" })
	fs.String("acl", "", "access list file (YAML: identity -> key prefix -> operations); none: every request is allowed")
	fs.Bool("nats-trust-request-info", false, "vouch that the server at --nats-url writes who is asking (ticketd alone in its account, exporting ticketd.v1.lock.> to tenant accounts); needed there by --acl and per-identity limits; wrong, it lets clients claim identities")
	fs.String("peer-listen", "", "raft peer listen address (multi-node)")
	fs.String("peer-secret-file", "", "file holding the cluster secret shared by all nodes, >= 16 bytes (or TICKETD_PEER_SECRET_FILE, TICKETD_PEER_SECRET)")
	fs.String("peer-tls-cert", "", "peer mutual TLS certificate (PEM)")
	fs.String("peer-tls-key", "", "peer mutual TLS key (PEM)")
	fs.String("peer-tls-ca", "", "peer mutual TLS CA (PEM)")
	fs.String("initial-cluster", "", "initial members id=host:port,... (empty: single node)")
	fs.String("initial-cluster-state", d.InitialClusterState, "new: this start creates the static cluster; existing: an empty data directory is refused")
	fs.String("initial-cluster-token", d.InitialClusterToken, "mixed into a new static cluster's ID, so clusters with the same members and secret refuse each other")
	fs.String("metrics-listen", "", "HTTP address for /metrics, /healthz, /readyz")
	fs.Bool("pprof", false, "also serve Go profiles under /debug/pprof/ on --metrics-listen, which must be loopback")
	fs.String("leader-placement", d.LeaderPlacement, "follow-clients: hand leadership to the node through whose NATS server most requests come; off: never")
	fs.Int("tick-ms", d.TickMS, "raft tick in milliseconds")
	fs.Int("election-ticks", d.ElectionTicks, "ticks without a heartbeat before an election")
	fs.Int("heartbeat-ticks", d.HeartbeatTicks, "ticks between leader heartbeats")
	fs.Uint64("snapshot-entries", d.SnapshotEntries, "applied entries between snapshots")
	fs.Uint64("compact-keep", d.CompactKeep, "log entries kept behind a snapshot")
	fs.Bool("unsafe-no-fsync", false, "do not fsync (benchmarks only: loses data on power failure)")
	fs.String("log-level", d.LogLevel, "debug, info, warn or error")
	fs.String("log-format", d.LogFormat, "text or json")
	fs.String("control-listen", "", "control API listen address (bootstrap, join, replacement); never the client port")
	fs.String("control-credential-file", "", "file holding the admin credential of the control API, >= 16 bytes (or TICKETD_CONTROL_CREDENTIAL_FILE, TICKETD_CONTROL_CREDENTIAL)")
	fs.String("bootstrap-credential-file", "", "file holding the first node's one-shot bootstrap credential, >= 16 bytes (or TICKETD_BOOTSTRAP_CREDENTIAL_FILE, TICKETD_BOOTSTRAP_CREDENTIAL)")
	fs.String("join", "", "comma-separated control URLs of the cluster to join")
	fs.String("join-credential-file", "", "file holding the one-time join credential minted by an admin (or TICKETD_JOIN_CREDENTIAL_FILE, TICKETD_JOIN_CREDENTIAL)")
	fs.String("control-tls-cert", "", "control API TLS certificate (PEM); required off loopback")
	fs.String("control-tls-key", "", "control API TLS key (PEM)")
	fs.String("control-tls-client-ca", "", "CA (PEM) that control API client certificates must chain to (mutual TLS)")
	fs.String("control-tls-ca", "", "CA (PEM) this node trusts when it calls other nodes' control API (join)")
	fs.Uint64("replace", 0, "with --join: join as the replacement of this voter's NodeID (needs the control credential)")
	fs.String("plugins", "", "comma-separated WebAssembly plugin modules (policy and/or audit)")
	fs.Uint32("plugin-memory-pages", 0, "memory limit per plugin instance in 64 KiB pages (0: plugins default)")
	fs.Int("plugin-call-timeout-ms", 0, "deadline of one plugin call (0: plugins default)")
	fs.String("audit-stream", "", "JetStream stream capturing audit events (embedded NATS: enables JetStream)")
	fs.Int64("audit-max-bytes", d.AuditMaxBytes, "most bytes the audit stream keeps (the oldest events are dropped first)")
	fs.String("audit-store-dir", "", "directory of the embedded JetStream store (default DATA/jetstream; another disk keeps audit apart from the raft store)")
	fs.Int("max-locks", d.MaxLocks, "most locks held at once; a grant beyond is refused with resource_exhausted (at most 1048576)")
	fs.Int("max-locks-per-identity", 0, "most locks one authenticated identity holds (anonymous requests share one quota); 0: no limit")
	fs.Int("max-sessions", d.MaxSessions, "most sessions open at once; an open beyond is refused with resource_exhausted (at most 131072)")
	fs.Int("max-sessions-per-identity", 0, "most sessions one authenticated identity has open (anonymous requests share one quota); 0: no limit")
	fs.Int("max-waiters-per-key", d.MaxWaitersPerKey, "most acquires waiting for one key")
	fs.Int("max-waiters", d.MaxWaiters, "most acquires waiting on this node")
	fs.Int("max-waiters-per-identity", d.MaxWaitersPerIdentity, "most acquires of one identity waiting on this node (anonymous requests share one identity)")
	fs.Int("max-inflight", d.MaxInflight, "most requests this node handles at once, acquires and the rest each (waiting acquires not counted); beyond: unavailable")
	fs.Int("max-inflight-per-identity", d.MaxInflightPerIdentity, "most requests of one identity in progress on this node, waiting acquires not counted")
	fs.Int("plugin-calls-per-identity", 0, "most policy plugin calls of one identity running at once; 0: half the plugin's instances (at least 1)")
	fs.Int("plugin-ms-per-identity", d.PluginTimePerIdentityMS, "policy plugin time one identity may use per second, in milliseconds; beyond: resource_exhausted")
	fs.Int64("disk-alarm-bytes", d.DiskAlarmBytes, "below this much free space on the data disk, refuse grants (releases still work) and raise the nospace alarm; a node needs a quarter of it free to start")
	fs.Int64("disk-ballast-bytes", d.DiskBallastBytes, "space reserved in data/raft/BALLAST, released if a write still meets a full disk (-1: none)")
	return fs
}

// loadConfig parses args as serve's flags and merges the configuration
// (configFrom).
func loadConfig(args []string, environ []string, stderr io.Writer) (daemon.Config, error) {
	fs := serveFlags()
	fs.SetOutput(stderr)
	if err := fs.Parse(args); err != nil {
		return daemon.Config{}, err
	}
	if fs.NArg() > 0 {
		return daemon.Config{}, fmt.Errorf("%w: unexpected arguments %v", daemon.ErrConfig, fs.Args())
	}
	return configFrom(fs, environ)
}

// configFrom merges defaults, the config file, TICKETD_* env and the
// parsed flags fs.
func configFrom(fs *pflag.FlagSet, environ []string) (daemon.Config, error) {
	k := koanf.New(".")
	if path, _ := fs.GetString("config"); path != "" {
		if err := k.Load(file.Provider(path), yaml.Parser()); err != nil {
			return daemon.Config{}, fmt.Errorf("%w: read %s: %v", daemon.ErrConfig, path, err)
		}
		if err := checkKeys(k.Keys(), func(key string) string { return key }); err != nil {
			return daemon.Config{}, fmt.Errorf("%w (in %s)", err, path)
		}
	}
	// Loaded apart so that an unknown one is named as the variable it came
	// from: a TICKETD_* variable set for something else (a test's, a
	// script's) would otherwise read as a key nobody wrote.
	fromEnv := koanf.New(".")
	if err := fromEnv.Load(env.Provider(".", env.Opt{
		Prefix:        "TICKETD_",
		EnvironFunc:   func() []string { return environ },
		TransformFunc: envKey,
	}), nil); err != nil {
		return daemon.Config{}, fmt.Errorf("%w: environment: %v", daemon.ErrConfig, err)
	}
	if err := checkKeys(fromEnv.Keys(), envVarName); err != nil {
		return daemon.Config{}, fmt.Errorf("%w in the environment (serve reads every TICKETD_* variable as a setting; unset it)", err)
	}
	if err := k.Merge(fromEnv); err != nil {
		return daemon.Config{}, fmt.Errorf("%w: environment: %v", daemon.ErrConfig, err)
	}
	if err := k.Load(posflag.Provider(fs, ".", k), nil); err != nil {
		return daemon.Config{}, fmt.Errorf("%w: flags: %v", daemon.ErrConfig, err)
	}
	cfg := daemon.Defaults()
	if err := k.UnmarshalWithConf("", &cfg, koanf.UnmarshalConf{Tag: "koanf"}); err != nil {
		return daemon.Config{}, fmt.Errorf("%w: %v", daemon.ErrConfig, err)
	}
	cfg, err := cfg.LoadSecretFiles()
	if err != nil {
		return daemon.Config{}, err
	}
	return cfg, cfg.Validate()
}

func envKey(k, v string) (string, any) {
	return strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(k, "TICKETD_")), "_", "-"), v
}

// envVarName is the variable envKey reads as key.
func envVarName(key string) string {
	return "TICKETD_" + strings.ToUpper(strings.ReplaceAll(key, "-", "_"))
}

// checkKeys rejects keys no field knows: a typo in a config file must not
// silently fall back to a default. name says how the error names a key.
func checkKeys(keys []string, name func(key string) string) error {
	known := map[string]bool{"config": true}
	t := reflect.TypeOf(daemon.Config{})
	for i := 0; i < t.NumField(); i++ {
		known[t.Field(i).Tag.Get("koanf")] = true
	}
	var unknown []string
	for _, key := range keys {
		if !known[key] {
			unknown = append(unknown, name(key))
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		return fmt.Errorf("%w: unknown keys %s", daemon.ErrConfig, strings.Join(unknown, ", "))
	}
	return nil
}

func newLogger(cfg daemon.Config, w io.Writer) *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(cfg.LogLevel))
	opts := &slog.HandlerOptions{Level: level}
	if cfg.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

func serve(ctx context.Context, fs *pflag.FlagSet, _ []string, stdout, stderr io.Writer) int {
	cfg, err := configFrom(fs, environ())
	if err != nil {
		return usagef(stderr, "%v", err)
	}
	log := newLogger(cfg, stderr)
	d, err := daemon.Start(ctx, cfg, daemon.Options{Logger: log, TuneGC: true,
		// A storage failure was logged in one line by the store: exit now,
		// before anything else runs on a store that cannot go on.
		OnStorageFailure: func(error) { os.Exit(exitFailure) },
	})
	if errors.Is(err, daemon.ErrRemoved) {
		log.Error("start refused", "err", err)
		return exitRemoved
	}
	if err != nil {
		log.Error("start failed", "err", err)
		return exitFailure
	}
	select {
	case <-ctx.Done():
		log.Info("signal received; shutting down")
	case <-d.Done():
		err := d.Err()
		d.Close()
		if errors.Is(err, daemon.ErrRemoved) {
			return exitRemoved // the daemon logged why
		}
		log.Error("raft loop stopped", "err", err)
		return exitFailure
	}
	sctx, cancel := context.WithTimeout(context.Background(), daemon.HandOverTimeout(cfg))
	defer cancel()
	d.Shutdown(sctx)
	return 0
}
