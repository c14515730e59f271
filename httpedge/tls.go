package httpedge

import (
	"crypto/tls"
	"fmt"
	"os"
	"sync/atomic"
)

// certs serves the traffic listener's certificate and swaps in a new pair
// when its files change; a pair that does not load keeps the old one.
type certs struct {
	certFile, keyFile string
	cur               atomic.Pointer[tls.Certificate]
}

func newCerts(certFile, keyFile string) (*certs, error) {
	c := &certs{certFile: certFile, keyFile: keyFile}
	if err := c.reload(); err != nil {
		return nil, err
	}
	return c, nil
}

// reload loads the pair again; on error the running certificate stays.
func (c *certs) reload() error {
	pair, err := tls.LoadX509KeyPair(c.certFile, c.keyFile)
	if err != nil {
		return fmt.Errorf("edge: TLS certificate %s, key %s: %w", c.certFile, c.keyFile, err)
	}
	c.cur.Store(&pair)
	return nil
}

// stamp identifies the files' current versions, for the watcher.
func (c *certs) stamp() string {
	var b []byte
	for _, f := range []string{c.certFile, c.keyFile} {
		if st, err := os.Stat(f); err == nil {
			b = fmt.Appendf(b, "%s:%d:%d;", f, st.ModTime().UnixNano(), st.Size())
		}
	}
	return string(b)
}

// config is the listener's TLS configuration: TLS 1.2 and 1.3 only, and
// for 1.2 only ECDHE key exchange with AEAD ciphers (1.3's suites are all
// AEAD and not configurable).
func (c *certs) config() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		CipherSuites: []uint16{
			tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
			tls.TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384, tls.TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
			tls.TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256, tls.TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
		},
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return c.cur.Load(), nil },
	}
}
