package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"os"

	"github.com/poplimit/poplimit/edge"
)

// rlsTLSFlags serve the rate limit service over TLS.
type rlsTLSFlags struct{ cert, key, clientCA, clientSAN string }

// redisTLSFlags talk TLS to Redis beside -redis-tls-ca.
type redisTLSFlags struct {
	on, skipHostname bool
	cert, key        string
}

// envoyFlags registers the flags that do what envoyproxy/ratelimit's
// settings do, -envoy-env's among them (envoyenv.go).
func envoyFlags(fs *flag.FlagSet, o *edge.Options, ex *flagExtras) {
	fs.BoolVar(&ex.envoyEnv, "envoy-env", false, "read envoyproxy/ratelimit's environment variables (PORT, GRPC_PORT, RUNTIME_ROOT, REDIS_URL, ...) as it reads them; flags given win over them; a variable poplimit cannot honour ends start-up naming it")
	fs.StringVar(&ex.logFormat, "log-format", "text", `"text" or "json" (one JSON object a line)`)
	fs.StringVar(&o.RLSHTTPListen, "rls-http-listen", "", "with -rls-listen: address of envoyproxy/ratelimit's HTTP port, POST /json and /healthcheck; default off")
	fs.BoolVar(&o.RLS.ShadowMode, "rls-shadow-mode", false, "rate limit service: answer OK whatever the descriptors say, their statuses kept (envoyproxy/ratelimit's SHADOW_MODE)")
	fs.BoolVar(&o.RLS.QuotaMode, "rls-quota-mode", false, "rate limit service: every descriptor in quota mode, OVER_LIMIT only when all are (envoyproxy/ratelimit's QUOTA_MODE)")
	fs.StringVar(&o.RLS.LimitHeader, "rls-limit-header", "", "-rls-headers ratelimit: the limit's header (default RateLimit-Limit)")
	fs.StringVar(&o.RLS.RemainingHeader, "rls-remaining-header", "", "-rls-headers ratelimit: the remaining units' header (default RateLimit-Remaining)")
	fs.StringVar(&o.RLS.ResetHeader, "rls-reset-header", "", "-rls-headers ratelimit: the seconds-to-reset header (default RateLimit-Reset)")
	fs.DurationVar(&o.RLS.MaxConnectionAge, "rls-max-conn-age", 0, "rate limit service: close a client's connection (GOAWAY) this old, so clients spread over new servers; 0: never")
	fs.DurationVar(&o.RLS.MaxConnectionAgeGrace, "rls-max-conn-age-grace", 0, "rate limit service: force a connection closed this long after -rls-max-conn-age; 0: never")
	fs.StringVar(&ex.rlsTLS.cert, "rls-tls-cert", "", "PEM certificate of the rate limit service (with -rls-tls-key): gRPC over TLS 1.2+, reloaded on change")
	fs.StringVar(&ex.rlsTLS.key, "rls-tls-key", "", "PEM private key of -rls-tls-cert")
	fs.StringVar(&ex.rlsTLS.clientCA, "rls-tls-client-ca", "", "PEM CA file: the rate limit service requires client certificates it signed (mutual TLS); read at start")
	fs.StringVar(&ex.rlsTLS.clientSAN, "rls-tls-client-san", "", "with -rls-tls-client-ca: a client certificate must name this DNS name or IP address")
	fs.BoolVar(&ex.redisTLS.on, "redis-tls", false, "talk to Redis over TLS, verifying its certificate with the system's CAs (or -redis-tls-ca)")
	fs.StringVar(&ex.redisTLS.cert, "redis-tls-cert", "", "PEM client certificate presented to Redis (with -redis-tls-key; implies -redis-tls)")
	fs.StringVar(&ex.redisTLS.key, "redis-tls-key", "", "PEM private key of -redis-tls-cert")
	fs.BoolVar(&ex.redisTLS.skipHostname, "redis-tls-skip-hostname-verification", false, "verify Redis's certificate chain but not the name in it (implies -redis-tls)")
}

