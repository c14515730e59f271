package middleware_test

import (
	"context"
	"io"
	"net/http"
	"net/netip"
	"strings"
	"testing"

	"github.com/poplimit/poplimit"
	"github.com/poplimit/poplimit/clientaddr"
	"github.com/poplimit/poplimit/decision"
	"github.com/poplimit/poplimit/middleware"
	"github.com/poplimit/poplimit/store"
)

func newCore(t testing.TB, yaml string) *decision.Core {
	t.Helper()
	c, err := poplimit.New([]byte(yaml), store.NewMemStore(nil), decision.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

// The middleware over a core of its own, no edge: the limit per client,
// a trusted proxy's clients told apart by the header Config names, an
// untrusted peer's header ignored.
func TestNewOverCore(t *testing.T) {
	core := newCore(t, "rules: [{name: per-client, limit: 1, window: 1m, mode: sync}]")
	cfg := middleware.Config{Forwarding: clientaddr.Forwarded}
	cfg.TrustedProxies, _ = clientaddr.ParsePrefixes("10.0.0.0/8")
	mw, err := middleware.New(core, cfg)
	if err != nil {
		t.Fatal(err)
	}
	h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "origin") }))
	steps := []struct {
		remote string
		hdr    []string
		want   int
	}{
		{"192.0.2.1:1", nil, 200},
		{"192.0.2.1:2", nil, 429},
		{"10.0.0.1:1", []string{"Forwarded", "for=198.51.100.7"}, 200},
		{"10.0.0.1:1", []string{"Forwarded", "for=198.51.100.8"}, 200},
		{"10.0.0.1:1", []string{"Forwarded", "for=198.51.100.7"}, 429},
		{"192.0.2.9:1", []string{"Forwarded", "for=198.51.100.9"}, 200},
		{"192.0.2.9:1", []string{"Forwarded", "for=198.51.100.10"}, 429}, // not trusted: keyed by its peer
	}
	for i, s := range steps {
		w := do(h, "GET", "http://example.com/", s.remote, s.hdr...)
		if w.Code != s.want {
			t.Errorf("step %d (%s %v): %d, want %d", i+1, s.remote, s.hdr, w.Code, s.want)
		}
		if s.want == 429 && (w.Header().Get("Retry-After") == "" || w.Header().Get("Content-Type") != "application/problem+json") {
			t.Errorf("step %d: refusal without Retry-After or problem body: %v", i+1, w.Header())
		}
	}
}

func TestNewRefusesBadInput(t *testing.T) {
	core := newCore(t, "rules: [{name: per-client, limit: 1, window: 1m}]")
	if _, err := middleware.New(nil, middleware.Config{}); err == nil {
		t.Error("nil core: got no error")
	}
	for field, cfg := range map[string]middleware.Config{
		"Forwarding":     {Forwarding: "via"},
		"TrustedProxies": {TrustedProxies: make([]netip.Prefix, 1)},
	} {
		if _, err := middleware.New(core, cfg); err == nil || !strings.Contains(err.Error(), "Config."+field) {
			t.Errorf("bad %s: got %v, want an error naming the field", field, err)
		}
	}
}
