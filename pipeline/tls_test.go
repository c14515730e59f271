package pipeline_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/poplimit/poplimit/event"
	"github.com/poplimit/poplimit/internal/testenv"
	"github.com/poplimit/poplimit/pipeline"
	"github.com/segmentio/kafka-go/sasl/plain"
	"github.com/twmb/franz-go/pkg/kfake"
)

// serverTLS makes a self-signed certificate for 127.0.0.1 at test time and
// returns the server's TLS configuration and a client's trusting it.
func serverTLS(t *testing.T) (server, client *tls.Config) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "broker"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}, MinVersion: tls.VersionTLS12},
		&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
}

// TestTLSAndSASL: the producer and the consumer reach a broker that takes
// only TLS connections authenticated with SASL/PLAIN; a wrong password
// delivers nothing and is counted as failed.
func TestTLSAndSASL(t *testing.T) {
	srv, cli := serverTLS(t)
	_, addr := testenv.BrokerWith(t, 0, partitions, []string{"secure"},
		[]kfake.Opt{kfake.TLS(srv), kfake.EnableSASL(), kfake.Superuser("PLAIN", "edge", "s3cret")})

	pc := fastProducerConfig(addr, "secure")
	pc.TLS, pc.SASL = cli, plain.Mechanism{Username: "edge", Password: "s3cret"}
	p, reg := newProducer(t, pc)
	for i := 0; i < 50; i++ {
		e := event.Event{Time: time.Now().UnixNano(), KeyHash: uint64(i), Rule: []byte("r"), Cost: 1, Limit: 10, WindowMillis: 1000}
		p.Emit(&e)
	}
	closeProducer(t, p)
	if o := producerOutcomes(t, reg); o.delivered != 50 {
		t.Fatalf("over TLS with SASL: %+v, want 50 delivered", o)
	}

	cc := fastConsumerConfig(addr, "secure", "g")
	cc.TLS, cc.SASL = cli, plain.Mechanism{Username: "edge", Password: "s3cret"}
	c, err := pipeline.NewConsumer(cc, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var mu sync.Mutex
	got := 0
	go c.Run(ctx, func(b []event.Event) error {
		mu.Lock()
		got += len(b)
		if got >= 50 {
			cancel()
		}
		mu.Unlock()
		return nil
	})
	<-ctx.Done()
	c.Close()
	mu.Lock()
	if got != 50 {
		t.Errorf("consumed %d over TLS with SASL, want 50", got)
	}
	mu.Unlock()

	bad := fastProducerConfig(addr, "secure")
	bad.TLS, bad.SASL = cli, plain.Mechanism{Username: "edge", Password: "wrong"}
	bp, breg := newProducer(t, bad)
	e := event.Event{Time: time.Now().UnixNano(), Rule: []byte("r"), Cost: 1, Limit: 10, WindowMillis: 1000}
	bp.Emit(&e)
	cctx, ccancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer ccancel()
	bp.Close(cctx)
	if o := producerOutcomes(t, breg); o.delivered != 0 || o.failed+o.dropped != 1 {
		t.Errorf("with a wrong password: %+v, want nothing delivered and the event counted", o)
	}
}
