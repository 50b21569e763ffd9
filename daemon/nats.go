package daemon

import (
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/ticketd/ticketd/internal/loglimit"
	"github.com/ticketd/ticketd/internal/natsclient"
	"github.com/ticketd/ticketd/transports/natsapi"
)

// startNATS starts the embedded NATS server unless an external one is
// configured, and connects the node's own client to it.
func (d *Daemon) startNATS() error {
	url := d.cfg.NATSURL
	a := d.cfg.NATSAuth()
	if url == "" {
		ns, err := d.embeddedNATS()
		if err != nil {
			return err
		}
		d.ns = ns
		// The node's own connection to its embedded server is an in-memory
		// pipe, never the network: it authenticates like any client, but
		// encrypting it would only cost CPU on every request and reply.
		// nats-server does not require TLS in-process; a client
		// certificate (which the server may map to a user) still brings it.
		url = strings.Replace(ns.ClientURL(), "tls://", "nats://", 1)
		if a.TLSCert == "" {
			a.TLSCA = ""
		}
	}
	auth, err := a.Options()
	if err != nil {
		return configErr("%v", err)
	}
	opts := append([]nats.Option{
		nats.Name(fmt.Sprintf("ticketd-%d", d.cfg.ID)),
		// A reply published while disconnected must fail at once, so the
		// lost-reply path can release its grant, not sit in a buffer.
		nats.ReconnectBufSize(-1),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(100 * time.Millisecond),
	}, auth...)
	// Asynchronous errors (a slow consumer, a header block a client wrote
	// that nats.go cannot parse) into the log, at most natsLogBurst a
	// second: nats.go's default handler writes each to stderr, and any
	// client can cause one per request.
	asyncLimit := &loglimit.Limiter{Burst: natsLogBurst}
	asyncLog := d.log.With("component", "nats-client")
	opts = append(opts, nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
		if ok, suppressed := asyncLimit.Allow(time.Now()); ok {
			subject := ""
			if sub != nil {
				subject = sub.Subject
			}
			asyncLog.Warn("NATS connection error", "subject", subject, "err", err, "suppressed", suppressed)
		}
	}))
	if d.ns != nil {
		// Guarded: the node reads each header block's lines as the server
		// wrote them, so a client cannot slip a Nats-Request-Info past
		// the server's (natsapi headerguard.go).
		opts = append(opts, nats.InProcessServer(natsapi.GuardedInProcess{Server: d.ns}))
	}
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		return fmt.Errorf("daemon: connect to NATS %s: %w", natsclient.Redact(url), err)
	}
	d.nc = nc
	return nil
}

// watchInterest answers, for the watch publisher, whether anyone would
// receive a message on a subject: the embedded server's own subscription
// interest in the account the node's connection belongs to, which holds
// local, route, leafnode and stream-import subscriptions. It is nil
// (publish every event) for an external server, whose interest this node
// cannot see, with gateways, which forward messages to other clusters
// without registered interest, and when the account maps subjects.
func (d *Daemon) watchInterest() natsapi.Interest {
	if d.ns == nil || d.ns.GatewayAddr() != nil {
		return nil
	}
	acc, err := d.ownAccount()
	if err != nil {
		d.log.Warn("watch events go out without an interest check", "err", err)
		return nil
	}
	// A subject mapping of the account rewrites a subject before it is
	// routed, so interest in the published subject says nothing.
	az, err := d.ns.Accountz(&natsserver.AccountzOptions{Account: acc.GetName()})
	if err != nil || az.Account == nil || len(az.Account.Mappings) > 0 {
		return nil
	}
	return acc.SubscriptionInterest
}

// ownAccount is the embedded server's account of the node's own
// connection.
func (d *Daemon) ownAccount() (*natsserver.Account, error) {
	cid, err := d.nc.GetClientID()
	if err != nil {
		return nil, fmt.Errorf("own client id: %w", err)
	}
	connz, err := d.ns.Connz(&natsserver.ConnzOptions{CID: cid, Username: true})
	if err != nil {
		return nil, fmt.Errorf("own connection: %w", err)
	}
	if len(connz.Conns) != 1 {
		return nil, fmt.Errorf("own connection %d: %d found", cid, len(connz.Conns))
	}
	if name := connz.Conns[0].Account; name != "" {
		return d.ns.LookupAccount(name)
	}
	return d.ns.GlobalAccount(), nil
}

