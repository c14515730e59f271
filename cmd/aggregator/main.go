// Command aggregator measures how accurate the edge tier's rate limiting
// really is. It consumes the decision events every edge streams to Kafka,
// as a member of a consumer group, judges each decision against the exact
// reference of its rule's own algorithm (package judge: per rule and key,
// in event-time order across edges, with a watermark and an allowed
// lateness), and publishes what it found: Prometheus metrics on /metrics
// (namespace poplimit, subsystems aggregator and, for its consumer,
// pipeline) and a JSON report on /report, which loadtest replay reads at
// its end (GET /report?flush=1 first judges what still waits for the
// watermark). /healthz answers 200 while it runs.
//
// With no -brokers it serves an embedded Kafka-protocol broker (franz-go's
// kfake) on a loopback address, default 127.0.0.1:9392, with the topic
// created (-partitions), so `go run ./cmd/aggregator` works alone and logs
// every default it took. The embedded broker keeps its log and offsets in
// memory unless -embedded-data-dir names a directory, and bounds both
// topics by time and bytes (-embedded-retention, -embedded-retention-bytes,
// -embedded-global-retention-bytes). With -kafka-sasl and
// -embedded-edge-users it requires SASL and ACLs of every client: the
// aggregator reads the decisions and writes the counts, the edges write the
// decisions and read the counts (deploy/KAFKA.md). With -brokers it joins
// that cluster, where the topic must exist.
//
// With -events-key-file it judges, and counts across PoPs, only the events
// of frames signed with that key (the edges' -events-key-file); every
// other message is dropped and counted in
// poplimit_pipeline_messages_refused_total{reason}, so a writer of the
// topic without the key changes no decision and no figure.
//
// On SIGTERM or SIGINT it stops consuming after the batch in hand, which
// is committed, judges every event still buffered, stops serving and, last,
// stops the embedded broker; a successor in the same group resumes from
// the committed offsets, so across a graceful stop every event is judged
// exactly once. A batch is committed once the judge has taken it, so a
// crash loses what waited for the watermark (about -lateness of events, at
// most -max-buffered) and may judge one uncommitted batch twice. A
// restarted aggregator lacks each key's earlier history: each key's first
// window after it is judged against partial history.
//
// Memory. -max-keys, -max-log-entries, -max-buffered, -dedup and
// -global-max-keys bound its state; it logs the bound at start, and unless
// GOMEMLIMIT is set it sets the Go runtime's soft memory limit to that
// bound plus an eighth, so that a flood of client-chosen keys fills the
// bounds (evicting and counting what does not fit) without garbage
// doubling the heap. Several aggregators in one group split the
// partitions, so each judges the keys of its own; producers found writing
// under one edge id at once are counted
// (poplimit_aggregator_shared_edge_id_producers_total) and logged.
//
// Its clock bounds the event times it trusts: an event stamped more than
// -lateness plus -max-clock-skew after it, or more than -max-event-age
// before it, is counted in
// poplimit_aggregator_invalid_events_total{reason="future"|"past"} and not
// judged, so one edge whose clock jumped cannot move the watermark. After
// -idle-flush without events it judges everything buffered, so a quiet
// stream (the end of a replay) is judged whole; events arriving later and
// older than what it judged are counted as late.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/poplimit/poplimit/aggregator"
	"github.com/poplimit/poplimit/internal/kafkaauth"
	"github.com/poplimit/poplimit/pipeline"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// parseFlags parses args into the aggregator's config and the log level,
