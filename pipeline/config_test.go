package pipeline_test

import (
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/segmentio/kafka-go"

	"github.com/poplimit/poplimit/event"
	"github.com/poplimit/poplimit/pipeline"
)

func validProducerConfig() pipeline.ProducerConfig {
	c := pipeline.DefaultProducerConfig()
	c.Brokers = []string{"127.0.0.1:9092"}
	c.Topic = "events"
	return c
}

func validConsumerConfig() pipeline.ConsumerConfig {
	c := pipeline.DefaultConsumerConfig()
	c.Brokers = []string{"127.0.0.1:9092"}
	c.Topic = "events"
	c.GroupID = "aggregator"
	return c
}

func TestProducerConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		mod  func(*pipeline.ProducerConfig)
		want []string // substrings of the error, one per problem; none: valid
	}{
		{"defaults", func(*pipeline.ProducerConfig) {}, nil},
		{"sync, acks all, no compression", func(c *pipeline.ProducerConfig) {
			c.Async, c.RequiredAcks, c.Compression = false, kafka.RequireAll, 0
		}, nil},
		{"zero value", func(c *pipeline.ProducerConfig) { *c = pipeline.ProducerConfig{} }, []string{
			"Brokers = []", `Topic = ""`, "QueueSize = 0", "SampleRate = 0", "FrameEvents = 0", "FrameBytes = 0",
			"BatchSize = 0", "BatchBytes = 0",
			"BatchTimeout = 0s", "WriteTimeout = 0s", "MaxAttempts = 0", "WriteBackoffMin = 0s",
			"MaxWritesInFlight = 0", "DialTimeout = 0s", "MetadataTTL = 0s",
		}},
		{"bad broker", func(c *pipeline.ProducerConfig) { c.Brokers = []string{"ok:1", "nohost"} }, []string{`Brokers[1] = "nohost"`}},
		{"sample rate above 1", func(c *pipeline.ProducerConfig) { c.SampleRate = 1.5 }, []string{"SampleRate = 1.5"}},
		{"sample rate NaN", func(c *pipeline.ProducerConfig) { c.SampleRate = math.NaN() }, []string{"SampleRate = NaN"}},
		{"acks 2", func(c *pipeline.ProducerConfig) { c.RequiredAcks = 2 }, []string{"RequiredAcks = 2"}},
		{"codec 9", func(c *pipeline.ProducerConfig) { c.Compression = 9 }, []string{"Compression = 9"}},
		{"negative batch timeout", func(c *pipeline.ProducerConfig) { c.BatchTimeout = -1 }, []string{"BatchTimeout = -1ns"}},
		{"small batch bytes", func(c *pipeline.ProducerConfig) { c.BatchBytes = 100 }, []string{"BatchBytes = 100"}},
		{"backoff max below min", func(c *pipeline.ProducerConfig) { c.WriteBackoffMax = 1 }, []string{"WriteBackoffMax = 1ns"}},
		{"one event per frame", func(c *pipeline.ProducerConfig) {
			c.FrameEvents, c.FrameBytes = 1, pipeline.FrameHeaderLen+2+event.MaxLen
		}, nil},
		{"frame events over 65535", func(c *pipeline.ProducerConfig) { c.FrameEvents = 1 << 16 }, []string{"FrameEvents = 65536"}},
		{"frame bytes below one event", func(c *pipeline.ProducerConfig) { c.FrameBytes = 321 }, []string{"FrameBytes = 321"}},
		{"frame bytes over batch bytes", func(c *pipeline.ProducerConfig) { c.BatchBytes, c.FrameBytes = 4096, 4096 },
			[]string{"FrameBytes = 4096: must be at most BatchBytes-64 (4032)"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := validProducerConfig()
			tt.mod(&c)
			checkProblems(t, c.Validate(), tt.want)
			if tt.want != nil {
				if _, err := pipeline.NewProducer(c, nil); !errors.Is(err, pipeline.ErrConfig) {
					t.Errorf("NewProducer: got %v, want ErrConfig", err)
				}
			}
		})
	}
}

func TestConsumerConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		mod  func(*pipeline.ConsumerConfig)
		want []string
	}{
		{"defaults", func(*pipeline.ConsumerConfig) {}, nil},
		{"last offset", func(c *pipeline.ConsumerConfig) { c.StartOffset = kafka.LastOffset }, nil},
		{"zero value", func(c *pipeline.ConsumerConfig) { *c = pipeline.ConsumerConfig{} }, []string{
			"Brokers = []", `Topic = ""`, `GroupID = ""`, "MaxBatch = 0", "MaxBatchWait = 0s", "QueueCapacity = 0",
			"MinBytes = 0", "MaxBytes = 0", "MaxWait = 0s", "HeartbeatInterval = 0s", "SessionTimeout = 0s",
			"RebalanceTimeout = 0s", "JoinGroupBackoff = 0s", "ReadBackoffMin = 0s", "MaxAttempts = 0",
			"CommitTimeout = 0s", "StartOffset = 0", "DialTimeout = 0s",
		}},
		{"heartbeat not below session", func(c *pipeline.ConsumerConfig) { c.HeartbeatInterval = c.SessionTimeout }, []string{"HeartbeatInterval = 10s"}},
		{"max bytes below min bytes", func(c *pipeline.ConsumerConfig) { c.MinBytes = 1 << 30 }, []string{"MaxBytes = 10485760"}},
		{"offset 5", func(c *pipeline.ConsumerConfig) { c.StartOffset = 5 }, []string{"StartOffset = 5"}},
		{"no frame dedup", func(c *pipeline.ConsumerConfig) { c.DedupFrames = 0 }, nil},
		{"negative frame dedup", func(c *pipeline.ConsumerConfig) { c.DedupFrames = -1 }, []string{"DedupFrames = -1"}},
		{"frame dedup over 2^24", func(c *pipeline.ConsumerConfig) { c.DedupFrames = 1<<24 + 1 }, []string{"DedupFrames = 16777217"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := validConsumerConfig()
			tt.mod(&c)
			checkProblems(t, c.Validate(), tt.want)
			if tt.want != nil {
				if _, err := pipeline.NewConsumer(c, nil); !errors.Is(err, pipeline.ErrConfig) {
					t.Errorf("NewConsumer: got %v, want ErrConfig", err)
				}
			}
		})
	}
}

// checkProblems checks that err reports exactly the problems in want.
func checkProblems(t *testing.T, err error, want []string) {
	t.Helper()
	if len(want) == 0 {
		if err != nil {
			t.Errorf("Validate: got %v, want nil", err)
		}
		return
	}
	if !errors.Is(err, pipeline.ErrConfig) {
		t.Fatalf("Validate: got %v, want an error wrapping ErrConfig", err)
	}
	lines := strings.Split(err.Error(), "\n")
	if len(lines) != len(want) {
		t.Errorf("Validate: got %d problems, want %d:\n%v", len(lines), len(want), err)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("Validate: got %v, want a problem mentioning %q", err, w)
		}
	}
}
