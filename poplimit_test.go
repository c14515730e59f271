package poplimit_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/poplimit/poplimit"
	"github.com/poplimit/poplimit/decision"
	"github.com/poplimit/poplimit/internal/testenv"
	"github.com/poplimit/poplimit/memcachestore"
	"github.com/poplimit/poplimit/middleware"
	"github.com/poplimit/poplimit/redisstore"
	"github.com/poplimit/poplimit/shardproxy"
	"github.com/poplimit/poplimit/store"
)

// overMemcached is the store of ExampleNew_memcached, over the memcached
// at addr.
func overMemcached(t *testing.T, addr string) store.Store {
	t.Helper()
	client, err := shardproxy.New(shardproxy.Config{Servers: []shardproxy.Server{{Addr: addr}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	store, err := memcachestore.New(client, nil)
	if err != nil {
		t.Fatal(err)
	}
	return store
}

// overRedis is a store over the Redis at addr.
func overRedis(t *testing.T, addr string) store.Store {
	t.Helper()
	store, err := redisstore.New(redisstore.Config{Addrs: []string{addr}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	return store
}

// embedded builds one process's limiter over store in front of a handler,
// as the examples do.
func embedded(t *testing.T, rulesYAML string, store store.Store) http.Handler {
	t.Helper()
	core, err := poplimit.New([]byte(rulesYAML), store, decision.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { core.Close(context.Background()) })
	mw, err := middleware.New(core, middleware.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "origin") }))
}

// Two embedded limiters counting in one memcached, or one Redis, share
// the limit: a client's requests through either count against it once.
func TestNewSharedThroughAStore(t *testing.T) {
	const rs = "rules: [{name: per-client, limit: 3, window: 1m, mode: sync}]"
	for name, store := range map[string]func(t *testing.T) (a, b store.Store){
		"memcached": func(t *testing.T) (a, b store.Store) {
			mc := testenv.Memcached(t)
			return overMemcached(t, mc.Addr), overMemcached(t, mc.Addr)
		},
		"redis": func(t *testing.T) (a, b store.Store) {
			r := testenv.Redis(t)
			return overRedis(t, r.Addr), overRedis(t, r.Addr)
		},
	} {
		t.Run(name, func(t *testing.T) {
			sa, sb := store(t)
			a, b := embedded(t, rs, sa), embedded(t, rs, sb)
			var codes []int
			for i := range 6 {
				h := a
				if i%2 == 1 {
					h = b
				}
				r := httptest.NewRequest("GET", "http://example.com/", nil)
				r.RemoteAddr = "192.0.2.1:1234"
				w := httptest.NewRecorder()
				h.ServeHTTP(w, r)
				codes = append(codes, w.Code)
			}
			if want := []int{200, 200, 200, 429, 429, 429}; !equal(codes, want) {
				t.Errorf("alternating between two processes: got %v, want %v", codes, want)
			}
		})
	}
}

// New reports a bad rules file naming the field.
func TestNewRefusesBadRules(t *testing.T) {
	_, err := poplimit.New([]byte("rules: [{name: x, limit: -1, window: 1m}]"), store.NewMemStore(nil), decision.Options{})
	if err == nil || !strings.Contains(err.Error(), "limit") {
		t.Errorf("got %v, want an error naming limit", err)
	}
}

func equal(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