// and returns the flags left at their defaults, for the log. Every flag's
// default is the Config's (aggregator.Config.WithDefaults).
func parseFlags(args []string, stderr io.Writer) (aggregator.Config, slog.Level, []any, error) {
	cfg := aggregator.Config{}.WithDefaults()
	fs := flag.NewFlagSet("aggregator", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&cfg.Listen, "listen", cfg.Listen, "address for /metrics, /report and /healthz")
	brokers := fs.String("brokers", "", "Kafka brokers host:port,... (default: serve an embedded broker)")
	fs.StringVar(&cfg.Embedded, "embedded-broker", cfg.Embedded, "loopback address of the embedded broker, without -brokers (port 0: any)")
	fs.StringVar(&cfg.EmbeddedDataDir, "embedded-data-dir", "", "directory where the embedded broker keeps its log and offsets (default: memory only)")
	fs.IntVar(&cfg.Partitions, "partitions", cfg.Partitions, "partitions of the topic the embedded broker creates")
	fs.DurationVar(&cfg.EmbeddedRetention, "embedded-retention", cfg.EmbeddedRetention, "the embedded broker drops messages of both topics older than this (retention.ms)")
	fs.Int64Var(&cfg.EmbeddedRetentionBytes, "embedded-retention-bytes", cfg.EmbeddedRetentionBytes, "bytes of decision events the embedded broker keeps, all partitions together (it holds up to 9/8 of it): the oldest are dropped")
	fs.Int64Var(&cfg.EmbeddedGlobalRetentionBytes, "embedded-global-retention-bytes", cfg.EmbeddedGlobalRetentionBytes, "bytes of the topic of the counts the embedded broker keeps (it holds up to 9/8 of it): the oldest are dropped")
	edgeUsers := fs.String("embedded-edge-users", "", `file of the principals edges authenticate as to the embedded broker, one "user:password" a line; with -kafka-sasl, the embedded broker requires SASL and ACLs (deploy/KAFKA.md); default: no authentication`)
	fs.StringVar(&cfg.Consumer.Topic, "topic", cfg.Consumer.Topic, "Kafka topic of decision events")
	fs.StringVar(&cfg.Consumer.GroupID, "group", cfg.Consumer.GroupID, "Kafka consumer group")
	fs.StringVar(&cfg.GlobalTopic, "global-topic", cfg.GlobalTopic, "Kafka topic where the counts of global rules' keys per PoP are published (one partition; the embedded broker creates it)")
	fs.DurationVar(&cfg.GlobalInterval, "global-interval", cfg.GlobalInterval, "how often the counts of global rules' keys are published (0: never)")
	fs.Float64Var(&cfg.GlobalMinShare, "global-min-share", cfg.GlobalMinShare, "a global rule's key is published while its units across PoPs reach this part of its limit")
	fs.IntVar(&cfg.GlobalMaxKeys, "global-max-keys", cfg.GlobalMaxKeys, "keys of global rules counted for the global topic at most (about 720 B each); past it new keys' events are not counted, and counted as dropped")
	fs.StringVar(&cfg.GlobalKeyFile, "global-key-file", "", "file of the secret (at least 32 bytes) the global topic's messages are signed with, shared with the edges (default: unsigned, with a warning; production needs it)")
	fs.StringVar(&cfg.GlobalPublisher, "global-publisher", "", "this aggregator's name in the global topic, distinct per aggregator (default: host name/-listen)")
	fs.DurationVar(&cfg.Judge.AllowedLateness, "lateness", cfg.Judge.AllowedLateness, "allowed lateness of events behind the latest event time")
	fs.DurationVar(&cfg.Judge.SettleLateness, "settle-lateness", cfg.Judge.SettleLateness, "how much longer than -lateness the events of rules that count by response wait: the edges' settle timeout (their admitted requests' events are sent when the response is known)")
	fs.DurationVar(&cfg.Judge.MaxClockSkew, "max-clock-skew", cfg.Judge.MaxClockSkew, "events more than -lateness plus this after the aggregator's clock are invalid (reason future), kept out of the watermark (0: off)")
	fs.DurationVar(&cfg.Judge.MaxEventAge, "max-event-age", cfg.Judge.MaxEventAge, "events older than this behind the aggregator's clock are invalid (reason past), not judged (0: off)")
	fs.DurationVar(&cfg.Judge.Resolution, "resolution", cfg.Judge.Resolution, "event times are floored to this step")
	fs.IntVar(&cfg.Judge.MaxKeys, "max-keys", cfg.Judge.MaxKeys, "keys with exact state at most")
	fs.IntVar(&cfg.Judge.MaxLogEntries, "max-log-entries", cfg.Judge.MaxLogEntries, "sliding-log entries at most, all keys (16 bytes each)")
	fs.IntVar(&cfg.Judge.MaxBuffered, "max-buffered", cfg.Judge.MaxBuffered, "events waiting for the watermark at most")
	fs.IntVar(&cfg.Judge.TopKeys, "top-keys", cfg.Judge.TopKeys, "keys listed per kind in /report")
	fs.IntVar(&cfg.Judge.Dedup, "dedup", cfg.Judge.Dedup, "latest single-event messages remembered to drop exact copies (a batch produced or consumed twice; framed events are deduplicated by their frames); 0: off")
	fs.DurationVar(&cfg.IdleFlush, "idle-flush", cfg.IdleFlush, "judge everything buffered after this long without events (0: never)")
	fs.DurationVar(&cfg.ShutdownTimeout, "shutdown-timeout", cfg.ShutdownTimeout, "time to stop serving on SIGTERM")
	fs.BoolVar(&cfg.Pprof, "pprof", false, "serve /debug/pprof/ on -listen (no authentication: keep -listen on loopback)")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	fs.Func("events-key-file", "file holding the key decision events must be signed with (at least 32 bytes, the edges' -events-key-file); unsigned or badly signed messages are dropped and counted; default: none, nothing checked", func(f string) (err error) {
		cfg.Consumer.Key, err = pipeline.ReadKeyFile(f)
		return err
	})
	var ka kafkaauth.Flags
	kafkaFlags(fs, &ka)
	if err := fs.Parse(args); err != nil {
		return aggregator.Config{}, 0, nil, err
	}
	var errs []error
	// The flags' 0 is never; the Config's zero is the default, its never
	// aggregator.Never.
	for _, d := range []struct {
		name string
		v    *time.Duration
	}{{"idle-flush", &cfg.IdleFlush}, {"global-interval", &cfg.GlobalInterval}} {
		switch {
		case *d.v == 0:
			*d.v = aggregator.Never
		case *d.v < 0:
			errs = append(errs, fmt.Errorf("aggregator: -%s %v: must not be negative (0: never)", d.name, *d.v))
		}
	}
	var err error
	if cfg.Consumer.TLS, cfg.Consumer.SASL, err = ka.Build(); err != nil {
		return aggregator.Config{}, 0, nil, fmt.Errorf("aggregator: %w", err)
	}
	switch {
	case *edgeUsers != "" && *brokers != "":
		return aggregator.Config{}, 0, nil, errors.New("aggregator: -embedded-edge-users with -brokers: the principals of a cluster are its own (deploy/KAFKA.md)")
	case *edgeUsers != "" && ka.Mechanism == "":
		return aggregator.Config{}, 0, nil, errors.New("aggregator: -embedded-edge-users needs -kafka-sasl (and the aggregator's own -kafka-user and -kafka-password-file)")
	}
	if cfg.EmbeddedSASL, err = aggregator.LoadEmbeddedSASL(ka.Mechanism, ka.User, ka.PasswordFile, *edgeUsers); err != nil {
		return aggregator.Config{}, 0, nil, err
	}
	if fs.NArg() > 0 {
		return aggregator.Config{}, 0, nil, fmt.Errorf("aggregator: unexpected arguments %q", fs.Args())
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return aggregator.Config{}, 0, nil, fmt.Errorf("aggregator: -log-level %q: %w", *logLevel, err)
	}
	for _, b := range strings.Split(*brokers, ",") {
		if b = strings.TrimSpace(b); b != "" {
			cfg.Brokers = append(cfg.Brokers, b)
		}
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var defaults []any
	fs.VisitAll(func(f *flag.Flag) {
		if !set[f.Name] {
			defaults = append(defaults, slog.String(f.Name, f.Value.String()))
		}
	})
	return cfg, level, defaults, errors.Join(append(errs, cfg.Validate())...)
}

// kafkaFlags defines the flags of the brokers' security.
func kafkaFlags(fs *flag.FlagSet, k *kafkaauth.Flags) {
	fs.BoolVar(&k.TLS, "kafka-tls", false, "talk TLS to the brokers (system CAs, or -kafka-tls-ca)")
	fs.StringVar(&k.CAFile, "kafka-tls-ca", "", "PEM CA of the brokers' certificates (implies -kafka-tls)")
	fs.StringVar(&k.Mechanism, "kafka-sasl", "", "SASL mechanism: plain, scram-sha-256 or scram-sha-512")
	fs.StringVar(&k.User, "kafka-user", "", "SASL user")
	fs.StringVar(&k.PasswordFile, "kafka-password-file", "", "file holding the SASL password")
}

// run starts the aggregator from args, serves until ctx ends or the
// consumer fails, then stops it (see the package doc for the order).
func run(ctx context.Context, args []string, stderr io.Writer) error {
	cfg, level, defaults, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	if len(defaults) > 0 {
		log.Info("aggregator: flags at their defaults", defaults...)
	}
	aggregator.SetMemoryLimit(cfg, log)
	a, err := aggregator.Start(ctx, cfg, log)
	if err != nil {
		return err
	}
	if cfg.Consumer.Key == nil {
		log.Warn("aggregator: decision events are not authenticated: any writer of the topic can forge decisions that change the global counts and the accuracy figures (pass -events-key-file; deploy/KAFKA.md)")
	}
	var failed error
	select {
	case <-ctx.Done():
		log.Info("aggregator: stopping: committing the batch in hand and judging what is buffered")
	case failed = <-a.Failed():
		log.Error("aggregator: consumer stopped", "err", failed)
	}
	return errors.Join(failed, a.Close())
}
