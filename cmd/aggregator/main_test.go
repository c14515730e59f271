package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/poplimit/poplimit/judge"
	"github.com/prometheus/client_golang/prometheus"
)

// syncBuffer is an io.Writer safe for the logger and the test at once.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// freePort returns a loopback port that was free a moment ago.
func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
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
	listen := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	broker := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	var stderr syncBuffer
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

// TestPprofFlag: /debug/pprof/ is served with -pprof and not without.
func TestPprofFlag(t *testing.T) {
	for _, on := range []bool{false, true} {
		args := []string{}
		if on {
			args = append(args, "-pprof")
		}
		cfg, _, _, err := parseFlags(args, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		a := &aggregator{cfg: cfg, reg: prometheus.NewRegistry()}
		rec := httptest.NewRecorder()
		a.handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/debug/pprof/", nil))
		want := http.StatusNotFound
		if on {
			want = http.StatusOK
		}
		if rec.Code != want {
			t.Errorf("-pprof %v: GET /debug/pprof/ answered %d, want %d", on, rec.Code, want)
		}
	}
}
