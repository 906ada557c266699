package proxy

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// testCA is a private certificate authority, as a company runs for its
// internal services.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newTestCA(t *testing.T, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// file writes the CA's certificate, after some text (as a bundle may
// begin), to a file and returns its path.
func (ca *testCA) file(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(path, append([]byte("# the engines' CA\n"), ca.pem...), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// serve starts an HTTPS engine whose certificate, for 127.0.0.1, the CA
// signed.
func (ca *testCA) serve(t *testing.T, h http.Handler) *httptest.Server {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "engine"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(h)
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshakes are the test's
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv
}

// An engine whose certificate a private CA signed is refused with the
// system's roots, and served with its CA file; a CA file replaces the
// system's roots rather than adds to them, so another CA's engine is
// refused; and a connection made under one backend's CAs is not handed to
// a backend without them.
func TestCAFile(t *testing.T) {
	ca := newTestCA(t, "Moonji test CA")
	srv := ca.serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		io.WriteString(w, "private "+string(b))
	}))
	roots, err := LoadCAFile(ca.file(t))
	if err != nil {
		t.Fatal(err)
	}
	c := NewClient()
	post := func(up Upstream) (string, error) {
		resp, err := c.Post(context.Background(), up, APIChat, []byte(`{"model":"m"}`))
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return string(b), err
	}
	without := Upstream{Name: "plain", BaseURL: srv.URL + "/v1"}
	with := Upstream{Name: "private", BaseURL: srv.URL + "/v1", RootCAs: roots}

	var unknown x509.UnknownAuthorityError
	if _, err := post(without); !errors.As(err, &unknown) {
		t.Fatalf("without the CA file: %v, want an unknown authority", err)
	}
	for i := range 2 { // the second on the kept connection
		if got, err := post(with); err != nil || got != `private {"model":"m"}` {
			t.Fatalf("with the CA file, request %d: %q, %v", i, got, err)
		}
	}
	// The connection the CA checked sits in the pool; a backend of the
	// same URL without the CA file must not take it.
	if _, err := post(without); !errors.As(err, &unknown) {
		t.Fatalf("without the CA file, after a request with it: %v, want an unknown authority", err)
	}

	other, err := LoadCAFile(newTestCA(t, "another CA").file(t))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := post(Upstream{Name: "other", BaseURL: srv.URL + "/v1", RootCAs: other}); !errors.As(err, &unknown) {
		t.Fatalf("with another CA's file: %v, want an unknown authority", err)
	}
}

func TestLoadCAFileRefuses(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty.pem")
	key := filepath.Join(dir, "key.pem")
	os.WriteFile(empty, nil, 0o600)
	os.WriteFile(key, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: []byte("not a certificate")}), 0o600)
	for _, path := range []string{filepath.Join(dir, "missing.pem"), empty, key} {
		if _, err := LoadCAFile(path); err == nil || !strings.Contains(err.Error(), "CA file") {
			t.Errorf("%s: %v, want a CA file error", filepath.Base(path), err)
		}
	}
}
