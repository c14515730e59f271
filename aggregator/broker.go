package aggregator

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"
	"github.com/segmentio/kafka-go/sasl/scram"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
)

// minSegmentBytes is the smallest log segment of the embedded broker's
// topics: a segment is an eighth of a partition's retention bytes, so
// that retention, which drops whole segments, holds a partition to 9/8 of
// its bound at most.
const minSegmentBytes = 4 << 10

// EmbeddedSASL is the SASL set-up of the embedded broker, from the
// aggregator's own credentials (-kafka-sasl, -kafka-user,
// -kafka-password-file) and the edges' (-embedded-edge-users): see
// LoadEmbeddedSASL.
type EmbeddedSASL struct {
	Method    string // kfake's name: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512
	User      string // the aggregator's principal
	Password  string
	EdgeUsers map[string]string // the edges' principals and passwords
}

// kfakeMethod maps -kafka-sasl's names to kfake's.
var kfakeMethod = map[string]string{"plain": "PLAIN", "scram-sha-256": "SCRAM-SHA-256", "scram-sha-512": "SCRAM-SHA-512"}

// readEdgeUsers reads -embedded-edge-users: one principal an edge
// authenticates as per line, "user:password"; blank lines and lines
// starting with # are skipped. Every problem names the file and the line.
func readEdgeUsers(file, aggregatorUser string) (map[string]string, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("aggregator: -embedded-edge-users: %w", err)
	}
	users := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		user, pass, ok := strings.Cut(line, ":")
		bad := func(why string) error {
			return fmt.Errorf("aggregator: -embedded-edge-users %s line %d: %s", file, n, why)
		}
		switch {
		case !ok || user == "" || pass == "":
			return nil, bad(`want "user:password"`)
		case user == aggregatorUser:
			return nil, bad(fmt.Sprintf("user %q is the aggregator's own (-kafka-user): an edge needs a principal of its own", user))
		case users[user] != "":
			return nil, bad(fmt.Sprintf("user %q listed twice", user))
		}
		users[user] = pass
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("aggregator: -embedded-edge-users %s: %w", file, err)
	}
	if len(users) == 0 {
		return nil, fmt.Errorf("aggregator: -embedded-edge-users %s: no user", file)
	}
	return users, nil
}

// topicConfigs are the settings of a topic of partitions partitions that
// keeps bytes (all partitions together) for retention at most: Kafka's
// retention.bytes is per partition, and retention drops whole segments.
func topicConfigs(partitions int, bytes int64, retention time.Duration) map[string]string {
	per := max(bytes/int64(partitions), 1)
	return map[string]string{
		"cleanup.policy":  "delete",
		"retention.ms":    strconv.FormatInt(retention.Milliseconds(), 10),
		"retention.bytes": strconv.FormatInt(per, 10),
		"segment.bytes":   strconv.FormatInt(max(per/8, minSegmentBytes), 10),
	}
}

