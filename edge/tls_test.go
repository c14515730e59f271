package edge_test

import (
	"crypto/tls"
	"crypto/x509"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/poplimit/poplimit/edge"
	"github.com/poplimit/poplimit/httpedge"
	"github.com/poplimit/poplimit/internal/testenv"
)

func tlsClient(cert *x509.Certificate, maxVersion uint16) *http.Client {
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool, MaxVersion: maxVersion}, DisableKeepAlives: true}}
}

// TestTLSListener serves the traffic listener over TLS, refuses TLS 1.1,
// swaps in a new certificate when the files change, and keeps the old one
// when the new files do not load.
func TestTLSListener(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile, first := testenv.WriteCert(t, dir, "first")
	e := startEdge(t, edgeOpts{rules: threePerMinute, cfg: httpedge.Config{TLSCert: certFile, TLSKey: keyFile}, reloadPoll: 20 * time.Millisecond})
	url := "https://" + e.addr + "/check/x"
	resp, err := tlsClient(first, 0).Get(url)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.TLS == nil || resp.TLS.PeerCertificates[0].Subject.CommonName != "first" {
		t.Fatalf("over TLS: %d %v", resp.StatusCode, resp.TLS)
	}
	if _, err := tlsClient(first, tls.VersionTLS11).Get(url); err == nil {
		t.Error("a TLS 1.1 client was served")
	}
	// A new pair is picked up by the watcher; the old connection's
	// clients keep working (no restart).
	_, _, second := testenv.WriteCert(t, dir, "second")
	testenv.WaitFor(t, 5*time.Second, "the new certificate served", func() bool {
		resp, err := tlsClient(second, 0).Get(url)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.TLS.PeerCertificates[0].Subject.CommonName == "second"
	})
	// A broken pair is refused and counted; the running one stays.
	os.WriteFile(keyFile, []byte("not a key"), 0o600)
	testenv.WaitFor(t, 5*time.Second, "the bad reload counted", func() bool {
		return testenv.MetricSum(t, e.reg, "poplimit_edge_tls_reloads_total", "result", "rejected") >= 1
	})
	resp, err = tlsClient(second, 0).Get("https://" + e.addr + "/check/y")
	if err != nil {
		t.Fatalf("after a bad reload: %v", err)
	}
	resp.Body.Close()
	if resp.TLS.PeerCertificates[0].Subject.CommonName != "second" {
		t.Errorf("after a bad reload the certificate is %q, want the running one", resp.TLS.PeerCertificates[0].Subject.CommonName)
	}
	if err := e.srv.ReloadTLS(); err == nil {
		t.Error("ReloadTLS of a bad key: want an error")
	}
}

func TestTLSConfigRejected(t *testing.T) {
	dir := t.TempDir()
	certFile, _, _ := testenv.WriteCert(t, dir, "x")
	for _, cfg := range []httpedge.Config{{TLSCert: certFile}, {TLSCert: certFile, TLSKey: filepath.Join(dir, "missing.pem")}} {
		o := edge.Options{Server: cfg}
		if _, err := edge.Build(o); err == nil {
			t.Errorf("Build with %+v: want an error", cfg)
		}
	}
}
