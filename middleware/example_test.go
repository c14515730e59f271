package middleware_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"

	"github.com/poplimit/poplimit/decision"
	"github.com/poplimit/poplimit/middleware"
	"github.com/poplimit/poplimit/rules"
	"github.com/poplimit/poplimit/store"
)

// A core with one rule (100 requests a minute per client IP) and the
// in-memory store, in front of a net/http handler.
func ExampleNew() {
	rs, err := rules.ParseRules([]byte(`rules: [{name: per-client, limit: 100, window: 1m}]`))
	if err != nil {
		log.Fatal(err)
	}
	core, err := decision.New(rs, store.NewMemStore(nil), decision.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer core.Close(context.Background())
	mw, err := middleware.New(core, middleware.Config{})
	if err != nil {
		log.Fatal(err)
	}
	h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "hello") }))

	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest("GET", "http://example.com/", nil))
	fmt.Println(w.Code, w.Body, w.Header().Get("RateLimit-Policy"))
	// Output: 200 hello "per-client";q=100;w=60
}
