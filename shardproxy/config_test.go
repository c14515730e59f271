package shardproxy

import (
	"strings"
	"testing"
	"time"
)

func TestConfigValidate(t *testing.T) {
	ok := []Server{{Addr: "127.0.0.1:11211"}}
	tests := []struct {
		name  string
		cfg   Config
		wants []string // substrings of the error; none means valid
	}{
		{"zero values are defaults", Config{Servers: ok}, nil},
		{"all set", Config{Servers: ok, Hash: HashMD5, Timeout: time.Second, BatchTimeout: 2 * time.Second,
			MaxConnsPerShard: 8, Parallelism: 2, FailureLimit: 1, RetryTimeout: time.Second}, nil},
		{"no servers", Config{}, []string{"Servers: empty"}},
		{"negatives", Config{Servers: ok, Timeout: -1, BatchTimeout: -2, MaxConnsPerShard: -3, Parallelism: -4, FailureLimit: -5, RetryTimeout: -6},
			[]string{"Timeout: -1ns", "BatchTimeout: -2ns", "MaxConnsPerShard: -3", "Parallelism: -4", "FailureLimit: -5", "RetryTimeout: -6ns"}},
		{"too large", Config{Servers: ok, Timeout: time.Hour, MaxConnsPerShard: 1 << 20, Parallelism: 1 << 20, FailureLimit: 1 << 20, RetryTimeout: 48 * time.Hour},
			[]string{"Timeout: 1h0m0s", "MaxConnsPerShard: 1048576", "Parallelism: 1048576", "FailureLimit: 1048576", "RetryTimeout: 48h0m0s"}},
		{"batch shorter than timeout", Config{Servers: ok, Timeout: time.Second, BatchTimeout: time.Millisecond},
			[]string{"BatchTimeout: 1ms: less than Timeout (1s)"}},
		{"batch shorter than default timeout", Config{Servers: ok, BatchTimeout: time.Millisecond},
			[]string{"BatchTimeout: 1ms: less than Timeout (100ms)"}},
		{"hash", Config{Servers: ok, Hash: "crc32"}, []string{`Hash: hash "crc32"`}},
		{"server", Config{Servers: []Server{{Addr: "x"}}}, []string{`Servers[0].Addr: "x"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if len(tt.wants) == 0 {
				if err != nil {
					t.Fatalf("got %v, want nil", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("got nil, want an error containing %q", tt.wants)
			}
			for _, w := range tt.wants {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("got %q, want it to contain %q", err, w)
				}
			}
			if _, nerr := New(tt.cfg, nil); nerr == nil {
				t.Error("New: got nil error for an invalid config")
			}
		})
	}
}

func TestConfigProtocol(t *testing.T) {
	ok := []Server{{Addr: "127.0.0.1:11211"}}
	for _, p := range []Protocol{"", ProtocolText, ProtocolMeta} {
		if err := (Config{Servers: ok, Protocol: p}).Validate(); err != nil {
			t.Errorf("Protocol %q: got %v, want nil", p, err)
		}
	}
	err := Config{Servers: ok, Protocol: "binary"}.Validate()
	if err == nil || !strings.Contains(err.Error(), `Protocol: "binary"`) {
		t.Errorf("Protocol binary: got %v, want an error naming the field and value", err)
	}
	if got := (Config{}).WithDefaults().Protocol; got != ProtocolText {
		t.Errorf("default Protocol: got %q, want %q", got, ProtocolText)
	}
}
