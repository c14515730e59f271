// Package kafkaauth turns the commands' Kafka security flags into what
// package pipeline's configurations take: a TLS configuration and a SASL
// mechanism (kafka-go's).
package kafkaauth

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"strings"

	"github.com/segmentio/kafka-go/sasl"
	"github.com/segmentio/kafka-go/sasl/plain"
	"github.com/segmentio/kafka-go/sasl/scram"
)

// Flags are the security settings of a command's Kafka connections.
type Flags struct {
	TLS          bool   // talk TLS (to brokers whose certificate the system trusts, or CAFile's)
	CAFile       string // PEM CA that signs the brokers' certificates; implies TLS
	Mechanism    string // "" (none), "plain", "scram-sha-256" or "scram-sha-512"
	User         string
	PasswordFile string // read once; a password is not a command-line argument
}

// Build returns the TLS configuration (nil without TLS) and the SASL
// mechanism (nil without one) of f; every bad setting is named.
func (f Flags) Build() (*tls.Config, sasl.Mechanism, error) {
	var tc *tls.Config
	if f.TLS || f.CAFile != "" {
		tc = &tls.Config{MinVersion: tls.VersionTLS12}
		if f.CAFile != "" {
			pem, err := os.ReadFile(f.CAFile)
			if err != nil {
				return nil, nil, fmt.Errorf("kafka TLS CA: %w", err)
			}
			tc.RootCAs = x509.NewCertPool()
			if !tc.RootCAs.AppendCertsFromPEM(pem) {
				return nil, nil, fmt.Errorf("kafka TLS CA %s: no PEM certificate", f.CAFile)
			}
		}
	}
	if f.Mechanism == "" {
		if f.User != "" || f.PasswordFile != "" {
			return nil, nil, fmt.Errorf("kafka SASL: a user or password without a mechanism")
		}
		return tc, nil, nil
	}
	if f.User == "" || f.PasswordFile == "" {
		return nil, nil, fmt.Errorf("kafka SASL %s: needs a user and a password file", f.Mechanism)
	}
	b, err := os.ReadFile(f.PasswordFile)
	if err != nil {
		return nil, nil, fmt.Errorf("kafka SASL password: %w", err)
	}
	pass := strings.TrimSpace(string(b))
	switch f.Mechanism {
	case "plain":
		return tc, plain.Mechanism{Username: f.User, Password: pass}, nil
	case "scram-sha-256", "scram-sha-512":
		alg := scram.SHA256
		if f.Mechanism == "scram-sha-512" {
			alg = scram.SHA512
		}
		m, err := scram.Mechanism(alg, f.User, pass)
		if err != nil {
			return nil, nil, fmt.Errorf("kafka SASL %s: %w", f.Mechanism, err)
		}
		return tc, m, nil
	}
	return nil, nil, fmt.Errorf("kafka SASL mechanism %q: must be plain, scram-sha-256 or scram-sha-512", f.Mechanism)
}
