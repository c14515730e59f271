package aggregator

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/poplimit/poplimit/edge"
	"github.com/poplimit/poplimit/edge/edgetest"
	"github.com/poplimit/poplimit/internal/kafkaauth"
	"github.com/poplimit/poplimit/internal/testenv"
	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"
	"github.com/segmentio/kafka-go/sasl/plain"
	"github.com/segmentio/kafka-go/sasl/scram"
)

// principal is a SASL/SCRAM-SHA-256 login to the embedded broker.
func principal(t testing.TB, user, pass string) sasl.Mechanism {
	t.Helper()
	m, err := scram.Mechanism(scram.SHA256, user, pass)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// writeTo writes one message to topic as m (nil: no SASL) and returns the
// error, if any.
func writeTo(a *Aggregator, m sasl.Mechanism, topic string) error {
	tr := &kafka.Transport{SASL: m, DialTimeout: 2 * time.Second}
	defer tr.CloseIdleConnections()
	w := &kafka.Writer{Addr: kafka.TCP(a.Brokers()...), Topic: topic, Transport: tr, MaxAttempts: 1,
		BatchTimeout: time.Millisecond, RequiredAcks: kafka.RequireOne, WriteTimeout: 5 * time.Second, ReadTimeout: 5 * time.Second}
	defer w.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return w.WriteMessages(ctx, kafka.Message{Value: []byte("x")})
}

// fetchFrom reads partition 0 of topic from its start as m, and returns
// the error, if any.
func fetchFrom(a *Aggregator, m sasl.Mechanism, topic string) error {
	tr := &kafka.Transport{SASL: m, DialTimeout: 2 * time.Second}
	defer tr.CloseIdleConnections()
	cl := &kafka.Client{Addr: kafka.TCP(a.Brokers()...), Timeout: 5 * time.Second, Transport: tr}
	resp, err := cl.Fetch(context.Background(), &kafka.FetchRequest{Topic: topic, Partition: 0, Offset: 0, MaxBytes: 1 << 20, MaxWait: 10 * time.Millisecond})
	if err != nil {
		return err
	}
	return resp.Error
}

// groupOffsets asks for group's offsets of topic as m, and returns the
// error, if any.
func groupOffsets(a *Aggregator, m sasl.Mechanism, group, topic string) error {
	tr := &kafka.Transport{SASL: m, DialTimeout: 2 * time.Second}
	defer tr.CloseIdleConnections()
	cl := &kafka.Client{Addr: kafka.TCP(a.Brokers()...), Timeout: 5 * time.Second, Transport: tr}
	resp, err := cl.OffsetFetch(context.Background(), &kafka.OffsetFetchRequest{GroupID: group, Topics: map[string][]int{topic: {0}}})
	if err != nil {
		return err
	}
	if resp.Error != nil {
		return resp.Error
	}
	for _, ps := range resp.Topics {
		for _, p := range ps {
			if p.Error != nil {
				return p.Error
			}
		}
	}
	return nil
}

// TestEmbeddedBrokerSASL runs the aggregator with its embedded broker
// requiring SASL (SCRAM-SHA-256) and ACLs, and a real edge logging in as
// an edge principal: the aggregator consumes the edge's events and
// publishes the counts the edge's feed reads. Each principal can do its
// job and nothing else: an edge cannot write the counts, read the
// decisions or the aggregator's group; the aggregator cannot write the
// decisions or read the counts; no login, or a wrong password, reads or
// writes nothing.
func TestEmbeddedBrokerSASL(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	passFile, usersFile := filepath.Join(dir, "aggregator.pass"), filepath.Join(dir, "edges")
	if err := os.WriteFile(passFile, []byte("aggregator-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(usersFile, []byte("# the edges\nedge-a:secret-a\n\nedge-b:secret:b\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t)
	cfg.GlobalTopic, cfg.GlobalInterval = "global", 50*time.Millisecond
	cfg.IdleFlush = 200 * time.Millisecond
	ka := kafkaauth.Flags{Mechanism: "scram-sha-256", User: "aggregator", PasswordFile: passFile}
	var err error
	if _, cfg.Consumer.SASL, err = ka.Build(); err != nil {
		t.Fatal(err)
	}
	if cfg.EmbeddedSASL, err = LoadEmbeddedSASL(ka.Mechanism, ka.User, ka.PasswordFile, usersFile); err != nil {
		t.Fatal(err)
	}
	a := startAggregator(t, cfg)

	// Its job: the edge writes the decisions and reads the counts, the
	// aggregator reads the decisions in its group and writes the counts.
	var o edge.Options
	o.Brokers, o.Topic, o.GlobalTopic, o.Pop, o.EdgeID = a.Brokers(), topic, "global", "pop-a", 4
	o.KafkaSASL = principal(t, "edge-a", "secret-a")
	ed := edgetest.Start(t, "rules: [{name: g, limit: 100, window: 1m, scope: global}]", o)
	testenv.WaitFor(t, 30*time.Second, "the counts published by the aggregator and read by the edge", func() bool {
		return ed.Global.Fresh(time.Now().UnixNano())
	})
	for i := range 3 {
		resp, err := http.Get("http://" + ed.Addr() + "/")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d: got %d, want 200", i, resp.StatusCode)
		}
	}
	testenv.WaitFor(t, 30*time.Second, "the edge's events judged", func() bool { return getReport(t, a, false).Events >= 3 })
	// (The edge's feed turned fresh on the aggregator's heartbeats: its
	// publisher writes the counts. A publish may still time out under
	// load, so its error count is not asserted.)

	edgeA, edgeB := principal(t, "edge-a", "secret-a"), principal(t, "edge-b", "secret:b")
	agg := principal(t, "aggregator", "aggregator-secret")
	allowed := []struct {
		what string
		err  error
	}{
		{"edge-a writes the decisions", writeTo(a, edgeA, topic)},
		{"edge-b writes the decisions", writeTo(a, edgeB, topic)},
		{"edge-b reads the counts", fetchFrom(a, edgeB, "global")},
		{"the aggregator reads the decisions", fetchFrom(a, agg, topic)},
		{"the aggregator reads its group's offsets", groupOffsets(a, agg, cfg.Consumer.GroupID, topic)},
		{"the aggregator writes the counts", writeTo(a, agg, "global")},
	}
	for _, c := range allowed {
		if c.err != nil {
			t.Errorf("%s: got %v, want it allowed", c.what, c.err)
		}
	}
	denied := []struct {
		what, want string
		err        error
	}{
		{"edge-a writes the counts", "Topic Authorization Failed", writeTo(a, edgeA, "global")},
		{"edge-a reads the decisions", "Topic Authorization Failed", fetchFrom(a, edgeA, topic)},
		{"edge-a reads the aggregator's group", "Authorization Failed", groupOffsets(a, edgeA, cfg.Consumer.GroupID, topic)},
		{"the aggregator writes the decisions", "Topic Authorization Failed", writeTo(a, agg, topic)},
		{"the aggregator reads the counts", "Topic Authorization Failed", fetchFrom(a, agg, "global")},
		{"a wrong password writes the decisions", "", writeTo(a, principal(t, "edge-a", "guess"), topic)},
		{"no login writes the decisions", "", writeTo(a, nil, topic)},
		{"no login reads the counts", "", fetchFrom(a, nil, "global")},
	}
	for _, c := range denied {
		if c.err == nil || !strings.Contains(c.err.Error(), c.want) {
			t.Errorf("%s: got %v, want it refused (%q)", c.what, c.err, c.want)
			continue
		}
		t.Logf("%s: refused: %v", c.what, c.err)
	}
}

// TestEmbeddedSASLRestart restarts an aggregator whose embedded broker
// requires SASL and ACLs on the data directory of the first, with an
// edge's password changed: it gives the topics it kept their settings as
// its own administrator, which no client can log in as, and the
// principals and ACLs are the new flags', not the ones the first kept.
func TestEmbeddedSASLRestart(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	passFile, usersFile := filepath.Join(dir, "pass"), filepath.Join(dir, "edges")
	_ = os.WriteFile(passFile, []byte("aggregator-secret"), 0o600)
	_ = os.WriteFile(usersFile, []byte("edge-a:secret-a\n"), 0o600)
	cfg := testConfig(t)
	cfg.EmbeddedDataDir = filepath.Join(dir, "data")
	cfg.GlobalTopic, cfg.GlobalInterval = "global", time.Second
	ka := kafkaauth.Flags{Mechanism: "scram-sha-512", User: "aggregator", PasswordFile: passFile}
	var err error
	if _, cfg.Consumer.SASL, err = ka.Build(); err != nil {
		t.Fatal(err)
	}
	if cfg.EmbeddedSASL, err = LoadEmbeddedSASL(ka.Mechanism, ka.User, ka.PasswordFile, usersFile); err != nil {
		t.Fatal(err)
	}
	stopAggregator(t, startAggregator(t, cfg))
	_ = os.WriteFile(usersFile, []byte("edge-a:new-secret\n"), 0o600)
	if cfg.EmbeddedSASL, err = LoadEmbeddedSASL(ka.Mechanism, ka.User, ka.PasswordFile, usersFile); err != nil {
		t.Fatal(err)
	}
	cfg.EmbeddedRetentionBytes = 1 << 20
	a := startAggregator(t, cfg)
	old, _ := scram.Mechanism(scram.SHA512, "edge-a", "secret-a")
	m, _ := scram.Mechanism(scram.SHA512, "edge-a", "new-secret")
	if err := writeTo(a, m, topic); err != nil {
		t.Errorf("edge-a writes the decisions after the restart: got %v, want it allowed", err)
	}
	if err := writeTo(a, old, topic); err == nil {
		t.Error("edge-a's old password after the restart: got allowed, want refused")
	}
	if err := writeTo(a, m, "global"); err == nil || !strings.Contains(err.Error(), "Authorization") {
		t.Errorf("edge-a writes the counts after the restart: got %v, want refused", err)
	}
}

// TestEmbeddedSASLPlain: with -kafka-sasl plain the embedded broker takes
// PLAIN logins (kafka-go's sasl/plain), and refuses the aggregator's own
// principal on the edges' job.
func TestEmbeddedSASLPlain(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	passFile, usersFile := filepath.Join(dir, "pass"), filepath.Join(dir, "edges")
	_ = os.WriteFile(passFile, []byte("aggregator-secret"), 0o600)
	_ = os.WriteFile(usersFile, []byte("edge-a:secret-a\n"), 0o600)
	cfg := testConfig(t)
	ka := kafkaauth.Flags{Mechanism: "plain", User: "aggregator", PasswordFile: passFile}
	var err error
	if _, cfg.Consumer.SASL, err = ka.Build(); err != nil {
		t.Fatal(err)
	}
	if cfg.EmbeddedSASL, err = LoadEmbeddedSASL(ka.Mechanism, ka.User, ka.PasswordFile, usersFile); err != nil {
		t.Fatal(err)
	}
	a := startAggregator(t, cfg)
	if err := writeTo(a, plain.Mechanism{Username: "edge-a", Password: "secret-a"}, topic); err != nil {
		t.Errorf("edge-a writes the decisions: got %v, want it allowed", err)
	}
	if err := writeTo(a, cfg.Consumer.SASL, topic); err == nil || !strings.Contains(err.Error(), "Authorization") {
		t.Errorf("the aggregator writes the decisions: got %v, want it refused", err)
	}
	if err := fetchFrom(a, cfg.Consumer.SASL, topic); err != nil {
		t.Errorf("the aggregator reads the decisions: got %v, want it allowed", err)
	}
}
