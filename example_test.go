package poplimit_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"

	"github.com/poplimit/poplimit"
	"github.com/poplimit/poplimit/decision"
	"github.com/poplimit/poplimit/memcachestore"
	"github.com/poplimit/poplimit/middleware"
	"github.com/poplimit/poplimit/shardproxy"
	"github.com/poplimit/poplimit/store"
)

// A limit of 2 requests a minute per client IP, counted in this process,
// in front of a net/http handler.
func ExampleNew() {
	hello := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "hello") })

	core, err := poplimit.New([]byte(`rules: [{name: per-client, limit: 2, window: 1m}]`), store.NewMemStore(nil), decision.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer core.Close(context.Background())
	mw, err := middleware.New(core, middleware.Config{})
	if err != nil {
		log.Fatal(err)
	}
	h := mw(hello) // http.ListenAndServe(":8080", h)

	for range 3 {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest("GET", "http://example.com/", nil))
		fmt.Println(w.Code, w.Header().Get("RateLimit-Policy"))
	}
	// Output:
	// 200 "per-client";q=2;w=60
	// 200 "per-client";q=2;w=60
	// 429 "per-client";q=2;w=60
}

// The same limit shared by every process counting in one memcached (or,
// with package redisstore, one Redis): each process builds its core over a
// store of its own to the same servers.
func ExampleNew_memcached() {
	client, err := shardproxy.New(shardproxy.Config{Servers: []shardproxy.Server{{Addr: "127.0.0.1:11211"}}}, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	store, err := memcachestore.New(client, nil)
	if err != nil {
		log.Fatal(err)
	}
	core, err := poplimit.New([]byte(`rules: [{name: per-client, limit: 100, window: 1m}]`), store, decision.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer core.Close(context.Background())
	mw, err := middleware.New(core, middleware.Config{})
	if err != nil {
		log.Fatal(err)
	}
	http.ListenAndServe(":8080", mw(http.NotFoundHandler()))
}
