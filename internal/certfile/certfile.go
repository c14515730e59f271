// Package certfile serves a TLS certificate and key read from PEM files,
// and swaps in their new versions when the files change, so that a
// certificate rotated on disk (cert-manager, a Kubernetes secret volume
// that swaps a symlinked directory) needs no restart.
//
// The running pair is held behind an atomic pointer and handed to each
// handshake by tls.Config.GetCertificate: a new handshake gets the pair in
// force when it starts, connections already made keep theirs. A pair that
// does not load (unreadable, not PEM, a key that does not match its
// certificate, one file replaced before the other) keeps the running one;
// the failure is logged and counted.
//
// Changes are found by polling: Watch reads both files (following
// symlinks) every interval and reloads when either's contents changed,
// and reloads unconditionally on a signal (SIGHUP). Contents, not
// modification times: a pair rewritten in place within one tick of the
// file system's clock, at the same size, is still seen.
package certfile

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/poplimit/poplimit/internal/filestamp"
)

// Options say how a Pair reports its reloads.
type Options struct {
	// Logger logs each reload, applied (info) or rejected (error).
	// Default slog.Default().
	Logger *slog.Logger
	// Prefix starts each log message ("edge", "rls").
	Prefix string
	// Reloads counts reloads by result, label values "applied" and
	// "rejected"; nil: not counted.
	Reloads *prometheus.CounterVec
}

// Pair is a certificate and key read from files. Its methods are safe for
// concurrent use.
type Pair struct {
	certFile, keyFile string
	o                 Options
	cur               atomic.Pointer[tls.Certificate]

	mu   sync.Mutex // serializes reloads
	seen string     // the files' stamp when last loaded or tried
}

// Load reads the pair from certFile and keyFile; an error names both files.
func Load(certFile, keyFile string, o Options) (*Pair, error) {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	p := &Pair{certFile: certFile, keyFile: keyFile, o: o}
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.loadLocked(); err != nil {
		return nil, err
	}
	return p, nil
}

// loadLocked stamps the files, then reads them: a change made while they
// are read is seen by the next check. On error the running pair stays.
func (p *Pair) loadLocked() error {
	p.seen = p.stamp()
	pair, err := tls.LoadX509KeyPair(p.certFile, p.keyFile)
	if err != nil {
		return fmt.Errorf("TLS certificate %s, key %s: %w", p.certFile, p.keyFile, err)
	}
	p.cur.Store(&pair)
	return nil
}

// Reload reads the files again, changed or not; a pair that does not load
// keeps the running one, and is logged and counted.
func (p *Pair) Reload() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.reloadLocked()
}

func (p *Pair) reloadLocked() error {
	if err := p.loadLocked(); err != nil {
		p.count("rejected")
		p.o.Logger.Error(p.o.Prefix+": TLS reload rejected; the running certificate stays", "err", err)
		return err
	}
	p.count("applied")
	p.o.Logger.Info(p.o.Prefix+": TLS certificate reloaded", "cert", p.certFile)
	return nil
}

func (p *Pair) count(result string) {
	if p.o.Reloads != nil {
		p.o.Reloads.WithLabelValues(result).Inc()
	}
}

// ReloadIfChanged reloads the pair when the files' stamp differs from the
// one of the last load or attempt; it says whether it tried. A pair that
// failed is not tried again until a file changes.
func (p *Pair) ReloadIfChanged() (bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stamp() == p.seen {
		return false, nil
	}
	return true, p.reloadLocked()
}

// stamp identifies the files' current contents (filestamp), symlinks
// followed; a file that cannot be read is left out.
func (p *Pair) stamp() string {
	var b []byte
	for _, f := range []string{p.certFile, p.keyFile} {
		if data, err := os.ReadFile(f); err == nil {
			b = filestamp.Append(b, f, data)
		}
	}
	return string(b)
}

// GetCertificate returns the pair in force, for tls.Config.GetCertificate.
func (p *Pair) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return p.cur.Load(), nil
}

// suites are TLS 1.2's ECDHE key exchanges with AEAD ciphers (1.3's
// suites are all AEAD and not configurable).
var suites = []uint16{
	tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
	tls.TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384, tls.TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
	tls.TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256, tls.TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
}

// ServerConfig returns a server configuration serving the pair: a clone
// of base (nil: an empty one, which is how the traffic listener uses it)
// with its own certificates dropped for GetCertificate, TLS 1.2 at least,
// and, unless base names its cipher suites, only ECDHE key exchange with
// AEAD ciphers for 1.2. What else base says (client certificates, their
// verification) stays.
func (p *Pair) ServerConfig(base *tls.Config) *tls.Config {
	c := &tls.Config{}
	if base != nil {
		c = base.Clone()
	}
	c.Certificates = nil // GetCertificate decides
	c.GetCertificate = p.GetCertificate
	c.MinVersion = max(c.MinVersion, tls.VersionTLS12)
	if len(c.CipherSuites) == 0 {
		c.CipherSuites = suites
	}
	return c
}

// Watch reloads each pair whose files changed, stamped every poll, and
// every pair when hup receives (hup may be nil), until ctx ends. The
// outcome of each reload is the pair's to log and count.
func Watch(ctx context.Context, poll time.Duration, hup <-chan os.Signal, pairs ...*Pair) {
	t := time.NewTicker(poll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
			for _, p := range pairs {
				p.Reload()
			}
		case <-t.C:
			for _, p := range pairs {
				p.ReloadIfChanged()
			}
		}
	}
}