// build checks the flags' combinations and puts the TLS settings they name
// into o: the CA files and Redis's client pair read here, the rate limit
// service's pair by rls.New (which reloads it when its files change).
func (ex *flagExtras) build(o *edge.Options) error {
	switch ex.logFormat {
	case "text", "json":
	default:
		return fmt.Errorf("edge: -log-format %q: must be text or json", ex.logFormat)
	}
	if o.RLSHTTPListen != "" && o.RLSListen == "" {
		return errors.New("edge: -rls-http-listen needs -rls-listen: it serves the rate limit service's /json and /healthcheck")
	}
	t := ex.rlsTLS
	if (t.cert == "") != (t.key == "") {
		return errors.New("edge: -rls-tls-cert and -rls-tls-key go together")
	}
	if t.cert == "" && (t.clientCA != "" || t.clientSAN != "") {
		return errors.New("edge: -rls-tls-client-ca and -rls-tls-client-san need -rls-tls-cert and -rls-tls-key")
	}
	if t.clientSAN != "" && t.clientCA == "" {
		return errors.New("edge: -rls-tls-client-san needs -rls-tls-client-ca")
	}
	if t.cert != "" {
		// The pair is read by rls.New and reloaded when its files change;
		// the client CA is read here, once, as envoyproxy/ratelimit reads
		// GRPC_CLIENT_TLS_CACERT only at start.
		o.RLS.TLSCert, o.RLS.TLSKey = t.cert, t.key
		c := &tls.Config{MinVersion: tls.VersionTLS12}
		if t.clientCA != "" {
			pool, err := readCAPool(t.clientCA)
			if err != nil {
				return fmt.Errorf("edge: -rls-tls-client-ca: %w", err)
			}
			c.ClientCAs, c.ClientAuth = pool, tls.RequireAndVerifyClientCert
		}
		if san := t.clientSAN; san != "" {
			c.VerifyPeerCertificate = func(_ [][]byte, chains [][]*x509.Certificate) error {
				for _, ch := range chains {
					if len(ch) > 0 && ch[0].VerifyHostname(san) == nil {
						return nil
					}
				}
				return fmt.Errorf("client certificate does not name %s", san)
			}
		}
		o.RLS.TLS = c // the rest of the configuration: client certificates
	}
	r := ex.redisTLS
	if (r.cert == "") != (r.key == "") {
		return errors.New("edge: -redis-tls-cert and -redis-tls-key go together")
	}
	if r.on || r.cert != "" || r.skipHostname {
		if o.Redis.TLS == nil {
			o.Redis.TLS = &tls.Config{MinVersion: tls.VersionTLS12}
		}
		if r.cert != "" {
			pair, err := tls.LoadX509KeyPair(r.cert, r.key)
			if err != nil {
				return fmt.Errorf("edge: -redis-tls-cert, -redis-tls-key: %w", err)
			}
			o.Redis.TLS.Certificates = []tls.Certificate{pair}
		}
		if r.skipHostname {
			c := o.Redis.TLS
			roots := c.RootCAs
			c.InsecureSkipVerify = true // the chain is verified below, the name not
			c.VerifyPeerCertificate = func(raw [][]byte, _ [][]*x509.Certificate) error {
				if len(raw) == 0 {
					return errors.New("redis: no certificate")
				}
				certs := make([]*x509.Certificate, len(raw))
				for i, b := range raw {
					var err error
					if certs[i], err = x509.ParseCertificate(b); err != nil {
						return fmt.Errorf("redis: certificate: %w", err)
					}
				}
				opts := x509.VerifyOptions{Roots: roots, Intermediates: x509.NewCertPool()}
				for _, c := range certs[1:] {
					opts.Intermediates.AddCert(c)
				}
				_, err := certs[0].Verify(opts)
				return err
			}
		}
	}
	return nil
}

// readCAPool reads a PEM file of CA certificates.
func readCAPool(file string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("no certificate in %s", file)
	}
	return pool, nil
}