func (d *Daemon) embeddedNATS() (*natsserver.Server, error) {
	o, err := d.embeddedNATSOptions()
	if err != nil {
		return nil, err
	}
	if d.cfg.AuditStream != "" {
		o.JetStream = true
		if o.StoreDir == "" {
			o.StoreDir = d.cfg.AuditStoreDir
		}
		if o.StoreDir == "" {
			o.StoreDir = filepath.Join(d.cfg.Data, "jetstream")
		}
		// The whole JetStream store is bounded too (unless a nats-server
		// configuration set its own), with room for the stream's own
		// bookkeeping above its MaxBytes.
		if o.JetStreamMaxStore <= 0 {
			o.JetStreamMaxStore = d.cfg.AuditMaxBytes + d.cfg.AuditMaxBytes/8
		}
		if o.JetStreamMaxMemory <= 0 {
			o.JetStreamMaxMemory = 64 << 20
		}
	}
	ns, err := natsserver.NewServer(o)
	if err != nil {
		return nil, fmt.Errorf("daemon: embedded NATS: %w", err)
	}
	nlog := &natsLogger{log: d.log.With("component", "nats"), limit: loglimit.Limiter{Burst: natsLogBurst},
		retries: loglimit.Limiter{Burst: 1, Per: natsRetryLogEvery}}
	ns.SetLoggerV2(nlog, false, false, false)
	go ns.Start()
	if !natsReady(ns, nlog, StartTimeoutDefault) {
		ns.Shutdown()
		if why := nlog.fatal(); why != "" {
			return nil, fmt.Errorf("daemon: embedded NATS did not start on %s: %s", d.cfg.NATSListen, why)
		}
		return nil, fmt.Errorf("daemon: embedded NATS did not start on %s", d.cfg.NATSListen)
	}
	return ns, nil
}

// natsReady waits until ns accepts connections, for at most timeout, and
// gives up at once when the server reported a fatal error.
func natsReady(ns *natsserver.Server, nlog *natsLogger, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if ns.ReadyForConnections(50 * time.Millisecond) {
			return true
		}
		if nlog.fatal() != "" {
			return false
		}
	}
	return false
}

// embeddedNATSOptions are the embedded server's options: the nats-server
// configuration file when one is given (which then decides listen, TLS,
// accounts, users, permissions and routes), else an open server from the
// nats-* settings.
func (d *Daemon) embeddedNATSOptions() (*natsserver.Options, error) {
	if d.cfg.NATSConfig != "" {
		o, err := natsserver.ProcessConfigFile(d.cfg.NATSConfig)
		if err != nil {
			return nil, configErr("nats-config %s: %v", d.cfg.NATSConfig, err)
		}
		o.NoSigs = true // ticketd owns the process's signals
		o.NoLog = true
		if o.ServerName == "" {
			o.ServerName = fmt.Sprintf("ticketd-%d", d.cfg.ID)
		}
		withRoutePings(o)
		return o, nil
	}
	host, portStr, _ := net.SplitHostPort(d.cfg.NATSListen)
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return nil, configErr("nats-listen port %q: %v", portStr, err)
	}
	if port == 0 {
		port = natsserver.RANDOM_PORT
	}
	o := &natsserver.Options{
		ServerName: fmt.Sprintf("ticketd-%d", d.cfg.ID),
		Host:       host,
		Port:       port,
		NoSigs:     true,
		NoLog:      true,
		MaxPayload: 1 << 20,
	}
	if d.cfg.NATSClusterListen != "" {
		ch, cp, err := net.SplitHostPort(d.cfg.NATSClusterListen)
		if err != nil {
			return nil, configErr("nats-cluster-listen %q: %v", d.cfg.NATSClusterListen, err)
		}
		cport, err := strconv.Atoi(cp)
		if err != nil {
			return nil, configErr("nats-cluster-listen port %q: %v", cp, err)
		}
		o.Cluster = natsserver.ClusterOpts{Name: d.cfg.NATSClusterName, Host: ch, Port: cport}
		for _, r := range strings.Split(d.cfg.NATSRoutes, ",") {
			r = strings.TrimSpace(r)
			if r == "" || r == d.cfg.NATSClusterListen {
				continue
			}
			u, err := url.Parse("nats://" + r)
			if err != nil {
				return nil, configErr("nats-routes entry %q: %v", r, err)
			}
			o.Routes = append(o.Routes, u)
		}
		withRoutePings(o)
	}
	return o, nil
}

// RoutePingInterval and RouteMaxPingsOut are the embedded NATS server's
// route pings, unless its configuration file sets cluster.ping_interval
// or cluster.ping_max: a route whose peer stops answering is closed about
// 3 s later (the third ping finds two unanswered).
//
// Why not nats-server's defaults (a ping every 30 s, 2 outstanding): only
// the leader subscribes to the lock subjects (natsapi's leader-only
// subscriptions), and a leader that stops without closing its routes
// (paused, cut off by a one-way partition) cannot unsubscribe. Until the
// other servers drop their route to it, they keep routing part of the
// lock requests to its subscription, where they are lost: half of them
// or more, for 60–90 s after every such leader change. A ping a second
// on each route costs nothing measurable.
const (
	RoutePingInterval = time.Second
	RouteMaxPingsOut  = 2
)

func withRoutePings(o *natsserver.Options) {
	if o.Cluster.PingInterval == 0 {
		o.Cluster.PingInterval = RoutePingInterval
	}
	if o.Cluster.MaxPingsOut == 0 {
		o.Cluster.MaxPingsOut = RouteMaxPingsOut
	}
}
