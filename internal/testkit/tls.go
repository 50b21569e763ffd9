package testkit

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// CA is a throwaway certificate authority, valid for an hour, made by the
// test that uses it (no key is ever committed).
type CA struct {
	Cert *x509.Certificate
	Key  *ecdsa.PrivateKey
	// Pool holds Cert alone.
	Pool *x509.CertPool
}

// NewCA makes a CA named name.
func NewCA(t testing.TB, name string) *CA {
	t.Helper()
	key, cert := newCert(t, name, nil, nil)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &CA{Cert: cert, Key: key, Pool: pool}
}

// Issue returns a certificate signed by ca for 127.0.0.1 and localhost,
// valid for servers and clients.
func (ca *CA) Issue(t testing.TB, name string) tls.Certificate {
	t.Helper()
	key, cert := newCert(t, name, ca.Cert, ca.Key)
	return tls.Certificate{Certificate: [][]byte{cert.Raw}, PrivateKey: key, Leaf: cert}
}

// TLSFiles are PEM files of a throwaway CA and of a certificate it
// signed, in the test's temporary directory.
type TLSFiles struct {
	Dir string
	// CA is the CA certificate.
	CA string
	// Cert and Key are a certificate for 127.0.0.1 and localhost, valid
	// for servers and clients.
	Cert, Key string
}

// TLS creates a CA and one certificate it signed, as PEM files.
func TLS(t testing.TB) TLSFiles {
	t.Helper()
	dir := t.TempDir()
	ca := NewCA(t, "ticketd test CA")
	c := ca.Issue(t, "ticketd test node")
	f := TLSFiles{Dir: dir, CA: filepath.Join(dir, "ca.pem"), Cert: filepath.Join(dir, "cert.pem"), Key: filepath.Join(dir, "key.pem")}
	writePEM(t, f.CA, "CERTIFICATE", ca.Cert.Raw)
	writePEM(t, f.Cert, "CERTIFICATE", c.Leaf.Raw)
	der, err := x509.MarshalECPrivateKey(c.PrivateKey.(*ecdsa.PrivateKey))
	if err != nil {
		t.Fatal(err)
	}
	writePEM(t, f.Key, "EC PRIVATE KEY", der)
	return f
}

// newCert makes a CA certificate (parent nil) or one signed by parent.
func newCert(t testing.TB, name string, parent *x509.Certificate, parentKey *ecdsa.PrivateKey) (*ecdsa.PrivateKey, *x509.Certificate) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
	}
	if parent == nil {
		tmpl.IsCA, tmpl.BasicConstraintsValid, tmpl.KeyUsage = true, true, x509.KeyUsageCertSign
		parent, parentKey = tmpl, key
	} else {
		tmpl.KeyUsage = x509.KeyUsageDigitalSignature
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
		tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1)}
		tmpl.DNSNames = []string{"localhost"}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return key, cert
}

func writePEM(t testing.TB, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}