// startEmbedded starts the embedded broker of cfg, without -brokers: one
// broker on the loopback port of cfg.Embedded, the topics created with
// their retention (or, kept in cfg.EmbeddedDataDir from an earlier run,
// given it), and, with cfg.EmbeddedSASL, SASL and ACLs required of every
// client (embeddedACLs), created at every start from the flags.
func startEmbedded(ctx context.Context, cfg Config, log *slog.Logger) (*kfake.Cluster, error) {
	port, _ := embeddedPort(cfg.Embedded) // validated
	retention, decisionBytes, countBytes, check := cfg.EmbeddedRetention, cfg.EmbeddedRetentionBytes, cfg.EmbeddedGlobalRetentionBytes, cfg.EmbeddedRetentionCheck
	globalTopic := cfg.GlobalTopic
	opts := []kfake.Opt{kfake.NumBrokers(1), kfake.Ports(port),
		// How often retention runs: the bound holds to what arrives
		// in this long.
		kfake.BrokerConfigs(map[string]string{"log.cleaner.backoff.ms": strconv.FormatInt(check.Milliseconds(), 10)})}
	if cfg.EmbeddedDataDir != "" {
		// The principals and ACLs are the flags' at every start: kfake
		// would otherwise take those an earlier run kept over them.
		for _, f := range []string{"sasl.json", "acls.json"} {
			if err := os.Remove(filepath.Join(cfg.EmbeddedDataDir, f)); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return nil, fmt.Errorf("aggregator: -embedded-data-dir: %w", err)
			}
		}
		opts = append(opts, kfake.DataDir(cfg.EmbeddedDataDir))
	}
	var admin sasl.Mechanism
	if s := cfg.EmbeddedSASL; s != nil {
		// A superuser with a password drawn now, that never leaves the
		// process: the aggregator's own administration (topic settings
		// of a data directory's topics) and nothing else.
		pass := make([]byte, 32)
		_, _ = rand.Read(pass)
		adminUser, adminPass := "poplimit-embedded-admin", hex.EncodeToString(pass)
		m, err := scram.Mechanism(scram.SHA512, adminUser, adminPass)
		if err != nil {
			return nil, err
		}
		admin = m
		opts = append(opts, kfake.EnableSASL(), kfake.EnableACLs(), kfake.Superuser("SCRAM-SHA-512", adminUser, adminPass))
		opts = append(opts, kfake.User(s.Method, s.User, s.Password))
		for u, p := range s.EdgeUsers {
			opts = append(opts, kfake.User(s.Method, u, p))
		}
	}
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		return nil, fmt.Errorf("aggregator: embedded broker on %s: %w", cfg.Embedded, err)
	}
	topics := []struct {
		name       string
		partitions int
		configs    map[string]string
	}{{cfg.Consumer.Topic, cfg.Partitions, topicConfigs(cfg.Partitions, decisionBytes, retention)}}
	if cfg.GlobalInterval > 0 {
		topics = append(topics, struct {
			name       string
			partitions int
			configs    map[string]string
		}{globalTopic, 1, topicConfigs(1, countBytes, retention)})
	}
	for _, t := range topics {
		err := c.CreateTopic(t.name, int32(t.partitions), t.configs)
		if errors.Is(err, kerr.TopicAlreadyExists) { // kept in the data directory
			err = alterTopic(ctx, c.ListenAddrs(), admin, t.name, t.configs)
		}
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("aggregator: embedded broker: topic %s: %w", t.name, err)
		}
	}
	if cfg.EmbeddedSASL != nil {
		if err := createACLs(ctx, c.ListenAddrs(), admin, embeddedACLs(cfg, globalTopic)); err != nil {
			c.Close()
			return nil, fmt.Errorf("aggregator: embedded broker: ACLs: %w", err)
		}
	}
	log.Info("aggregator: embedded broker bounds", "retention", retention,
		"decision_bytes", decisionBytes, "count_bytes", countBytes, "sasl", cfg.EmbeddedSASL != nil)
	return c, nil
}

