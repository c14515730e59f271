package fasthttpmw_test

import (
	"context"
	"fmt"
	"log"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/poplimit/poplimit"
	"github.com/poplimit/poplimit/clientaddr"
	"github.com/poplimit/poplimit/decision"
	"github.com/poplimit/poplimit/middleware"
	"github.com/poplimit/poplimit/middleware/fasthttpmw"
	"github.com/poplimit/poplimit/rules"
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

// serve runs one request from peer (with the header lines hdr) through h.
func serve(h fasthttp.RequestHandler, peer string, hdr ...string) *fasthttp.RequestCtx {
	var ctx fasthttp.RequestCtx
	var req fasthttp.Request
	req.SetRequestURI("http://example.com/")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Add(hdr[i], hdr[i+1])
	}
	ctx.Init(&req, addr(peer), nil)
	h(&ctx)
	return &ctx
}

// The wrapper answers as the edge server does: the handler's answer with
// the quota fields, then 429; a trusted proxy's client counted apart.
func TestNew(t *testing.T) {
	core := newCore(t, "rules: [{name: per-client, limit: 1, window: 1m, mode: sync}]")
	var cfg middleware.Config
	cfg.TrustedProxies, _ = clientaddr.ParsePrefixes("10.0.0.0/8")
	wrap, err := fasthttpmw.New(core, cfg)
	if err != nil {
		t.Fatal(err)
	}
	h := wrap(func(ctx *fasthttp.RequestCtx) { ctx.SetBodyString("origin") })
	for i, want := range []int{200, 429} {
		ctx := serve(h, "192.0.2.1:1")
		if ctx.Response.StatusCode() != want || want == 200 && string(ctx.Response.Body()) != "origin" {
			t.Errorf("request %d: %d %q, want %d", i+1, ctx.Response.StatusCode(), ctx.Response.Body(), want)
		}
	}
	if ctx := serve(h, "10.0.0.1:1", "X-Forwarded-For", "198.51.100.7"); ctx.Response.StatusCode() != 200 {
		t.Errorf("another client through a trusted proxy: %d, want 200", ctx.Response.StatusCode())
	}
}

func TestNewRefusesBadInput(t *testing.T) {
	core := newCore(t, "rules: [{name: per-client, limit: 1, window: 1m}]")
	if _, err := fasthttpmw.New(nil, middleware.Config{}); err == nil {
		t.Error("nil core: got no error")
	}
	if _, err := fasthttpmw.New(core, middleware.Config{Forwarding: "via"}); err == nil || !strings.Contains(err.Error(), "Forwarding") {
		t.Errorf("bad Forwarding: got %v, want an error naming the field", err)
	}
}

// A core with one rule in front of a fasthttp handler.
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
	wrap, err := fasthttpmw.New(core, middleware.Config{})
	if err != nil {
		log.Fatal(err)
	}
	h := wrap(func(ctx *fasthttp.RequestCtx) { ctx.SetBodyString("hello") }) // fasthttp.ListenAndServe(":8080", h)

	ctx := serve(h, "192.0.2.1:1")
	fmt.Println(ctx.Response.StatusCode(), string(ctx.Response.Body()), header(ctx, "RateLimit-Policy"))
	// Output: 200 hello "per-client";q=100;w=60
}
