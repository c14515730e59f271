package testenv

import (
	"crypto/tls"
	"crypto/x509"
	"net"
	"strconv"
	"strings"
	"testing"
)

// Redis starts a standalone redis-server on a free loopback port (no
// persistence, its files in a temporary directory), with extra arguments
// appended, and returns it once it accepts connections; it is killed at
// cleanup.
func Redis(t testing.TB, extra ...string) *Proc {
	t.Helper()
	return redis(t, nil, extra...)
}

// RedisTLS is Redis speaking TLS alone (port 0, its port the TLS port)
// with the files of x, replicating over TLS when it is a replica.
func RedisTLS(t testing.TB, x *TLSFiles, extra ...string) *Proc {
	t.Helper()
	return redis(t, x, extra...)
}

func redis(t testing.TB, x *TLSFiles, extra ...string) *Proc {
	t.Helper()
	bin := LookBinary(t, "redis-server", "redis-server")
	var last error
	for try := 0; try < 3; try++ {
		port := FreePort(t)
		args := []string{"--port", strconv.Itoa(port)}
		if x != nil {
			args = append([]string{"--port", "0", "--tls-port", strconv.Itoa(port)}, x.args()...)
		}
		args = append(append(args, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
			"--daemonize", "no", "--dir", t.TempDir(), "--loglevel", "warning"), extra...)
		p := &Proc{Name: bin, Args: args, Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port))}
		if last = p.Start(); last == nil {
			t.Cleanup(p.Kill)
			return p
		}
	}
	t.Fatal(last)
	return nil
}

// TLSFiles are the certificate, key and CA files of a Redis, a replica or
// a sentinel that speaks TLS alone: it serves Cert, and presents it as a
// client to the master it replicates or watches, verifying that
// server's certificate with CA. Clients need no certificate
// (tls-auth-clients no) unless ClientAuth.
type TLSFiles struct {
	CA         *CA
	Cert, Key  string
	ClientAuth bool // tls-auth-clients yes: clients must present a certificate of CA
}

// NewTLSFiles issues, from a new CA, a certificate for 127.0.0.1 usable
// as a server's and a client's (a replica's and a sentinel's toward the
// master).
func NewTLSFiles(t testing.TB) *TLSFiles {
	t.Helper()
	ca := NewCA(t, "testenv Redis CA")
	cert, key := ca.Issue(t, "redis", []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}, nil, "127.0.0.1")
	return &TLSFiles{CA: ca, Cert: cert, Key: key}
}

// Config returns a client's TLS configuration trusting the CA alone.
func (x *TLSFiles) Config() *tls.Config {
	return &tls.Config{RootCAs: x.CA.Pool(), MinVersion: tls.VersionTLS12}
}

// conf are the configuration lines for x, as a configuration file has
// them.
func (x *TLSFiles) conf() []string {
	auth := "no"
	if x.ClientAuth {
		auth = "yes"
	}
	return []string{"tls-cert-file " + x.Cert, "tls-key-file " + x.Key, "tls-ca-cert-file " + x.CA.File,
		"tls-auth-clients " + auth, "tls-replication yes"}
}

// args are conf as redis-server's arguments.
func (x *TLSFiles) args() []string {
	var a []string
	for _, l := range x.conf() {
		k, v, _ := strings.Cut(l, " ")
		a = append(a, "--"+k, v)
	}
	return a
}

// cliArgs are redis-cli's arguments for a server with x.
func (x *TLSFiles) cliArgs() []string {
	if x == nil {
		return nil
	}
	a := []string{"--tls", "--cacert", x.CA.File}
	if x.ClientAuth {
		a = append(a, "--cert", x.Cert, "--key", x.Key)
	}
	return a
}
