package fasthttpmw_test

import (
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/poplimit/poplimit/middleware"
	"github.com/poplimit/poplimit/middleware/fasthttpmw"
)

// The fasthttp wrapper settles a counting rule from the handler's
// response: successes give their unit back, failures keep it, and the
// origin's cost header gives the units.
func TestCounting(t *testing.T) {
	core := newCore(t, `rules:
- {name: failed, limit: 3, window: 1m, count: {status: [401]}}
`)
	wrap, err := fasthttpmw.New(core, middleware.Config{})
	if err != nil {
		t.Fatal(err)
	}
	status := 200
	h := wrap(func(ctx *fasthttp.RequestCtx) { ctx.SetStatusCode(status) })
	for i := range 20 {
		if s := serve(h, "192.0.2.1:1").Response.StatusCode(); s != 200 {
			t.Fatalf("success %d: %d, want 200", i, s)
		}
	}
	status = 401
	for i := range 3 {
		if s := serve(h, "192.0.2.1:1").Response.StatusCode(); s != 401 {
			t.Fatalf("failure %d: %d, want 401", i, s)
		}
	}
	status = 200
	if s := serve(h, "192.0.2.1:1").Response.StatusCode(); s != 429 {
		t.Errorf("after 3 failures: %d, want 429", s)
	}

	core = newCore(t, `rules:
- {name: by-cost, limit: 10, window: 1m, count: {cost_header: X-Rate-Cost}}
`)
	if wrap, err = fasthttpmw.New(core, middleware.Config{}); err != nil {
		t.Fatal(err)
	}
	cost := "9"
	h = wrap(func(ctx *fasthttp.RequestCtx) { ctx.Response.Header.Set("X-Rate-Cost", cost) })
	for i, want := range []int{200, 200, 429} { // 9 + 1 = 10, then full
		if i == 1 {
			cost = "1"
		}
		if s := serve(h, "192.0.2.2:1").Response.StatusCode(); s != want {
			t.Errorf("request %d: %d, want %d", i, s, want)
		}
	}
}
