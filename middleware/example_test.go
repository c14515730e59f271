package middleware_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/poplimit/poplimit/edge"
	"github.com/poplimit/poplimit/middleware"
	"github.com/valyala/fasthttp"
)

// An edge with the built-in rule (100 requests a minute per client IP) and
// the in-memory store, in front of a net/http handler.
func ExampleNetHTTP() {
	e, err := edge.Build(edge.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		panic(err)
	}
	defer e.Close(context.Background())
	hello := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "hello") })
	h := middleware.NetHTTP(e)(hello)

	r := httptest.NewRequest("GET", "http://example.com/", nil)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	fmt.Println(w.Code, w.Body, w.Header().Get("RateLimit-Policy"))
	// Output: 200 hello "default-per-client";q=100;w=60
}

// The same in front of a fasthttp handler.
func ExampleFastHTTP() {
	e, err := edge.Build(edge.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		panic(err)
	}
	defer e.Close(context.Background())
	h := middleware.FastHTTP(e, func(ctx *fasthttp.RequestCtx) { ctx.SetBodyString("hello") })

	var ctx fasthttp.RequestCtx
	var req fasthttp.Request
	req.SetRequestURI("http://example.com/")
	ctx.Init(&req, nil, nil)
	h(&ctx)
	var policy string
	for k, v := range ctx.Response.Header.All() {
		if strings.EqualFold(string(k), "RateLimit-Policy") {
			policy = string(v)
		}
	}
	fmt.Println(ctx.Response.StatusCode(), string(ctx.Response.Body()), policy)
	// Output: 200 hello "default-per-client";q=100;w=60
}