// alterTopic sets configs on a topic that exists, through the broker's
// API (kfake has no other way to change a topic's settings).
func alterTopic(ctx context.Context, addrs []string, admin sasl.Mechanism, topic string, configs map[string]string) error {
	cl, done := adminClient(addrs, admin)
	defer done()
	res := kafka.IncrementalAlterConfigsRequestResource{ResourceType: kafka.ResourceTypeTopic, ResourceName: topic}
	for k, v := range configs {
		res.Configs = append(res.Configs, kafka.IncrementalAlterConfigsRequestConfig{Name: k, Value: v, ConfigOperation: kafka.ConfigOperationSet})
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := cl.IncrementalAlterConfigs(ctx, &kafka.IncrementalAlterConfigsRequest{Resources: []kafka.IncrementalAlterConfigsRequestResource{res}})
	if err != nil {
		return err
	}
	for _, r := range resp.Resources {
		if r.Error != nil {
			return r.Error
		}
	}
	return nil
}

// grant is an ACL: principal may do op on the literal resource name.
type grant struct {
	principal string
	resource  kafka.ResourceType
	name      string
	op        kafka.ACLOperationType
}

// embeddedACLs are the ACLs of the embedded broker with SASL (deploy/KAFKA.md
// gives the same for a real cluster): the aggregator reads the decisions
// as a member of its group and writes the counts; each edge writes the
// decisions and reads the counts. Read and Write imply Describe.
func embeddedACLs(cfg Config, globalTopic string) []grant {
	s := cfg.EmbeddedSASL
	agg := "User:" + s.User
	gs := []grant{
		{agg, kafka.ResourceTypeTopic, cfg.Consumer.Topic, kafka.ACLOperationTypeRead},
		{agg, kafka.ResourceTypeGroup, cfg.Consumer.GroupID, kafka.ACLOperationTypeRead},
	}
	if cfg.GlobalInterval > 0 {
		gs = append(gs, grant{agg, kafka.ResourceTypeTopic, globalTopic, kafka.ACLOperationTypeWrite})
	}
	for _, u := range slices.Sorted(maps.Keys(s.EdgeUsers)) {
		gs = append(gs, grant{"User:" + u, kafka.ResourceTypeTopic, cfg.Consumer.Topic, kafka.ACLOperationTypeWrite})
		if cfg.GlobalInterval > 0 {
			gs = append(gs, grant{"User:" + u, kafka.ResourceTypeTopic, globalTopic, kafka.ACLOperationTypeRead})
		}
	}
	return gs
}

// adminClient is a client of the embedded broker logged in as admin (nil:
// no SASL).
func adminClient(addrs []string, admin sasl.Mechanism) (*kafka.Client, func()) {
	tr := &kafka.Transport{SASL: admin}
	return &kafka.Client{Addr: kafka.TCP(addrs...), Timeout: 10 * time.Second, Transport: tr}, tr.CloseIdleConnections
}

// createACLs creates gs through the broker's API, as its administrator.
func createACLs(ctx context.Context, addrs []string, admin sasl.Mechanism, gs []grant) error {
	cl, done := adminClient(addrs, admin)
	defer done()
	req := &kafka.CreateACLsRequest{}
	for _, g := range gs {
		req.ACLs = append(req.ACLs, kafka.ACLEntry{ResourceType: g.resource, ResourceName: g.name,
			ResourcePatternType: kafka.PatternTypeLiteral, Principal: g.principal, Host: "*",
			Operation: g.op, PermissionType: kafka.ACLPermissionTypeAllow})
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := cl.CreateACLs(ctx, req)
	if err != nil {
		return err
	}
	return errors.Join(resp.Errors...)
}

// LoadEmbeddedSASL returns the embedded broker's SASL set-up from the
// aggregator's SASL mechanism (-kafka-sasl: plain, scram-sha-256 or
// scram-sha-512), user and password file, and the file of the edges'
// principals (-embedded-edge-users; see readEdgeUsers), or nil without a
// mechanism or that file (Config.Validate names what is missing).
func LoadEmbeddedSASL(mechanism, user, passwordFile, edgeUsersFile string) (*EmbeddedSASL, error) {
	if mechanism == "" || edgeUsersFile == "" {
		return nil, nil // validate names what is missing
	}
	b, err := os.ReadFile(passwordFile)
	if err != nil {
		return nil, fmt.Errorf("aggregator: -kafka-password-file: %w", err)
	}
	s := &EmbeddedSASL{Method: kfakeMethod[mechanism], User: user, Password: strings.TrimSpace(string(b))}
	if s.EdgeUsers, err = readEdgeUsers(edgeUsersFile, user); err != nil {
		return nil, err
	}
	return s, nil
}
