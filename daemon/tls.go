package daemon

import (
	"crypto/tls"
	"crypto/x509"
	"os"

	"github.com/ticketd/ticketd/control"
)

// TLS settings of the peer transport and the control API, loaded from
// the configured PEM files.

func loadPeerTLS(cfg Config) (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(cfg.PeerTLSCert, cfg.PeerTLSKey)
	if err != nil {
		return nil, configErr("peer TLS key pair: %v", err)
	}
	pool, err := loadCAPool("peer", cfg.PeerTLSCA)
	if err != nil {
		return nil, err
	}
	return &tls.Config{
		Certificates: []tls.Certificate{cert},
		RootCAs:      pool,
		ClientCAs:    pool,
		ClientAuth:   tls.RequireAndVerifyClientCert,
		MinVersion:   tls.VersionTLS13,
	}, nil
}

// loadControlTLS prepares the control API's server TLS and the client
// TLS this node uses when it calls a control API itself (join, identity
// check): the CA it trusts and, when it has one, its own certificate.
func (d *Daemon) loadControlTLS() error {
	c := d.cfg
	var err error
	if c.ControlTLSCert != "" {
		if d.controlServerTLS, err = control.ServerTLS(c.ControlTLSCert, c.ControlTLSKey, c.ControlTLSClientCA); err != nil {
			return configErr("%v", err)
		}
	}
	if c.ControlTLSCA != "" {
		if d.controlClientTLS, err = control.ClientTLS(c.ControlTLSCA, c.ControlTLSCert, c.ControlTLSKey); err != nil {
			return configErr("%v", err)
		}
	}
	return nil
}

func loadCAPool(what, path string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(path)
	if err != nil {
		return nil, configErr("%s TLS CA: %v", what, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, configErr("%s TLS CA %s holds no certificate", what, path)
	}
	return pool, nil
}
