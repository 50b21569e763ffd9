package control

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
)

// ServerTLS loads the control API's TLS from PEM files: its certificate
// and key, and, when clientCAFile is set, the CA every client certificate
// must chain to (mutual TLS).
func ServerTLS(certFile, keyFile, clientCAFile string) (*tls.Config, error) {
	kp, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("control: TLS key pair: %w", err)
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{kp}, MinVersion: tls.VersionTLS12}
	if clientCAFile != "" {
		if cfg.ClientCAs, err = caPool(clientCAFile); err != nil {
			return nil, err
		}
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return cfg, nil
}

// ClientTLS loads the TLS a caller of the control API uses from PEM files:
// the CA of the nodes' certificates (caFile; "" trusts the system's) and,
// for a control API with mutual TLS, its own certificate and key.
func ClientTLS(caFile, certFile, keyFile string) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	var err error
	if caFile != "" {
		if cfg.RootCAs, err = caPool(caFile); err != nil {
			return nil, err
		}
	}
	if certFile != "" || keyFile != "" {
		kp, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("control: TLS client key pair: %w", err)
		}
		cfg.Certificates = []tls.Certificate{kp}
	}
	return cfg, nil
}

func caPool(path string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("control: TLS CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("control: TLS CA %s holds no certificate", path)
	}
	return pool, nil
}
