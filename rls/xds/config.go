package xds

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"sort"
	"strings"
	"time"
)

// Defaults of Config, used where a field is zero.
const (
	DefaultNodeID          = "default" // envoyproxy/ratelimit's CONFIG_GRPC_XDS_NODE_ID
	DefaultBackoffInitial  = 500 * time.Millisecond
	DefaultBackoffMax      = 30 * time.Second
	DefaultMaxMessageBytes = 16 << 20
	// RepeatNACKDelay is how long a response identical to one already
	// NACKed waits before it is NACKed again: a go-control-plane snapshot
	// cache answers a NACK by sending the same snapshot back at once, and
	// without a pause the two would loop as fast as the network goes.
	RepeatNACKDelay = 250 * time.Millisecond
)

// Config configures a Subscriber. The zero value of each field other than
// Server means the default written on it.
type Config struct {
	// Server is the management server, host:port (gRPC). Required.
	Server string
	// NodeID is the node id sent to the server, which keys its snapshots
	// by it. Default "default".
	NodeID string
	// NodeMetadata is sent as the node's metadata, each value a string.
	NodeMetadata map[string]string
	// ForceStart lets the edge serve before the first configuration
	// arrives (envoyproxy/ratelimit's FORCE_START_WITHOUT_INITIAL_CONFIG);
	// without it, start-up waits for one.
	ForceStart bool

	// TLS talks TLS to the server, verifying it with the system's CAs or
	// CAFile; CertFile and KeyFile are the client certificate, ServerName
	// the name the server's certificate must carry (default the host of
	// Server). Setting CAFile, CertFile or ServerName implies TLS.
	TLS               bool
	CAFile            string
	CertFile, KeyFile string
	ServerName        string

	BackoffInitial  time.Duration // default 500ms: the first wait after a stream fails
	BackoffMax      time.Duration // default 30s: waits double up to this (each jittered down by up to half)
	MaxMessageBytes int           // default 16 MiB: the largest response taken
}

// withDefaults returns c with every zero field set to its default.
func (c Config) withDefaults() Config {
	if c.NodeID == "" {
		c.NodeID = DefaultNodeID
	}
	if c.BackoffInitial == 0 {
		c.BackoffInitial = DefaultBackoffInitial
	}
	if c.BackoffMax == 0 {
		c.BackoffMax = max(DefaultBackoffMax, c.BackoffInitial)
	}
	if c.MaxMessageBytes == 0 {
		c.MaxMessageBytes = DefaultMaxMessageBytes
	}
	return c
}

// useTLS reports whether c asks for TLS.
func (c Config) useTLS() bool {
	return c.TLS || c.CAFile != "" || c.CertFile != "" || c.KeyFile != "" || c.ServerName != ""
}

// Validate returns every problem with c, each naming the field, joined;
// nil when New would accept c. It reads the TLS files.
func (c Config) Validate() error {
	_, err := c.tlsConfig()
	return err
}

// tlsConfig validates c and returns its TLS configuration (nil without
// TLS).
func (c Config) tlsConfig() (*tls.Config, error) {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if host, port, err := net.SplitHostPort(c.Server); err != nil || host == "" || port == "" {
		bad("Server: %q: want host:port of the management server", c.Server)
	}
	if c.BackoffInitial < 0 || c.BackoffInitial > time.Hour {
		bad("BackoffInitial: %v: want 0 (default) or up to 1h", c.BackoffInitial)
	}
	if c.BackoffMax < 0 || c.BackoffMax > time.Hour {
		bad("BackoffMax: %v: want 0 (default) or up to 1h", c.BackoffMax)
	} else if c.BackoffMax > 0 && c.BackoffMax < c.BackoffInitial {
		bad("BackoffMax: %v: less than BackoffInitial (%v)", c.BackoffMax, c.BackoffInitial)
	}
	if c.MaxMessageBytes < 0 || c.MaxMessageBytes > 1<<30 {
		bad("MaxMessageBytes: %d: want 0 (default) or up to 1 GiB", c.MaxMessageBytes)
	}
	if (c.CertFile == "") != (c.KeyFile == "") {
		bad("CertFile and KeyFile: %q and %q: want both or neither", c.CertFile, c.KeyFile)
	}
	var tc *tls.Config
	if len(errs) == 0 && c.useTLS() {
		tc = &tls.Config{MinVersion: tls.VersionTLS12, ServerName: c.ServerName}
		if c.CAFile != "" {
			pem, err := os.ReadFile(c.CAFile)
			pool := x509.NewCertPool()
			switch {
			case err != nil:
				bad("CAFile: %w", err)
			case !pool.AppendCertsFromPEM(pem):
				bad("CAFile: %s: no PEM certificate in it", c.CAFile)
			}
			tc.RootCAs = pool
		}
		if c.CertFile != "" {
			cert, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
			if err != nil {
				bad("CertFile and KeyFile: %w", err)
			}
			tc.Certificates = []tls.Certificate{cert}
		}
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("xds: config: %w", errors.Join(errs...))
	}
	return tc, nil
}

// ParseMetadata parses node metadata written as envoyproxy/ratelimit's
// CONFIG_GRPC_XDS_NODE_METADATA is: "key=value,key=value" (a value may
// hold '='; spaces around keys are trimmed). Unlike ratelimit, which
// skips an entry without '=', it refuses one, naming it.
func ParseMetadata(s string) (map[string]string, error) {
	m := map[string]string{}
	if strings.TrimSpace(s) == "" {
		return m, nil
	}
	for i, entry := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(entry, "=")
		k = strings.TrimSpace(k)
		if !ok || k == "" {
			return nil, fmt.Errorf("xds: node metadata entry %d %q: want key=value", i+1, entry)
		}
		m[k] = v
	}
	return m, nil
}

// FormatMetadata writes m as ParseMetadata reads it, keys sorted.
func FormatMetadata(m map[string]string) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(k + "=" + m[k])
	}
	return b.String()
}
