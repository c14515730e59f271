package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"

	"github.com/poplimit/poplimit/internal/testenv"
)

// k8sSecretDir lays out a certificate and key as a Kubernetes secret volume
// does: dir/tls.crt and dir/tls.key link to ..data/, and ..data links to a
// version directory; a new version is swapped in by renaming a new ..data
// link over the old one, both files at once.
type k8sSecretDir struct {
	dir string
	n   int
}

func (d *k8sSecretDir) swap(t *testing.T, certFile, keyFile string) {
	t.Helper()
	d.n++
	v := "..v" + strconv.Itoa(d.n)
	if err := os.Mkdir(filepath.Join(d.dir, v), 0o700); err != nil {
		t.Fatal(err)
	}
	for from, to := range map[string]string{certFile: "tls.crt", keyFile: "tls.key"} {
		b, err := os.ReadFile(from)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d.dir, v, to), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	tmp := filepath.Join(d.dir, "..data_tmp")
	if err := os.Symlink(v, tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(d.dir, "..data")); err != nil {
		t.Fatal(err)
	}
	if d.n == 1 {
		for _, f := range []string{"tls.crt", "tls.key"} {
			if err := os.Symlink(filepath.Join("..data", f), filepath.Join(d.dir, f)); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// adminMetric reads one sample of the edge's /metrics.
func adminMetric(t *testing.T, admin, sample string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), sample+" "); ok {
			f, _ := strconv.ParseFloat(v, 64)
			return f
		}
	}
	io.Copy(io.Discard, resp.Body)
	return -1
}

// The rate limit service's certificate (-rls-tls-cert, -rls-tls-key, as
// GRPC_SERVER_TLS_CERT and _KEY set them) is reloaded when its files
// change, here swapped as a Kubernetes secret volume swaps them: new
// connections get the new certificate, a connection made before keeps
// working, and a pair that does not load keeps the running one and is
// counted.
func TestRLSTLSReload(t *testing.T) {
	ca := testenv.NewCA(t, "cmd/edge test CA")
	certA, keyA := ca.Issue(t, "rls-a", nil, nil, "127.0.0.1")
	certB, keyB := ca.Issue(t, "rls-b", nil, nil, "127.0.0.1")
	certC, _ := ca.Issue(t, "rls-c", nil, nil, "127.0.0.1")
	secret := &k8sSecretDir{dir: t.TempDir()}
	secret.swap(t, certA, keyA)
	rules := filepath.Join(t.TempDir(), "rls.yaml")
	if err := os.WriteFile(rules, []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1000}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	rlsAddr := "127.0.0.1:" + strconv.Itoa(testenv.FreePort(t))
	admin := "127.0.0.1:" + strconv.Itoa(testenv.FreePort(t))
	e := startRun(t, "", "-rules", rules, "-rls-listen", rlsAddr, "-admin", admin,
		"-rls-tls-cert", filepath.Join(secret.dir, "tls.crt"), "-rls-tls-key", filepath.Join(secret.dir, "tls.key"))

	pool := ca.Pool()
	creds := grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}))
	dial := func() *grpc.ClientConn {
		conn, err := grpc.NewClient(rlsAddr, creds)
		if err != nil {
			t.Fatal(err)
		}
		return conn
	}
	// served asks once on conn and returns the name of the certificate
	// its connection was handshaken with ("" when the call failed).
	served := func(conn *grpc.ClientConn) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		var p peer.Peer
		_, err := rlspb.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, request("d", 1, []string{"k", "v"}), grpc.Peer(&p))
		if err != nil {
			return "", err
		}
		info, ok := p.AuthInfo.(credentials.TLSInfo)
		if !ok || len(info.State.PeerCertificates) == 0 {
			return "", nil
		}
		return info.State.PeerCertificates[0].Subject.CommonName, nil
	}
	servedNew := func() string {
		conn := dial()
		defer conn.Close()
		name, _ := served(conn)
		return name
	}

	old := dial()
	defer old.Close()
	if name, err := served(old); err != nil || name != "rls-a" {
		t.Fatalf("before any change: certificate %q, %v; want rls-a\n%s", name, err, e.out.String())
	}
	// The edge polls the files every 2 s (edge.Options.ReloadPoll).
	secret.swap(t, certB, keyB)
	testenv.WaitFor(t, 20*time.Second, "rls-b served to a new connection", func() bool { return servedNew() == "rls-b" })
	if name, err := served(old); err != nil || name != "rls-a" {
		t.Errorf("the connection made before the change: certificate %q, %v; want it answering, still rls-a", name, err)
	}
	const rejected = `poplimit_rls_tls_reloads_total{result="rejected"}`
	before := adminMetric(t, admin, rejected)
	if before < 0 {
		t.Fatalf("no %s in /metrics", rejected)
	}
	secret.swap(t, certC, keyB) // rls-c's certificate, rls-b's key: no pair
	testenv.WaitFor(t, 20*time.Second, "the broken pair counted", func() bool { return adminMetric(t, admin, rejected) > before })
	if name := servedNew(); name != "rls-b" {
		t.Errorf("after a pair that does not load: certificate %q, want the running rls-b", name)
	}
	if !strings.Contains(e.out.String(), "rls: TLS reload rejected") {
		t.Errorf("the rejected pair not logged:\n%s", e.out.String())
	}
	if name, err := served(old); err != nil || name != "rls-a" {
		t.Errorf("the first connection at the end: certificate %q, %v; want it answering, still rls-a", name, err)
	}
}
