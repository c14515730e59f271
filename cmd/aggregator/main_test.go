package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/poplimit/poplimit/aggregator"
	"github.com/poplimit/poplimit/internal/testenv"
	"github.com/poplimit/poplimit/judge"
)

// TestFlagDefaultsAreTheConfigs: the flags at their defaults are the
// package's zero Config with its defaults applied, so that the program and
// every Config built in code run the same aggregator.
func TestFlagDefaultsAreTheConfigs(t *testing.T) {
	cfg, _, _, err := parseFlags(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if want := (aggregator.Config{}).WithDefaults(); !reflect.DeepEqual(cfg, want) {
		t.Errorf("flags at their defaults:\n got %+v\nwant %+v", cfg, want)
	}
	// The flags' 0 is never, the Config's Never.
	cfg, _, _, err = parseFlags([]string{"-idle-flush", "0", "-global-interval", "0"}, io.Discard)
	if err != nil || cfg.IdleFlush != aggregator.Never || cfg.GlobalInterval != aggregator.Never {
		t.Errorf("-idle-flush 0 -global-interval 0: got %v, %v, %v; want Never, Never", cfg.IdleFlush, cfg.GlobalInterval, err)
	}
}

func TestParseFlags(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		wantErr string // "" for none
	}{
		{"defaults", nil, ""},
		{"external brokers", []string{"-brokers", "10.0.0.1:9092, 10.0.0.2:9092"}, ""},
		{"embedded off loopback", []string{"-embedded-broker", "0.0.0.0:9392"}, "127.0.0.1 only"},
		{"embedded without port", []string{"-embedded-broker", "127.0.0.1"}, "missing port"},
		{"no partitions", []string{"-partitions", "0"}, "-partitions 0"},
		{"partitions ignored with brokers", []string{"-brokers", "k:9092", "-partitions", "0"}, ""},
		{"negative idle flush", []string{"-idle-flush", "-1s"}, "-idle-flush"},
		{"bad judge config", []string{"-resolution", "0s", "-max-keys", "0"}, "Config.MaxKeys = 0"},
		{"negative clock skew", []string{"-max-clock-skew", "-1s"}, "Config.MaxClockSkew = -1s"},
		{"negative event age", []string{"-max-event-age", "-1h"}, "Config.MaxEventAge = -1h0m0s"},
		{"clock bounds off", []string{"-max-clock-skew", "0", "-max-event-age", "0"}, ""},
		{"bad log level", []string{"-log-level", "loud"}, "-log-level"},
		{"extra arguments", []string{"now"}, "unexpected arguments"},
		{"unknown flag", []string{"-nope"}, "flag provided but not defined"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, _, _, err := parseFlags(tt.args, io.Discard)
			switch {
			case tt.wantErr == "" && err != nil:
				t.Errorf("got error %v, want none", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Errorf("got error %v, want one containing %q", err, tt.wantErr)
			}
			if tt.name == "external brokers" {
				if got := strings.Join(cfg.Brokers, ","); got != "10.0.0.1:9092,10.0.0.2:9092" {
					t.Errorf("brokers: got %q, want the two given", got)
				}
			}
		})
	}
	cfg, _, defaults, err := parseFlags(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Embedded != "127.0.0.1:9392" || cfg.Consumer.Topic != "poplimit.decisions" || cfg.Judge.AllowedLateness != 2*time.Second {
		t.Errorf("defaults: got embedded %s, topic %s, lateness %v; want 127.0.0.1:9392, poplimit.decisions, 2s",
			cfg.Embedded, cfg.Consumer.Topic, cfg.Judge.AllowedLateness)
	}
	if len(defaults) < 10 {
		t.Errorf("defaults listed for the log: got %d, want every flag", len(defaults))
	}
}

// TestRun starts the command as main does, with its embedded broker, checks
// that it serves, and stops it by cancelling its context.
func TestRun(t *testing.T) {
	t.Parallel()
	listen := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	broker := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	var stderr testenv.LockedBuffer
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"-listen", listen, "-embedded-broker", broker, "-partitions", "2"}, &stderr)
	}()

	client := &http.Client{Timeout: 2 * time.Second}
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := client.Get("http://" + listen + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		select {
		case err := <-done:
			t.Fatalf("run returned %v before serving; log:\n%s", err, stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("/healthz not OK within 10s; log:\n%s", stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	resp, err := client.Get("http://" + listen + "/report")
	if err != nil {
		t.Fatal(err)
	}
	var r judge.Report
	err = json.NewDecoder(resp.Body).Decode(&r)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("/report: got status %d, decode error %v; want 200 and a report", resp.StatusCode, err)
	}
	if r.Events != 0 {
		t.Errorf("events before any edge: got %d, want 0", r.Events)
	}
	if resp, err := client.Get("http://" + listen + "/report?flush=maybe"); err != nil || resp.StatusCode != http.StatusBadRequest {
		t.Errorf("/report?flush=maybe: got %v %v, want 400", resp.StatusCode, err)
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("run: got %v, want nil", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("run did not return within 20s of its context's end")
	}
	log := stderr.String()
	for _, want := range []string{"flags at their defaults", "lateness=2s", "embedded Kafka broker listening",
		"brokers=" + broker, "aggregator: stopped"} {
		if !strings.Contains(log, want) {
			t.Errorf("log lacks %q; log:\n%s", want, log)
		}
	}
	if _, err := net.DialTimeout("tcp", broker, 200*time.Millisecond); err == nil {
		t.Error("the embedded broker still accepts connections after run returned")
	}
}

// TestEmbeddedSASLFlags: -kafka-sasl with the embedded broker needs the
// edges' principals, which belong to the embedded broker only; a bad line
// of their file is named.
func TestEmbeddedSASLFlags(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		f := filepath.Join(dir, name)
		if err := os.WriteFile(f, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return f
	}
	pass := write("pass", "secret\n")
	sasl := []string{"-kafka-sasl", "scram-sha-512", "-kafka-user", "agg", "-kafka-password-file", pass}
	cfg, _, _, err := parseFlags(append(sasl, "-embedded-edge-users", write("ok", "e1:p1\ne2:p2\n")), io.Discard)
	if err != nil || cfg.EmbeddedSASL == nil || len(cfg.EmbeddedSASL.EdgeUsers) != 2 || cfg.EmbeddedSASL.Method != "SCRAM-SHA-512" {
		t.Errorf("SASL with two edge users: got %+v, %v", cfg.EmbeddedSASL, err)
	}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"no edge users", sasl, "needs -embedded-edge-users"},
		{"edge users without SASL", []string{"-embedded-edge-users", write("e", "e1:p1\n")}, "needs -kafka-sasl"},
		{"edge users with brokers", append(sasl, "-brokers", "k:9092", "-embedded-edge-users", write("e2", "e1:p1\n")), "-embedded-edge-users with -brokers"},
		{"no password", append(sasl, "-embedded-edge-users", write("bad", "e1:p1\ne2\n")), "line 2: want \"user:password\""},
		{"the aggregator's user", append(sasl, "-embedded-edge-users", write("agg", "agg:x\n")), "the aggregator's own"},
		{"twice", append(sasl, "-embedded-edge-users", write("twice", "e1:a\ne1:b\n")), `"e1" listed twice`},
		{"empty", append(sasl, "-embedded-edge-users", write("empty", "# none\n")), "no user"},
		{"TLS", []string{"-kafka-tls"}, "-kafka-tls with the embedded broker"},
		{"negative retention", []string{"-embedded-retention-bytes", "-1"}, "must not be negative"},
	} {
		if _, _, _, err := parseFlags(tc.args, io.Discard); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want an error saying %q", tc.name, err, tc.want)
		}
	}
}

// TestEventsKeyFlag: -events-key-file sets the consumer's key from the
// file, and refuses, naming the flag and the reason, a key shorter than 32
// bytes or a file it cannot read.
func TestEventsKeyFlag(t *testing.T) {
	dir := t.TempDir()
	good, short := filepath.Join(dir, "good"), filepath.Join(dir, "short")
	if err := os.WriteFile(good, []byte(strings.Repeat("k", 40)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(short, []byte("0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, _, _, err := parseFlags([]string{"-events-key-file", good}, io.Discard)
	if err != nil || string(cfg.Consumer.Key) != strings.Repeat("k", 40) {
		t.Errorf("a 40-byte key: got key %q, error %v; want the key", cfg.Consumer.Key, err)
	}
	for _, tc := range []struct{ file, want string }{
		{short, "10 bytes: at least 32 required"},
		{filepath.Join(dir, "missing"), "no such file"},
	} {
		_, _, _, err := parseFlags([]string{"-events-key-file", tc.file}, io.Discard)
		if err == nil || !strings.Contains(err.Error(), "-events-key-file") || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("-events-key-file %s: got %v, want an error naming the flag and saying %q", tc.file, err, tc.want)
		}
	}
}
